// The settings panel (docs/page.md): the server's defaults for sessions without their own
// (`GET/PATCH /api/settings`: the default model and system prompt, shared by every browser
// and kept across restarts) and this browser's own preferences (theme, view mode, send key,
// in localStorage). One dialog with labelled controls; Save applies, Cancel or Esc changes
// nothing.
import { get, patch } from "./api.js";
import { unlistedLabel } from "./names.js";

const $ = (id) => document.getElementById(id);
export const SEND_KEY = "tether-send-key"; // "enter" (default) | "mod-enter"
const THEME_KEY = "tether-theme"; // "light" | "dark"; absent: the system's
const HINTS = {
  enter: "Enter sends · Shift+Enter for a new line",
  "mod-enter": "Ctrl+Enter sends · Enter for a new line",
};

export function sendKey() {
  return localStorage.getItem(SEND_KEY) === "mod-enter" ? "mod-enter" : "enter";
}

const systemDark = matchMedia("(prefers-color-scheme: dark)");

/** The theme this browser chose (here, with ◐ or in another tab), or the system's. */
export function showTheme() {
  const saved = localStorage.getItem(THEME_KEY);
  const dark = saved === "light" || saved === "dark" ? saved === "dark" : systemDark.matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
}

function applyTheme(choice) {
  if (choice === "system") localStorage.removeItem(THEME_KEY);
  else localStorage.setItem(THEME_KEY, choice);
  showTheme();
}

export class SettingsPanel {
  /** opts: sessionSettings (the composer's model picker and prompt button), notify(msg) */
  constructor({ sessionSettings, notify }) {
    this.sessionSettings = sessionSettings;
    this.notify = notify;
    this.dialog = $("settings-dialog");
    this.server = null;
    this.resetPrompt = false;
    $("settings-btn").addEventListener("click", () => this.open());
    $("settings-reset").addEventListener("click", () => {
      $("settings-model").value = "";
      $("settings-prompt").value = this.server?.command_line.system_prompt ?? "";
      this.resetPrompt = true;
    });
    $("settings-prompt").addEventListener("input", () => {
      this.resetPrompt = false;
    });
    this.dialog.addEventListener("close", () => {
      if (this.dialog.returnValue === "save") this.save();
    });
    this.showHint();
    // chosen in another tab of this browser: it applies here at once, so the hint says so
    // and the theme is that one
    addEventListener("storage", (e) => {
      if (e.key === SEND_KEY || e.key === null) this.showHint();
      if (e.key === THEME_KEY || e.key === null) showTheme();
    });
    systemDark.addEventListener("change", showTheme); // System: as the system's changes
    // the server's defaults saved in another tab of this browser: the picker's "Default (…)"
    // and the prompt button here follow at once (another device's show at the next load)
    this.saved = new BroadcastChannel("tether-settings");
    this.saved.addEventListener("message", () => this.followDefaults());
  }

  showHint() {
    $("composer-hint").textContent = HINTS[sendKey()];
  }

  /** Opens at once, this browser's part ready and the server's off until it is read: an
   * Esc (or Cancel) meanwhile closes the dialog, as at any time, and the answer is dropped. */
  async open() {
    this.resetPrompt = false;
    $("settings-save-error").hidden = true;
    const theme = localStorage.getItem(THEME_KEY);
    $("settings-theme").value = theme === "light" || theme === "dark" ? theme : "system";
    $("settings-view").value = $("display-mode").value;
    $("settings-send").value = sendKey();
    this.server = null;
    this.showServer("reading");
    this.dialog.returnValue = "";
    this.dialog.showModal();
    const reading = {}; // this opening's: a later one (closed and opened again) has its own
    this.reading = reading;
    let server = null;
    let error = null;
    try {
      server = await get("/api/settings");
    } catch (err) {
      error = err;
    }
    if (this.reading !== reading || !this.dialog.open) return;
    if (error) this.notify(error.message);
    this.server = server;
    // the server's part cannot be read (offline, the database away): this browser's own
    // preferences still save; the server's fieldset says why it is off
    this.showServer(server === null ? "off" : "on");
    if (server === null) return;
    this.fillModels(server.saved.default_model ?? "");
    $("settings-prompt").value = server.default_system_prompt ?? "";
    // opened before the endpoint's list arrived (a slow endpoint, a busy server): it is
    // filled in when it does, keeping what is chosen
    this.sessionSettings.loaded.then(() => {
      if (this.dialog.open && this.server !== null) this.fillModels($("settings-model").value);
    });
  }

  /** The server's fieldset: "reading" (empty, off, saying so), "off" (could not be read), or
   *  "on". */
  showServer(state) {
    $("settings-server").disabled = state !== "on";
    $("settings-server-reading").hidden = state !== "reading";
    $("settings-server-off").hidden = state !== "off";
    if (state === "reading") {
      $("settings-model").replaceChildren();
      $("settings-prompt").value = "";
    }
  }

  /** The default-model choices: the command line's, the endpoint's list, and `chosen` when
   * the list lacks it (a saved default the endpoint no longer offers). */
  fillModels(chosen) {
    const models = this.sessionSettings.models.models ?? [];
    const names = this.sessionSettings.names;
    const options = [
      new Option(`Command line's (${names.label(this.server.command_line.model)})`, ""),
    ];
    for (const m of models) options.push(new Option(m.label, m.id)); // shown: its label
    if (chosen && !models.some((m) => m.id === chosen)) {
      options.push(new Option(unlistedLabel(chosen, names), chosen));
    }
    $("settings-model").replaceChildren(...options);
    $("settings-model").value = chosen;
  }

  async save() {
    applyTheme($("settings-theme").value);
    const mode = $("display-mode");
    if (mode.value !== $("settings-view").value) {
      mode.value = $("settings-view").value;
      mode.dispatchEvent(new Event("change"));
    }
    localStorage.setItem(SEND_KEY, $("settings-send").value);
    this.showHint();
    if (this.server === null) return; // the server's part was not read: nothing to send
    const changes = {};
    const model = $("settings-model").value;
    if (model !== (this.server.saved.default_model ?? "")) changes.default_model = model || null;
    const prompt = $("settings-prompt").value;
    if (this.resetPrompt) {
      if ("default_system_prompt" in this.server.saved) changes.default_system_prompt = null;
    } else if (prompt !== (this.server.default_system_prompt ?? "")) {
      changes.default_system_prompt = prompt;
    }
    if (!Object.keys(changes).length) return;
    try {
      this.server = await patch("/api/settings", changes);
    } catch (err) {
      // what was typed is not lost with the dialog: it opens again, with it, saying why
      this.notify(err.message);
      const note = $("settings-save-error");
      note.textContent = `Not saved: ${err.message} Save again, or Cancel.`;
      note.hidden = false;
      this.dialog.returnValue = "";
      this.dialog.showModal();
      return;
    }
    this.saved.postMessage("saved");
    await this.followDefaults();
  }

  /** The server's defaults changed: "Default (model)" and the prompt button follow. */
  async followDefaults() {
    await this.sessionSettings.load();
    this.sessionSettings.show(this.sessionSettings.row);
  }
}
