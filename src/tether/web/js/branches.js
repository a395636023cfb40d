// Edit, Regenerate and the branch switcher of a row (docs/api.md §10, docs/page.md): the
// controls transcript.js puts on each settled row, and what a click on them asks the server.
// What the page shows then comes back as events through the reducer (reducer_branches.js),
// like every other change, so this tab, another tab and a reload agree.
import { ApiError, post } from "./api.js";
import { asDraft } from "./composer.js";
import { composing, h, setAttr, setHidden } from "./dom.js";
import { shownFiles } from "./names.js";
import { switchesToShow } from "./reducer_branches.js";
import { catchUp, changed, position, regenerate } from "./refusals.js";
import { sendKey } from "./settings.js";

const SHOWN_WAIT_MS = 5000; // how long a switched branch may take to arrive as events

// Labels are drawn from `aria-label` by CSS, so a row's text stays the message alone.
const button = (cls, label) =>
  h("button", { type: "button", class: `btn row-action ${cls}`, "aria-label": label });

/** The controls of one row: "‹ 2/3 ›" where branches diverge, then Edit or Regenerate. */
export function buildRowActions(role) {
  return h(
    "div",
    { class: "row-actions", role: "group", "aria-label": "Message actions" },
    h(
      "span",
      { class: "branch-switch", hidden: true },
      button("branch-prev", "Previous branch"),
      h("span", { class: "branch-count" }),
      button("branch-next", "Next branch"),
    ),
    role === "user" ? button("edit-message", "Edit") : button("regenerate", "Regenerate"),
  );
}

/** Show `row`'s controls: none on a live row, on a row of an earlier session, or while a
 *  run holds the session (the server would refuse with 409 `session_busy`). Writes only what
 *  differs: a run starting or ending updates every row's controls (transcript.js). */
export function updateRowActions(el, row, { running }) {
  const actions = el.querySelector(".row-actions");
  if (!actions) return;
  const settled = !row.live && !row.session_id; // inherited rows carry their session's id
  setHidden(actions, !settled);
  setAttr(el, "data-row-id", row.id);
  el.attachmentList = shownFiles(row.attachments); // what an edit keeps unless removed
  const branch = row.branch;
  setHidden(actions.querySelector(".branch-switch"), !branch);
  if (branch) {
    const count = actions.querySelector(".branch-count");
    setAttr(count, "data-text", `${branch.index}/${branch.count}`);
    setAttr(count, "aria-label", `Branch ${branch.index} of ${branch.count}`);
    setDisabled(actions.querySelector(".branch-prev"), running || branch.index <= 1);
    setDisabled(actions.querySelector(".branch-next"), running || branch.index >= branch.count);
  }
  for (const b of actions.querySelectorAll(".edit-message, .regenerate")) setDisabled(b, running);
}

function setDisabled(el, disabled) {
  if (el.disabled !== disabled) el.disabled = disabled;
}

/** The open edits (`{key, text, kept}`: the row's key, the typed text, the files kept) in
 *  `rowsEl`, but those on their way to the server. */
export function openEdits(rowsEl) {
  return [...rowsEl.querySelectorAll(":scope > .row.editing:not([data-saving])")].map((row) => ({
    key: row.dataset.key,
    text: row.querySelector(".edit-box textarea")?.value ?? "",
    kept: kept(row),
  }));
}

/** The open edits of rows not among `rows` (their message is no longer shown: another tab
 *  switched, edited or regenerated above it): the render about to remove those rows must
 *  not take what was typed with them. */
export function editsLeaving(rowsEl, rows) {
  const open = openEdits(rowsEl);
  if (open.length === 0) return open;
  const keys = new Set(rows.map((row) => row.key));
  return open.filter((edit) => !keys.has(edit.key) && edit.text.trim());
}

/** The attachments still listed under a row's edit box: what its edit keeps. */
function kept(row) {
  const ids = new Set([...row.querySelectorAll(".edit-attachments li")].map((li) => li.dataset.id));
  return (row.attachmentList || []).filter((a) => ids.has(a.id));
}

/** Attachments an edit kept, read back as the composer's drafts for an edit that goes to
 *  the composer: a continuation cannot name another session's uploads, so they are sent
 *  anew. One that cannot be read is left out. */
export async function asDrafts(attachments) {
  const drafts = [];
  for (const a of attachments) {
    const response = await fetch(a.url).catch(() => null);
    if (!response?.ok) continue;
    drafts.push(await asDraft(await response.blob(), a.name, a.mime));
  }
  return drafts;
}

export class BranchActions {
  /** `app` gives `openId`, `call(fn)`, `refused(err, text, files)`, `notify(msg)` and
   *  `drafts` (drafts.js). */
  constructor(root, app) {
    this.app = app;
    this.switching = Promise.resolve(); // ‹ › switches, one at a time (switchFrom)
    this.lastSwitch = null; // what the last one left shown at its fork, from its answer
    this.answerWatch = null; // a keyboard Regenerate's wait for its answer (focusNewAnswer)
    root.addEventListener("click", (event) => this.onClick(event));
    root.addEventListener("keydown", (event) => this.onKey(event));
  }

  /** A search result on a hidden branch (docs/api.md §10 Search): show the branch it is on,
   *  one `POST /api/session/branch` per fork from the root down, then wait for the switches
   *  to come back as events. True once the row is in `state.messages`; false when no switch
   *  can show it (the caller says where it is); null when the server refused (said). */
  async showRow(entry, rowId) {
    const sid = entry.state.sessionId;
    const switches = switchesToShow(entry.state.tree, rowId);
    if (!switches?.length) return false;
    for (const body of switches) {
      const answer = await this.app.call(() =>
        post("/api/session/branch", { session_id: sid, ...body }),
      );
      if (!answer) return null;
    }
    const until = Date.now() + SHOWN_WAIT_MS;
    const shown = () => entry.state.messages.some((row) => row.id === rowId);
    while (!shown() && Date.now() < until && this.app.openId === sid) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    return shown();
  }

  onClick(event) {
    const target = event.target.closest(
      ".branch-prev, .branch-next, .edit-message, .regenerate, .edit-save, .edit-cancel",
    );
    const row = target?.closest(".row");
    if (!row) return;
    const sid = this.app.openId;
    const rowId = row.dataset.rowId;
    if (target.matches(".branch-prev, .branch-next")) {
      this.switchFrom(row, target.matches(".branch-next") ? 1 : -1, target);
    } else if (target.matches(".regenerate")) {
      if (target.dataset.sending !== undefined) return; // a double click starts one run
      target.dataset.sending = "";
      const focused = document.activeElement === target;
      const rowsEl = row.parentElement; // the row may be gone by the answer: its run's events
      const position = [...rowsEl.children].filter((el) => el.dataset.rowId).indexOf(row);
      regenerate(this.app, sid, rowId)
        .then((answer) => {
          if (focused && answer) this.focusNewAnswer(rowsEl, position, rowId, target);
        })
        .finally(() => delete target.dataset.sending);
    } else if (target.matches(".edit-message")) {
      this.openEditor(row);
    } else if (target.matches(".edit-cancel")) {
      this.closeEditor(row);
    } else {
      this.save(row, sid, rowId);
    }
  }

  /** ‹ (`step` -1) or › (+1) on `row`. Switches go one at a time, each from where the one
   *  before left that fork: its answer says, until its events have been folded here. A
   *  second click before then named the row the first one hid, and the server's 404 told
   *  the user to reload. */
  switchFrom(row, step, pressed) {
    const sid = this.app.openId;
    const rowsEl = row.parentElement;
    const position = [...rowsEl.children].filter((el) => el.dataset.rowId).indexOf(row);
    const focused = document.activeElement === pressed;
    this.switching = this.switching.then(async () => {
      const state = this.app.sessions.get(sid)?.state;
      const last = this.lastSwitch;
      const shown = state?.messages[position];
      const from =
        last?.sid === sid && last.position === position && last.seq > (state?.lastSeq ?? 0)
          ? last
          : shown?.branch && { rowId: shown.id, ...shown.branch };
      const index = from ? from.index + step : 0;
      if (index < 1 || index > from.count) return;
      const answer = await this.app.call(() =>
        post("/api/session/branch", { session_id: sid, row_id: from.rowId, index }),
      );
      const now = answer?.session.messages[position];
      this.lastSwitch = now?.branch
        ? { sid, position, rowId: now.id, ...now.branch, seq: answer.session.last_seq }
        : null;
      if (focused && now) this.refocus(rowsEl, position, now.id, pressed);
    });
  }

  /** A switch pressed from the keyboard shows another row in that place, another element,
   *  and may disable the button pressed at either end: once the row is shown, the focus goes
   *  to its same button, or to the other one then, unless the user has moved it meanwhile. */
  async refocus(rowsEl, position, rowId, pressed) {
    const until = Date.now() + SHOWN_WAIT_MS;
    const same = pressed.matches(".branch-next") ? ".branch-next" : ".branch-prev";
    const other = same === ".branch-next" ? ".branch-prev" : ".branch-next";
    const moved = () =>
      document.activeElement !== pressed && document.activeElement !== document.body;
    for (;;) {
      const row = [...rowsEl.children].filter((el) => el.dataset.rowId)[position];
      if (row?.dataset.rowId === rowId) {
        if (moved()) return;
        const button = row.querySelector(same);
        (button && !button.disabled ? button : row.querySelector(other))?.focus();
        return;
      }
      if (moved() || Date.now() > until) return;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** A Regenerate pressed from the keyboard hides the answer it was on (another element,
   *  then a live row, takes its place) and the focus falls to the page: once the new answer
   *  is settled there, its Regenerate has the focus, unless the user has moved it meanwhile
   *  or opened another session. Runs take long: this waits on the rows' changes, not a clock. */
  focusNewAnswer(rowsEl, position, oldId, pressed) {
    this.answerWatch?.disconnect();
    const sid = this.app.openId;
    const check = () => {
      const active = document.activeElement;
      if (this.app.openId !== sid || (active !== pressed && active !== document.body)) {
        return watch.disconnect();
      }
      const row = [...rowsEl.children].filter((el) => el.dataset.rowId)[position];
      const button = row?.querySelector(".regenerate");
      if (!button || row.dataset.rowId === oldId || row.matches(".live") || button.disabled) return;
      watch.disconnect();
      button.focus();
    };
    const watch = new MutationObserver(check);
    this.answerWatch = watch;
    watch.observe(rowsEl, {
      childList: true,
      subtree: true,
      attributes: true,
      attributeFilter: ["disabled"],
    });
    check();
  }

  onKey(event) {
    const area = event.target.closest?.(".edit-box textarea");
    if (!area || composing(event)) return;
    const row = area.closest(".row");
    // "Save and send" is a send: the send key chosen for the composer (settings.js), or
    // Ctrl/Cmd+Enter in either case
    const chord = event.ctrlKey || event.metaKey;
    const sends = chord || (sendKey() === "enter" && !event.shiftKey);
    if (event.key === "Escape") this.closeEditor(row);
    else if (event.key === "Enter" && sends) {
      event.preventDefault();
      this.save(row, this.app.openId, row.dataset.rowId);
    }
  }

  /** Open the edits `edits` (from `openEdits`) again as they were left, without taking the
   *  focus: the user came back to their session. Returns those whose row is not shown. */
  reopen(rowsEl, edits) {
    const lost = [];
    for (const edit of edits) {
      const row = [...rowsEl.children].find((el) => el.dataset.key === edit.key);
      if (row?.dataset.rowId) this.openEditor(row, edit);
      else if (edit.text.trim()) lost.push(edit);
    }
    return lost;
  }

  /** The edit box in place of `row`'s message: the message and all its files, or an edit
   *  left open earlier (`{text, kept}`, reopen). */
  openEditor(row, edit = null) {
    if (row.querySelector(".edit-box")) return;
    const area = h("textarea", { rows: 3, "aria-label": "Edit message" });
    area.value = edit ? edit.text : row.copySource || "";
    // The message's attachments go with the edit, each removable (`keep_attachments`).
    const kept = h("ul", { class: "attachments edit-attachments", "aria-label": "Attachments" });
    const keeps = edit ? new Set(edit.kept.map((a) => a.id)) : null;
    for (const a of (row.attachmentList || []).filter((a) => !keeps || keeps.has(a.id))) {
      const chip = h(
        "li",
        { dataset: { id: a.id } },
        h("span", { class: "chip-name", dir: "auto", text: a.name }),
        h("button", {
          type: "button",
          class: "chip-x",
          "aria-label": `Remove ${a.name}`,
          text: "×",
          onclick: () => {
            chip.remove();
            area.focus();
          },
        }),
      );
      kept.append(chip);
    }
    const box = h(
      "div",
      { class: "edit-box" },
      area,
      kept.childElementCount ? kept : null,
      h(
        "div",
        { class: "edit-buttons" },
        h("button", { type: "button", class: "btn edit-cancel", text: "Cancel" }),
        h("button", { type: "button", class: "btn primary edit-save", text: "Save and send" }),
      ),
    );
    row.classList.add("editing");
    row.querySelector(".user-bubble").after(box);
    if (!edit) area.focus();
  }

  closeEditor(row) {
    row.querySelector(".edit-box")?.remove();
    row.classList.remove("editing");
    row.querySelector(".edit-message")?.focus();
  }

  /** The edited message becomes a new branch; the old one stays. A refusal keeps the text. */
  async save(row, sid, rowId) {
    if (row.dataset.saving !== undefined) return; // sent already (a second Ctrl+Enter)
    const area = row.querySelector(".edit-box textarea");
    const text = area?.value ?? "";
    if (!text.trim()) {
      area?.focus();
      return;
    }
    for (const b of row.querySelectorAll(".edit-box button")) b.disabled = true;
    // the position of the view it was edited in: 409 if another tab changed it since
    const body = {
      session_id: sid,
      message: text,
      edit_of: rowId,
      after_seq: position(this.app, sid),
    };
    const files = kept(row);
    if ((row.attachmentList || []).length) body.keep_attachments = files.map((a) => a.id);
    row.dataset.saving = ""; // its own events may remove the row before the answer comes
    try {
      await post("/api/chat/start", body);
      row.querySelector(".edit-box")?.remove();
      row.classList.remove("editing");
    } catch (err) {
      for (const b of row.querySelectorAll(".edit-box button")) b.disabled = false;
      const moved = err instanceof ApiError && err.code === "transcript_changed";
      if (moved) await catchUp(this.app, sid); // the branch now current: the row may go
      if ((err instanceof ApiError && err.code === "session_rotated") || !row.isConnected) {
        // in the continuation's composer, or in its session's when the row went meanwhile
        this.app.refused(err, text, await asDrafts(files), sid);
      } else {
        // the text stays in the box
        this.app.notify(moved ? changed("Not sent", "your edit is still open.") : err.message);
      }
    } finally {
      delete row.dataset.saving;
      this.app.drafts.changed(); // sent: its stored draft goes; refused: it stays
    }
  }
}
