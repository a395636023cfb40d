// Change password (docs/api.md §15, "My password"): under `--auth accounts` the sidebar
// footer's Password button opens a dialog asking for the current password and the new one
// twice. The server checks both; its refusal (a wrong current password, a short new one,
// too many failures) is shown in the dialog, and what was typed stays for another try.
// Success ends the person's other sign-ins; this browser gets a new cookie with the answer,
// which the page's sign-in checks wait for (its own streams end before it arrives).
import { post } from "./api.js";
import { authStatus, renewingSignIn } from "./session_auth.js";

const $ = (id) => document.getElementById(id);
const dialog = $("password-dialog");
const form = $("password-form");
const error = $("password-error");
const done = $("password-done");

function say(message) {
  error.textContent = message;
  error.hidden = !message;
}

function open(username) {
  form.reset();
  $("password-username").value = username ?? ""; // for password managers
  say("");
  done.hidden = true;
  dialog.showModal();
  $("password-current").focus();
}

async function submit(event) {
  event.preventDefault();
  done.hidden = true;
  const fresh = $("password-new").value;
  if (fresh !== $("password-repeat").value) {
    say("The two new passwords differ.");
    $("password-repeat").focus();
    return;
  }
  const button = $("password-submit");
  button.disabled = true;
  try {
    await renewingSignIn(
      post("/api/me/password", {
        current_password: $("password-current").value,
        new_password: fresh,
      }),
    );
  } catch (err) {
    say(err.message);
    $(err.code === "wrong_password" ? "password-current" : "password-new").focus();
    return;
  } finally {
    button.disabled = false;
  }
  form.reset();
  say("");
  done.hidden = false;
  $("password-close").focus();
}

authStatus.then((status) => {
  if (status?.mode !== "accounts" || !status.authenticated) return;
  const button = $("password-btn");
  button.hidden = false;
  button.addEventListener("click", () => open(status.username));
});
form.addEventListener("submit", submit);
$("password-close").addEventListener("click", () => dialog.close());
