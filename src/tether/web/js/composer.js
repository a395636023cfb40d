// The composer: one primary button that sends, or stops while a run is active; Enter sends
// (Shift+Enter is a newline); while a run is active the text can steer it or wait in the
// queue, which is shown above, editable and removable. Attachments by picker, paste or drop.
import { composing, h, patchChildren } from "./dom.js";
import { sendKey } from "./settings.js";

const readBase64 = (file) =>
  new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1] || "");
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });

/** A file or blob as a draft attachment, in the shape the composer sends. */
export async function asDraft(blob, name, mime) {
  return { name, mime, data_base64: await readBase64(blob), size: blob.size };
}

export class Composer {
  /** actions: send(text, files), stop(), steer(text), queue(text, files),
   *  editQueued(id, text) (the error when the server did not take it), removeQueued(id),
   *  sendQueued(id), notify(message), changed(now) (the draft changed: drafts.js; `now`
   *  when it was sent, so its stored draft goes at once). */
  constructor(actions) {
    this.actions = actions;
    this.form = document.getElementById("composer");
    this.input = document.getElementById("message");
    this.primary = document.getElementById("primary-btn");
    this.steerBtn = document.getElementById("steer-btn");
    this.queueBtn = document.getElementById("queue-btn");
    this.queueList = document.getElementById("queue");
    this.chips = document.getElementById("attachment-chips");
    this.fileInput = document.getElementById("file-input");
    this.files = [];
    this.sizedLength = 0; // the text length autosize last saw: a shorter one may need fewer lines
    this.running = false;
    this.busy = false;
    this.editing = null;

    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.primaryAction();
    });
    this.input.addEventListener("keydown", (e) => {
      // the send key is this browser's choice (settings.js): Enter, or Ctrl/Cmd+Enter
      const chord = e.ctrlKey || e.metaKey;
      const sends = sendKey() === "mod-enter" ? chord : true;
      if (e.key === "Enter" && !e.shiftKey && !composing(e) && sends) {
        e.preventDefault();
        if (this.running) {
          if (this.hasContent()) this.queue();
        } else this.send();
      }
    });
    this.input.addEventListener("input", () => {
      this.autosize();
      this.refresh();
      this.actions.changed();
    });
    this.steerBtn.addEventListener("click", () => this.steer());
    this.queueBtn.addEventListener("click", () => this.queue());
    document.getElementById("attach-btn").addEventListener("click", () => this.fileInput.click());
    const picked = () => {
      this.addFiles([...this.fileInput.files]);
      this.fileInput.value = "";
    };
    this.fileInput.addEventListener("change", picked);
    if (this.fileInput.files.length) picked(); // picked before this script ran
    this.input.addEventListener("paste", (e) => {
      const files = [...(e.clipboardData?.files || [])];
      if (files.length) {
        e.preventDefault();
        this.addFiles(files);
      }
    });
    const main = document.getElementById("main");
    main.addEventListener("dragover", (e) => {
      e.preventDefault();
    });
    main.addEventListener("drop", (e) => {
      e.preventDefault();
      this.addFiles([...(e.dataTransfer?.files || [])]);
    });
    this.refresh();
  }

  hasContent() {
    return this.input.value.trim().length > 0 || this.files.length > 0;
  }

  /** The box grows with its text up to 40% of the window and shrinks when text goes. A key
   * that adds no line writes nothing: collapsing the box to measure it resized the
   * transcript above twice per key, which a long session repainted whole each time. */
  autosize() {
    const box = this.input;
    const shrank = box.value.length < this.sizedLength;
    this.sizedLength = box.value.length;
    if (!shrank && box.scrollHeight <= box.clientHeight) return;
    if (shrank) box.style.height = "auto";
    const border = box.offsetHeight - box.clientHeight;
    const height = `${Math.min(box.scrollHeight + border, window.innerHeight * 0.4)}px`;
    if (box.style.height !== height) box.style.height = height;
  }

  /** Read, then added to the files shown then: a draft shown meanwhile (drafts.js)
   *  replaces the list, and must not lose them. */
  async addFiles(files) {
    const read = [];
    for (const file of files) {
      read.push(
        await asDraft(file, file.name || "pasted", file.type || "application/octet-stream"),
      );
    }
    this.files.push(...read);
    this.renderChips();
    this.refresh();
    this.actions.changed();
  }

  renderChips() {
    const specs = this.files.map((f, i) => ({ key: `${i}:${f.name}`, file: f, index: i }));
    patchChildren(
      this.chips,
      specs,
      () =>
        h(
          "li",
          {},
          h("span", { class: "chip-name", dir: "auto" }),
          h("button", {
            type: "button",
            class: "chip-x",
            "aria-label": "Remove attachment",
            text: "×",
          }),
        ),
      (el, spec) => {
        el.querySelector(".chip-name").textContent = spec.file.name;
        el.querySelector(".chip-x").onclick = () => {
          this.files.splice(spec.index, 1);
          this.renderChips();
          this.refresh();
          this.actions.changed();
        };
      },
    );
  }

  take() {
    const text = this.input.value;
    const files = this.files.map(({ name, mime, data_base64 }) => ({ name, mime, data_base64 }));
    this.setDraft({ text: "", files: [] });
    this.actions.changed(true);
    return { text, files };
  }

  /** What the composer holds: its text and files (drafts.js keeps it per session). */
  draft() {
    return { text: this.input.value, files: [...this.files] };
  }

  /** Show a session's draft in place of what is shown (drafts.js). */
  setDraft({ text, files }) {
    this.input.value = text;
    this.files = [...files];
    this.renderChips();
    this.autosize();
    this.refresh();
  }

  /** The files of the draft shown, read back from the browser's storage (drafts.js). */
  showFiles(files) {
    this.files = [...files];
    this.renderChips();
    this.refresh();
  }

  /** Put text and attachments back (a refused send, a rotated session, a leftover steer). */
  restore(text, files = []) {
    this.input.value = [text, this.input.value].filter((part) => part.trim()).join("\n\n");
    this.files.push(...files);
    this.renderChips();
    this.autosize();
    this.refresh();
    this.actions.changed();
    this.input.focus();
  }

  primaryAction() {
    if (this.running) this.actions.stop();
    else this.send();
  }

  send() {
    if (!this.hasContent() || this.busy) return;
    const { text, files } = this.take();
    this.actions.send(text, files);
  }

  steer() {
    if (!this.input.value.trim()) return;
    this.actions.steer(this.take().text);
  }

  queue() {
    if (!this.hasContent()) return;
    const { text, files } = this.take();
    this.actions.queue(text, files);
  }

  /** The run state of the open session: running switches the primary button to Stop. */
  setRunning(running) {
    this.running = running;
    this.refresh();
  }

  /** While the server is unreachable Stop cannot reach it: disabled, and it says why. */
  setOffline(offline) {
    this.offline = offline;
    this.refresh();
  }

  refresh() {
    this.primary.textContent = this.running ? "Stop" : "Send";
    this.primary.setAttribute("aria-label", this.running ? "Stop" : "Send");
    this.primary.classList.toggle("stop", this.running);
    this.primary.disabled =
      (this.running && !!this.offline) || (!this.running && (!this.hasContent() || this.busy));
    this.primary.title =
      this.running && this.offline ? "The server is unreachable: Stop waits for it" : "";
    const extra = this.running && this.hasContent();
    this.steerBtn.hidden = !extra || this.files.length > 0;
    this.queueBtn.hidden = !extra;
  }

  /** Queued messages; while the session is idle (after a Stop or an error the queue waits)
   *  each offers "Send now", so none is stranded. */
  renderQueue(queued, idle = false) {
    const specs = queued.map((q) => ({ key: q.queue_id, q }));
    patchChildren(
      this.queueList,
      specs,
      () =>
        h(
          "li",
          {},
          h("span", { class: "queued-label", text: "Queued:" }),
          h("span", { class: "queued-text" }),
          h("button", { type: "button", class: "btn send-now", text: "Send now" }),
          h("button", { type: "button", class: "btn icon edit", text: "Edit" }),
          h("button", {
            type: "button",
            class: "chip-x remove",
            text: "×",
            "aria-label": "Remove queued message",
          }),
        ),
      (el, { q }) => {
        if (this.editing !== q.queue_id) el.querySelector(".queued-text").textContent = q.text;
        el.querySelector(".remove").onclick = () => this.actions.removeQueued(q.queue_id);
        el.querySelector(".edit").onclick = () => this.editQueued(el, q);
        const sendNow = el.querySelector(".send-now");
        sendNow.hidden = !idle;
        sendNow.onclick = () => this.actions.sendQueued(q.queue_id);
      },
    );
  }

  /** An edit the server did not take is not lost: its editor opens again with it, saying
   *  why (without taking the focus from where the user went meanwhile); or, the message no
   *  longer queued (sent or removed meanwhile), it goes to the composer. */
  editQueued(el, q, text = q.text, why = "", focus = true) {
    this.editing = q.queue_id;
    const span = el.querySelector(".queued-text");
    const area = h("textarea", { rows: 2, "aria-label": "Edit queued message" });
    area.value = text;
    const note = why ? h("span", { class: "queued-note", role: "alert", text: why }) : null;
    let finished = false;
    const done = async (save) => {
      // the box leaving the page blurs it: Esc's discard must not become a save
      if (finished) return;
      finished = true;
      this.editing = null;
      note?.remove();
      area.replaceWith(span);
      const edited = area.value;
      if (!save || !edited.trim() || edited === q.text) return;
      const failed = await this.actions.editQueued(q.queue_id, edited);
      if (!failed) return;
      const gone = failed.code === "queue_item_not_found" || !el.isConnected || this.editing;
      if (!gone) {
        const active = document.activeElement;
        const elsewhere = active !== null && active !== document.body; // clicked away
        const why = `Not saved: ${failed.message} Enter to try again.`;
        this.editQueued(el, q, edited, why, !elsewhere);
        return;
      }
      this.restore(edited);
      this.actions.notify(`Not saved: ${failed.message} Your edit is in the composer.`);
    };
    area.addEventListener("keydown", (e) => {
      if (composing(e)) return;
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        done(true);
      }
      if (e.key === "Escape") done(false);
    });
    area.addEventListener("blur", () => done(true));
    span.replaceWith(area);
    if (note) area.after(note);
    if (focus) area.focus();
  }
}
