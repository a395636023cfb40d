// The login page (docs/security.md): posts the password (with the user name under
// `--auth accounts`, docs/api.md §15) to /api/auth/login and, once the session cookie is
// set, goes to `next` when it is a same-origin relative path, else to `/`.

const $ = (id) => document.getElementById(id);

const saved = localStorage.getItem("tether-theme");
const dark = saved ? saved === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
document.documentElement.dataset.theme = dark ? "dark" : "light";

function nextPath() {
  const next = new URLSearchParams(location.search).get("next");
  if (!next?.startsWith("/") || next.startsWith("//") || next.includes("\\")) return "/";
  try {
    const url = new URL(next, location.origin);
    return url.origin === location.origin ? url.pathname + url.search + url.hash : "/";
  } catch {
    return "/";
  }
}

function showError(text) {
  const box = $("login-error");
  box.textContent = text;
  box.hidden = !text;
}

let accounts = false;

async function learnMode() {
  try {
    const response = await fetch("/api/auth/status", { cache: "no-store" });
    accounts = (await response.json()).mode === "accounts";
  } catch {
    accounts = false;
  }
  $("username-field").hidden = !accounts;
  if (accounts) $("username").focus();
}

async function logIn(event) {
  event.preventDefault();
  const input = $("password");
  const name = $("username");
  const button = $("login-submit");
  if (accounts && !name.value.trim()) {
    showError("Enter your user name.");
    name.focus();
    return;
  }
  if (!input.value) {
    showError("Enter the password.");
    input.focus();
    return;
  }
  button.disabled = true;
  showError("");
  try {
    const response = await fetch("/api/auth/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(
        accounts
          ? { username: name.value.trim(), password: input.value }
          : { password: input.value },
      ),
    });
    if (response.ok) {
      location.replace(nextPath());
      return;
    }
    let body = {};
    try {
      body = await response.json();
    } catch {
      body = {};
    }
    if (body.code === "bad_credentials") {
      showError(
        accounts ? "Wrong user name or password. Try again." : "Wrong password. Try again.",
      );
    } else if (body.code === "rate_limited") {
      showError(`Too many attempts. Try again in ${body.retry_after} seconds.`);
    } else {
      showError(body.message || `Login failed (${response.status}).`);
    }
  } catch {
    showError("Tether is not reachable right now.");
  }
  button.disabled = false;
  input.select();
  input.focus();
}

$("login-form").addEventListener("submit", logIn);
learnMode();
