// Login state for the app page (docs/security.md): shows "Log out" when the server has a
// password, logs out, and sends the page to the login page once its session is gone (checked
// at load and whenever the tab becomes visible again).

const button = document.getElementById("logout-btn");

function toLogin() {
  const here = location.pathname + location.search;
  location.assign(here === "/" ? "/login" : `/login?next=${encodeURIComponent(here)}`);
}

async function checkStatus() {
  let status;
  try {
    const response = await fetch("/api/auth/status", { cache: "no-store" });
    if (!response.ok) return;
    status = await response.json();
  } catch {
    return; // offline: the app shows its own connection state
  }
  if (button) button.hidden = !status.password_required;
  if (status.password_required && !status.authenticated) toLogin();
}

async function logOut() {
  if (button) button.disabled = true;
  try {
    await fetch("/api/auth/logout", { method: "POST" });
  } catch {
    // the cookie is HttpOnly, so the server must clear it; go to the login page regardless
  }
  location.assign("/login");
}

if (button) button.addEventListener("click", logOut);
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") checkStatus();
});
checkStatus();
