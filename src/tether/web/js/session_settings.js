// The open session's own settings (docs/api.md §3, `PATCH /api/session`): the header's model
// picker. What it shows is the session row (a fold of the log); a change is a PATCH whose
// answer is the new row, and another tab sees it through the sidebar stream.
import { get, patch } from "./api.js";

const $ = (id) => document.getElementById(id);

export class SessionSettings {
  constructor({ ensureSession, onRow, notify }) {
    this.ensureSession = ensureSession;
    this.onRow = onRow;
    this.notify = notify;
    this.models = { models: [], default: "" };
    this.picker = $("model-picker");
    this.picker.addEventListener("change", () => this.setModel(this.picker.value || null));
  }

  /** The endpoint's own list (`GET /api/models`); the first option is the server default. */
  async load() {
    try {
      this.models = await get("/api/models");
    } catch (err) {
      this.notify(err.message);
      return;
    }
    const options = [new Option(`Default (${this.models.default})`, "")];
    for (const model of this.models.models) options.push(new Option(model.id, model.id));
    this.picker.replaceChildren(...options);
    this.picker.title = this.models.error
      ? `The model list could not be read: ${this.models.error.message}`
      : "";
  }

  /** Show the open session's row (or none: a new chat starts on the default). */
  show(row) {
    const model = row?.model ?? "";
    if (model && ![...this.picker.options].some((o) => o.value === model)) {
      this.picker.append(new Option(model, model)); // not (or no longer) in the list
    }
    this.picker.value = model;
  }

  async setModel(model) {
    try {
      const sid = await this.ensureSession();
      const { session } = await patch("/api/session", { session_id: sid, model });
      this.onRow(session);
    } catch (err) {
      this.notify(err.message);
    }
  }
}
