// Login state for the app page (docs/security.md): shows "Log out" when the server has a
// password, logs out, and sends the page to the login page once its session is gone (checked
// at load, whenever the tab becomes visible again, and whenever one of its event streams
// breaks). Logging out takes this person's drafts out of the browser (drafts.js).
import { forgetDrafts } from "./drafts.js";

const button = document.getElementById("logout-btn");
const FORGET_MS = 2000; // Log out waits this long at most for the drafts' files to go

// Set once the page is on its way to the login page (Log out, or a sign-in found gone): a
// logout ends this person's streams first, and the recheck a broken stream asks for must not
// start a second navigation that aborts the first.
let leaving = false;

function toLogin() {
  if (leaving) return;
  leaving = true;
  const here = location.pathname + location.search;
  location.assign(here === "/" ? "/login" : `/login?next=${encodeURIComponent(here)}`);
}

let username = null; // who is signed in, as the server last said

// This page's own request for a new cookie (a password change), while it is in flight: the
// server ends the old cookie's streams before the answer that brings the new one arrives,
// and a check made meanwhile would carry the old cookie and find the sign-in gone.
let renewal = Promise.resolve();

const RENEWAL_WAIT_MS = 15000; // a request that never answers holds the checks no longer

/** Checks of the sign-in wait for `request`, which answers with this browser's new cookie. */
export function renewingSignIn(request) {
  const settled = Promise.race([
    request.then(
      () => {},
      () => {},
    ),
    new Promise((go) => setTimeout(go, RENEWAL_WAIT_MS)),
  ]);
  renewal = Promise.all([renewal, settled]);
  return request;
}

/** `GET /api/auth/status`, or null when it could not be asked. */
async function checkStatus() {
  await renewal;
  let status;
  try {
    const response = await fetch("/api/auth/status", { cache: "no-store" });
    if (!response.ok) return null;
    status = await response.json();
  } catch {
    return null; // offline: the app shows its own connection state
  }
  username = status.username;
  if (button) button.hidden = !status.password_required;
  if (status.password_required && !status.authenticated) toLogin();
  return status;
}

async function logOut() {
  if (leaving) return;
  leaving = true;
  if (button) button.disabled = true;
  await Promise.race([forgetDrafts(username), new Promise((go) => setTimeout(go, FORGET_MS))]);
  try {
    await fetch("/api/auth/logout", { method: "POST" });
  } catch {
    // the cookie is HttpOnly, so the server must clear it; go to the login page regardless
  }
  location.assign("/login");
}

/** An event stream of the page broke: a logout in another tab or on another device, or the
 *  person's removal, ends the streams first, and a stream refused for it would otherwise be
 *  retried for ever under "The server is unreachable". */
export function recheckSignIn() {
  if (!leaving) checkStatus();
}

if (button) button.addEventListener("click", logOut);
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") checkStatus();
});
/** The status the page was loaded with (null when it could not be asked). */
export const authStatus = checkStatus();
