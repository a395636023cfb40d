// The conversation view: rows keyed by message id, blocks keyed by item id, each patched in
// place when its content changes. Untrusted text only ever goes through textContent; the only
// HTML inserted is sanitised Markdown (markdown.js).
import { buildRowActions, editsLeaving, updateRowActions } from "./branches.js";
import { activityParts, blocksFor } from "./blocks.js";
import { formatDuration, h, patchChildren } from "./dom.js";
import { ModelNames, shownFiles } from "./names.js";
import { buildBlock, TERMINAL_LABELS, updateBlock } from "./timeline_view.js";

// Rows whose answers render at once when history is drawn in one go: more than fill a window
// from the bottom, where a session opens.
const EAGER_ROWS = 40;

/** The settled head line, where the live one said "Working mm:ss": in the Worklog what the
 *  run did, then how it ended and how long it took ("Activity: 2 tools · Done in 14 s"); the
 *  row keeps its height when the run ends. */
function settledLine(row, mode) {
  const label = TERMINAL_LABELS[row.state] ?? "Done";
  const seconds = row.finished_at - row.created_at; // epoch seconds
  const took = seconds < 60 ? `${Math.max(1, Math.round(seconds))} s` : formatDuration(seconds);
  const ended = Number.isFinite(seconds) ? `${label} in ${took}` : label;
  const activity = mode === "worklog" ? activityParts(row.timeline || []) : "";
  return activity ? `Activity: ${activity} · ${ended}` : ended;
}

/** "Context compressed: 12,300 → 2,100 tokens": where the model's view of the session starts. */
function compressionMarkText(at) {
  const n = (v) => Number(v).toLocaleString("en");
  const tokens =
    at.tokens_before != null && at.tokens_after != null
      ? `: ${n(at.tokens_before)} → ${n(at.tokens_after)} tokens`
      : "";
  return `Context compressed${tokens}. The model sees the turns above only as a summary.`;
}

/** A row's element. One built settled is marked `history`: the browser may skip drawing it
 *  while out of view (transcript.css). A row that streamed here is not: it is in view when
 *  it settles, and skipping could give it, for a frame, a stand-in height that moves the
 *  reader's scroll position. */
function buildRow(row) {
  const el = buildRowElement(row);
  if (!row.live) el.classList.add("history");
  return el;
}

function buildRowElement(row) {
  if (row.role === "mark") {
    return h("div", { class: "divider context-mark", role: "separator" });
  }
  if (row.role === "user") {
    return h(
      "article",
      { class: "row user", "aria-label": "You" },
      h(
        "div",
        { class: "user-bubble" },
        h("div", { class: "user-text" }),
        h("div", { class: "user-attachments" }),
      ),
      copyMessageButton(),
      buildRowActions("user"),
    );
  }
  return h(
    "article",
    { class: "row assistant", "aria-label": "Assistant" },
    h(
      "div",
      { class: "assistant-head" },
      h("span", { class: "working" }),
      h("span", { class: "model", dir: "auto" }),
      copyMessageButton(),
      buildRowActions("assistant"),
    ),
    h("div", { class: "items" }),
  );
}

/** A message's Copy: its Markdown source (`content`), set on the row by `updateRow`. */
function copyMessageButton() {
  return h("button", {
    type: "button",
    "aria-label": "Copy",
    class: "btn copy-message",
    hidden: true,
  });
}

/** Whether `el` was last drawn from the same `inputs` (and notes them if not). Every write
 *  to a row costs the browser its style and layout, the same text written again included, so
 *  a render that redrew each row laid out a 1,200-row session whole for every live frame of
 *  a run in it: a settled row is drawn again only when it, or what it is drawn with, changed.
 *  The reducer hands out the same copy of a row while it is unchanged (`frameView`), so that
 *  is known without reading it; a new copy (a snapshot's) is compared by its text. */
function unchanged(el, inputs) {
  const last = el.drawnInputs;
  if (last && inputs.every((value, i) => value === last[i])) return true;
  el.drawnInputs = inputs;
  const drawn = JSON.stringify(inputs);
  if (el.drawnFrom === drawn) return true;
  el.drawnFrom = drawn;
  return false;
}

// Each row's spec for `patchChildren`, kept while the reducer hands out the same copy of the
// row (`frameView`): a frame of a run allocates nothing for the rows that did not change.
const specs = new WeakMap();

function specOf(row) {
  let spec = specs.get(row);
  if (spec === undefined) {
    spec = { ...row, key: row.id, source: row };
    specs.set(row, spec);
  }
  return spec;
}

function setCopySource(el, source) {
  el.copySource = source || "";
  el.querySelector(".copy-message").hidden = !source;
}

function updateUserRow(el, row) {
  // A turn another client of the agent wrote (its CLI): marked, so nobody wonders who sent it.
  el.classList.toggle("elsewhere", row.origin === "agent");
  el.title = row.origin === "agent" ? "Sent from another client of the agent (its CLI)" : "";
  el.setAttribute("aria-label", row.origin === "agent" ? "You, from another client" : "You");
  setCopySource(el, row.content);
  const sig = JSON.stringify([row.content, row.attachments]);
  if (el.dataset.sig === sig) return;
  el.dataset.sig = sig;
  el.querySelector(".user-text").textContent = row.content;
  const box = el.querySelector(".user-attachments");
  box.replaceChildren(
    ...shownFiles(row.attachments).map((a) =>
      /^image\/(png|jpeg|gif|webp)$/.test(a.mime)
        ? h(
            "a",
            { href: a.url, target: "_blank", rel: "noopener" },
            h("img", { src: a.url, alt: a.name, loading: "lazy" }),
          )
        : h("a", { class: "file-chip", dir: "auto", href: a.url, download: a.name, text: a.name }),
    ),
  );
}

/** A code block's Copy button puts its code on the clipboard, a message's its Markdown. */
async function copyCode(event) {
  const button = event.target.closest(".copy-code, .copy-message");
  if (!button) return;
  const message = button.classList.contains("copy-message");
  // a message's button shows its label from CSS, so the row's text stays the message's
  const say = message
    ? (label) => button.setAttribute("aria-label", label)
    : (label) => {
        button.textContent = label;
      };
  const code = message
    ? button.closest(".row").copySource
    : button.closest(".code-block").querySelector("code").textContent;
  try {
    await navigator.clipboard.writeText(code);
    say("Copied");
  } catch {
    say("Copy failed");
  }
  setTimeout(() => say("Copy"), 1500);
}

export class TranscriptView {
  constructor(root) {
    this.root = root;
    this.mode = "worklog";
    this.inheritedEl = h("div", {
      class: "inherited",
      role: "group",
      "aria-label": "Earlier session",
    });
    this.dividerEl = h("div", {
      class: "divider inherited-divider",
      role: "separator",
      text: "Continued from an earlier session",
    });
    this.excluded = new Map();
    this.compressedAt = null;
    this.names = new ModelNames(); // how an answer's model is named (setNames)
    this.onEditLost = null; // ({text, kept}): an edit whose row a render removed (main.js)
    this.rowsEl = h("div", { class: "rows" });
    root.append(this.inheritedEl, this.dividerEl, this.rowsEl);
    this.dividerEl.hidden = true;
    root.addEventListener("click", (event) => copyCode(event));
    this.followScroll(root);
  }

  /**
   * A reader at the bottom follows new output; one scrolled up stays where they are, and a
   * "Jump to latest" button appears while output arrives below. Content grows in renders and
   * in throttled Markdown renders alike, so a ResizeObserver on the rows decides.
   */
  followScroll(root) {
    this.following = true;
    this.jumpEl = h("button", {
      type: "button",
      class: "btn jump-latest",
      text: "Jump to latest",
      hidden: true,
      onclick: () => this.follow(),
    });
    root.append(h("div", { class: "jump-wrap" }, this.jumpEl));
    const atBottom = () => root.scrollHeight - root.scrollTop - root.clientHeight < 40;
    root.addEventListener("scroll", () => {
      this.following = atBottom();
      if (this.following) this.jumpEl.hidden = true;
    });
    let height = 0;
    new ResizeObserver(() => {
      const grew = this.rowsEl.offsetHeight > height;
      height = this.rowsEl.offsetHeight;
      if (this.following) root.scrollTop = root.scrollHeight;
      else if (grew && this.rowsEl.querySelector(".row.live")) this.jumpEl.hidden = false;
    }).observe(this.rowsEl);
  }

  /** Follow the end again (Jump to latest, or the reader sending a message): what comes
   *  next is shown as it arrives. */
  follow() {
    this.following = true;
    this.jumpEl.hidden = true;
    this.root.scrollTop = this.root.scrollHeight;
  }

  setMode(mode) {
    this.mode = mode;
  }

  /** The model-context layer's view (`GET /api/session/context`): excluded turns and where
   *  the last compression left the model's view, shown in settled history. */
  setContext(context) {
    this.excluded = new Map((context?.excluded ?? []).map((e) => [e.turn_id, e.reason]));
    this.compressedAt = context?.compressed_at ?? null;
  }

  clear() {
    this.following = true;
    this.jumpEl.hidden = true;
    this.rowsEl.replaceChildren();
    this.inheritedEl.replaceChildren();
    this.dividerEl.hidden = true;
  }

  /** Patch the DOM to show `view` (the reducer's view of one session). */
  render(view, inherited = []) {
    const toggled = this.running !== !!view.live;
    this.running = !!view.live; // Edit, Regenerate and switching wait for the run to end
    const rows = [];
    for (const m of view.messages) {
      if (this.compressedAt && m.role === "user" && m.turn_id === this.compressedAt.turn_id) {
        rows.push({ key: "context-mark", role: "mark", at: this.compressedAt });
      }
      rows.push(specOf(m));
    }
    if (rows.length && !view.live) rows[rows.length - 1] = { ...rows.at(-1), last: true };
    if (view.live) {
      rows.push({
        key: view.live.stream_id,
        id: view.live.stream_id,
        role: "assistant",
        live: view.live,
        timeline: view.live.timeline,
      });
    }
    const lost = editsLeaving(this.rowsEl, rows);
    // history drawn in one go (a session opened, a branch shown near its start): the answers
    // of its last EAGER_ROWS rows render at once, the ones above when the page is idle
    const built = rows.length - this.rowsEl.childElementCount;
    const laterBelow = built > EAGER_ROWS ? rows.length - EAGER_ROWS : 0;
    let index = 0;
    patchChildren(this.rowsEl, rows, buildRow, (el, row) =>
      this.updateRow(el, row, index++ < laterBelow),
    );
    for (const edit of lost) this.onEditLost?.(edit);
    const old = inherited.map((m) => ({ ...m, key: `inh:${m.session_id}:${m.id}`, source: m }));
    patchChildren(this.inheritedEl, old, buildRow, (el, row) => this.updateRow(el, row));
    this.dividerEl.hidden = old.length === 0;
    if (toggled) this.updateActions();
  }

  /** The endpoint's list was read (`ModelNames`): the answers name their models by it. Only
   *  the model line of each drawn row changes; the rows are not drawn again for it. */
  setNames(names) {
    this.names = names;
    for (const parent of [this.rowsEl, this.inheritedEl]) {
      for (const el of parent.children) {
        if (el.drawnInputs) this.drawModel(el, el.drawnInputs[0].model);
      }
    }
  }

  /** An answer's model (`run.started`), named as the pickers name it. */
  drawModel(el, model) {
    const line = el.querySelector(".model");
    const text = model ? this.names.label(model) : "";
    if (line && line.textContent !== text) line.textContent = text;
  }

  /** A run started or ended: the controls of every row change (they wait for the run), and
   *  nothing else of the rows not drawn again; redrawing each whole row for it cost a long
   *  session two full redraws per run. */
  updateActions() {
    for (const parent of [this.rowsEl, this.inheritedEl]) {
      for (const el of parent.children) {
        if (el.drawnInputs) updateRowActions(el, el.drawnInputs[0], { running: this.running });
      }
    }
  }

  updateRow(el, row, later = false) {
    if (row.role === "mark") {
      el.textContent = compressionMarkText(row.at);
      return;
    }
    // a turn the model no longer sees is marked, with the reason (contract invariant 1)
    const reason = this.excluded.get(row.turn_id);
    const inputs = [row.source, !!row.last, reason ?? null, this.mode];
    if (!row.live && unchanged(el, inputs)) return;
    el.classList.toggle("excluded", reason !== undefined);
    let note = el.querySelector(":scope > .excluded-note");
    if (reason !== undefined && row.role === "user") {
      if (!note) {
        note = h("div", { class: "excluded-note" });
        el.prepend(note);
      }
      note.textContent = `Not in the model's context. ${reason}`;
    } else note?.remove();
    updateRowActions(el, row, { running: this.running });
    if (row.role === "user") return updateUserRow(el, row);
    const live = !!row.live;
    el.classList.toggle("live", live);
    const working = el.querySelector(".working");
    if (live) {
      working.dataset.started = row.live.started_at;
      working.dataset.phase = row.live.phase;
      this.tickOne(working);
    } else {
      delete working.dataset.started;
      working.textContent = settledLine(row, this.mode);
    }
    // the model that answered (`run.started`), on the live and the settled row alike
    const model = live ? row.live.model : row.model;
    this.drawModel(el, model);
    setCopySource(el, live ? "" : row.content); // the answer, once it is settled
    const blocks = blocksFor(row, this.mode, live);
    patchChildren(el.querySelector(".items"), blocks, buildBlock, (child, block) =>
      updateBlock(child, block, live, !!row.last, later),
    );
  }

  /** Scroll to the row `rowId` (a search result) and mark it until another is revealed;
   *  false when the transcript has no such row. */
  reveal(rowId) {
    const el = [...this.rowsEl.children].find((row) => row.dataset.key === rowId);
    for (const old of this.rowsEl.querySelectorAll(".search-hit"))
      old.classList.remove("search-hit");
    if (!el) return false;
    for (const block of el.querySelectorAll(".markdown")) block._md?.showWaiting();
    this.following = false;
    el.classList.add("search-hit");
    el.setAttribute("tabindex", "-1");
    el.scrollIntoView({ block: "center" });
    el.focus({ preventScroll: true });
    return true;
  }

  /** The server is unreachable: the running turn says so and its timer stops. */
  setOffline(offline) {
    this.offline = offline;
    this.tick();
  }

  tickOne(working) {
    const elapsed = Date.now() / 1000 - Number(working.dataset.started);
    if (this.offline) working.textContent = "Server unreachable: reconnecting…";
    else if (working.dataset.phase === "cancelling") working.textContent = "Stopping…";
    else working.textContent = `Working ${formatDuration(elapsed)}`;
    working.classList.toggle("offline", !!this.offline);
  }

  /** Called every second: the live "Working mm:ss" timers. */
  tick() {
    for (const el of this.rowsEl.querySelectorAll(".working[data-started]")) this.tickOne(el);
  }
}
