// The open session's own settings (docs/api.md §3, `PATCH /api/session`), beside the composer:
// the model picker and the system prompt (a button that says whether one is in effect, and a
// dialog to edit it: what the model gets first, invariant 1). What they show is the session
// row (a fold of the log); a change is a PATCH whose answer is the new row, and another tab
// sees it through the sidebar stream.
import { get, patch } from "./api.js";
import { ModelNames, unlistedLabel } from "./names.js";

const $ = (id) => document.getElementById(id);

export class SessionSettings {
  /** onRow(row, sent): a row read by a request sent at `sent`, a `stamp()` (sidebar.js);
   *  onNames(names): the `ModelNames` of a list just read, for what else names a model. */
  constructor({ ensureSession, onRow, stamp, notify, onNames }) {
    this.ensureSession = ensureSession;
    this.onRow = onRow;
    this.stamp = stamp;
    this.notify = notify;
    this.onNames = onNames;
    this.models = { models: [], default: "" };
    this.names = new ModelNames();
    /** Settled once the first `load` has an answer (or an error): the Settings dialog,
     * opened before that, fills its model list then. */
    this.loaded = new Promise((resolve) => {
      this.markLoaded = resolve;
    });
    this.picker = $("model-picker");
    this.picker.addEventListener("change", () => this.pickModel(this.picker.value || null));
    this.row = null;
    /** `{sid, model}` while a picked model's PATCH is on its way: the header is redrawn with
     *  rows read before it (a run starting, a rename elsewhere), which must not show the
     *  model in effect until the server has answered. */
    this.picking = null;
    this.promptButton = $("system-prompt-btn");
    this.promptButton.addEventListener("click", () => this.editPrompt());
  }

  /** The endpoint's own list (`GET /api/models`); the first option is the server default. */
  async load() {
    try {
      this.models = await get("/api/models");
      this.names = new ModelNames(this.models);
    } catch (err) {
      this.notify(err.message);
      return;
    } finally {
      this.markLoaded();
    }
    this.onNames(this.names);
    // shown: each model's label (its id as visible text, docs/api.md); sent back: its id
    const options = [new Option(`Default (${this.models.default_label})`, "")];
    for (const model of this.models.models) options.push(new Option(model.label, model.id));
    this.picker.replaceChildren(...options);
    this.picker.title = this.models.error
      ? `The model list could not be read: ${this.models.error.message}`
      : "";
  }

  /** Show the open session's row (or none: a new chat starts on the default). */
  show(row) {
    const pick = this.picking;
    const picked = pick && (pick.sid === null || pick.sid === row?.session_id);
    const model = picked ? pick.model : (row?.model ?? "");
    if (model && ![...this.picker.options].some((o) => o.value === model)) {
      // not (or no longer) listed
      this.picker.append(new Option(unlistedLabel(model, this.names), model));
    }
    this.picker.value = model;
    if (row?.session_id !== this.row?.session_id) $("model-note").hidden = true; // another session
    this.row = row ?? null;
    const own = row?.system_prompt ?? null;
    const effective = own ?? this.models.default_system_prompt ?? null;
    this.promptButton.classList.toggle("set", !!effective);
    this.promptButton.setAttribute(
      "aria-label",
      effective
        ? `System prompt (${own !== null ? "this session's" : "default"})`
        : "System prompt (none)",
    );
    this.promptButton.title = effective ?? "No system prompt";
  }

  /** A model the server did not take is not shown as picked: the picker goes back to the
   *  model in effect (what the next turn uses), and a note beside it says it was not saved. */
  async pickModel(model) {
    const note = $("model-note");
    note.hidden = true;
    this.picking = { sid: this.row?.session_id ?? null, model: model ?? "" };
    let failed;
    try {
      failed = await this.change({ model });
    } finally {
      this.picking = null;
    }
    this.show(this.row);
    if (!failed) return;
    note.textContent = `Not saved: ${failed.message}`;
    note.hidden = false;
  }

  /** The dialog shows the prompt in effect; Save makes it the session's own, Use default
   *  clears the session's own (`null`). A change the server did not take opens the dialog
   *  again with what was typed, saying why: the text is not lost with the dialog. */
  async editPrompt() {
    const dialog = $("system-prompt-dialog");
    await this.readDefaults();
    const own = this.row?.system_prompt ?? null;
    const fallback = this.models.default_system_prompt ?? null;
    let text = own ?? fallback ?? "";
    let note =
      own !== null
        ? "This session's own system prompt: the first message of every model request."
        : fallback
          ? "The server's default system prompt. Save to give this session its own."
          : "No system prompt. Anything saved here is sent first in every model request.";
    for (;;) {
      $("system-prompt-text").value = text;
      $("system-prompt-note").textContent = note;
      dialog.returnValue = "";
      dialog.showModal();
      const answer = await new Promise((resolve) =>
        dialog.addEventListener("close", () => resolve(dialog.returnValue), { once: true }),
      );
      text = $("system-prompt-text").value;
      let failed = null;
      if (answer === "save") failed = await this.change({ system_prompt: text });
      else if (answer === "default" && own !== null) {
        failed = await this.change({ system_prompt: null });
      }
      if (!failed) return;
      note = `Not saved: ${failed.message} Your text is still here: try again, or Cancel.`;
    }
  }

  /** The server's defaults as they are now (`GET /api/settings`): another tab or device may
   *  have changed them since this tab read the model list, and the default prompt is what a
   *  session without its own sends first. Unread (offline), what was read before stays. */
  async readDefaults() {
    try {
      const now = await get("/api/settings");
      this.models.default_system_prompt = now.default_system_prompt;
    } catch {
      return;
    }
    this.show(this.row);
  }

  /** PATCH the open session (creating it in a new chat); the error when it failed. */
  async change(changes) {
    try {
      const sid = await this.ensureSession();
      const sent = this.stamp();
      const { session } = await patch("/api/session", { session_id: sid, ...changes });
      this.onRow(session, sent);
      return null;
    } catch (err) {
      this.notify(err.message);
      return err;
    }
  }
}
