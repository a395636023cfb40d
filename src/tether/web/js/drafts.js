// What the user typed and has not sent, one draft per session (docs/page.md, "Drafts"): the
// composer's text and files, and the edits left open on its messages. The composer shows the
// draft of the session shown; a New chat has its own, which becomes its session's when that
// is created.

export const NEW_CHAT = "new"; // the key of the New chat's draft (a session id never is)

export class Drafts {
  /** `composer`: the Composer (draft(), setDraft(draft));
   *  `editsShown()`: the edits left open in the session shown (`openEdits`, branches.js). */
  constructor({ composer, editsShown }) {
    this.composer = composer;
    this.editsShown = editsShown;
    this.key = null; // the draft the composer shows: a session id, NEW_CHAT, or none yet
    this.memory = new Map(); // key -> {text, edits, files}
  }

  read(key) {
    const draft = this.memory.get(key);
    return { text: draft?.text ?? "", edits: draft?.edits ?? [], files: draft?.files ?? [] };
  }

  write(key, { text, edits, files }) {
    if (!text.trim() && !edits.length && !files.length) this.memory.delete(key);
    else this.memory.set(key, { text, edits, files });
  }

  /** Keep the draft shown now. */
  save() {
    if (this.key === null) return;
    this.write(this.key, { ...this.composer.draft(), edits: this.editsShown() });
  }

  /** The composer shows `key`'s draft (the one shown before is saved first: `save`); the
   *  first time, what was typed while the page loaded is kept after it. */
  show(key) {
    const draft = this.read(key);
    if (this.key === null) {
      const typed = this.composer.draft();
      draft.text = [draft.text, typed.text].filter((text) => text.trim()).join("\n\n");
      draft.files.push(...typed.files);
    }
    this.key = key;
    this.composer.setDraft(draft);
  }

  /** The New chat's session was created: its draft is that session's from now on. */
  adopt(sid) {
    if (this.key !== NEW_CHAT) return;
    this.save();
    this.write(sid, this.read(NEW_CHAT));
    this.write(NEW_CHAT, { text: "", edits: [], files: [] });
    this.key = sid;
  }

  /** Session `sid` is gone: its draft is dropped, and returned. */
  take(sid) {
    const draft = this.read(sid);
    this.write(sid, { text: "", edits: [], files: [] });
    return draft;
  }
}
