// The conversation view: rows keyed by message id, blocks keyed by item id, each patched in
// place when its content changes. Untrusted text only ever goes through textContent; the only
// HTML inserted is sanitised Markdown (markdown.js).
import { buildRowActions, editsLeaving, updateRowActions } from "./branches.js";
import { activityParts, blocksFor } from "./blocks.js";
import { formatDuration, h, patchChildren } from "./dom.js";
import { MarkdownView } from "./markdown.js";

const LIVE_RENDER_MS = 100;
const TERMINAL_LABELS = {
  cancelled: "Stopped",
  interrupted: "Interrupted",
  error: "Error",
  tool_limit_reached: "Tool limit reached",
  compression_exhausted: "Context full",
  length: "Cut off",
};

/** Live text renders at most every LIVE_RENDER_MS (the tail only: markdown.js); settled text
 *  at once. Either way through the same renderer, so the settled render changes nothing. */
function setMarkdown(el, text, live) {
  el._md ??= new MarkdownView(el);
  el._pending = text;
  if (!live) {
    clearTimeout(el._renderTimer);
    el._renderTimer = null;
    el._md.show(text);
    return;
  }
  if (el._renderTimer) return;
  const tick = () => {
    if (el._md.text === el._pending) {
      el._renderTimer = null;
      return;
    }
    el._md.show(el._pending);
    el._renderTimer = setTimeout(tick, LIVE_RENDER_MS);
  };
  tick();
}

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

function toolStatus(item) {
  if (!item.done) return "running";
  const took = item.duration_ms != null ? ` · ${item.duration_ms} ms` : "";
  return (item.is_error ? "failed" : "done") + took;
}

const APPROVAL_OUTCOMES = {
  user: "Denied.",
  timeout: "Denied: nobody answered in time.",
  stopped: "Denied: the run ended before an answer.",
};

/** Hermes Agent's answers (runtimes/base.py ApprovalDesk), in the order it offers them. */
const APPROVAL_CHOICES = {
  once: { label: "Allow once", kind: "approve", outcome: "Allowed once." },
  session: {
    label: "Allow for this session",
    kind: "approve",
    outcome: "Allowed for this session.",
  },
  always: { label: "Always allow", kind: "approve", outcome: "Always allowed." },
  deny: { label: "Deny", kind: "deny" },
};

function approvalOutcome(item, live) {
  const allowed = item.choice !== "deny" && APPROVAL_CHOICES[item.choice]?.outcome;
  if (allowed) return allowed;
  if (item.choice === "deny") return APPROVAL_OUTCOMES[item.reason] ?? "Denied.";
  return live ? "" : "Not answered.";
}

const CLARIFY_OUTCOMES = {
  timeout: "Nobody answered in time; the agent decides on its own.",
  stopped: "The run ended before an answer.",
};

function clarifyOutcome(item, live) {
  if (item.reason === "user") return `You answered: ${item.text}`;
  if (item.reason != null) return CLARIFY_OUTCOMES[item.reason] ?? "Not answered.";
  return live ? "" : "Not answered.";
}

function buildBlock(block) {
  switch (block.kind) {
    case "text":
      return h("div", { class: "item markdown" });
    case "reasoning":
      return h(
        "details",
        { class: "item thinking" },
        h("summary", { text: "Thinking" }),
        h("div", { class: "reasoning-text" }),
      );
    case "tool":
      return h(
        "details",
        { class: "item tool-card" },
        h("summary", {}, h("span", { class: "tool-name" }), h("span", { class: "tool-status" })),
        h(
          "div",
          { class: "tool-body" },
          h("h4", { text: "Arguments" }),
          h("pre", { class: "tool-args" }),
          h("h4", { text: "Result" }),
          h("pre", { class: "tool-result" }),
        ),
      );
    case "compression":
      return h("div", { class: "item divider", role: "separator" });
    case "steer":
      return h(
        "div",
        { class: "item steer" },
        h("span", { class: "steer-label" }),
        h("span", { class: "steer-text" }),
      );
    case "approval":
      return h(
        "div",
        { class: "item approval", role: "group", "aria-label": "Approval" },
        h(
          "div",
          { class: "approval-question" },
          h("strong", { text: "The agent asks to run this: " }),
          h("span", { class: "approval-description" }),
        ),
        h("pre", { class: "approval-command" }),
        h("div", { class: "approval-actions" }),
        h("div", { class: "approval-outcome", role: "status" }),
      );
    case "clarify":
      return h(
        "div",
        { class: "item clarify", role: "group", "aria-label": "Question" },
        h(
          "div",
          { class: "clarify-question" },
          h("strong", { text: "The agent asks: " }),
          h("span", { class: "clarify-text" }),
        ),
        h(
          "form",
          { class: "clarify-actions" },
          h("div", { class: "clarify-choices" }),
          h("input", { class: "clarify-input", type: "text", "aria-label": "Your answer" }),
          h("button", { type: "submit", class: "btn approve", text: "Answer" }),
        ),
        h("div", { class: "clarify-outcome", role: "status" }),
      );
    case "notice":
      return h(
        "div",
        { class: "item terminal", role: "status" },
        h("span", { class: "terminal-text" }),
        h("button", { type: "button", class: "btn continue", text: "Continue", hidden: true }),
      );
    case "activity":
      return h(
        "details",
        { class: "item activity" },
        h("summary"),
        h("div", { class: "activity-items" }),
      );
    default:
      return h("div", { class: "item" });
  }
}

function updateBlock(el, block, live, last = false) {
  const item = block.item;
  switch (block.kind) {
    case "text":
      el.classList.toggle("interim", !!item.interim);
      setMarkdown(el, item.text, live);
      break;
    case "reasoning":
      // live thinking is open to read; it folds away when the run settles
      if (el.dataset.live === "1" && !live) el.open = false;
      if (el.dataset.live === undefined) el.open = live;
      el.dataset.live = live ? "1" : "0";
      el.querySelector(".reasoning-text").textContent = item.text;
      break;
    case "tool": {
      el.classList.toggle("running", !item.done);
      el.classList.toggle("error", !!item.is_error);
      el.querySelector(".tool-name").textContent = item.name;
      el.querySelector(".tool-status").textContent = toolStatus(item);
      el.querySelector(".tool-args").textContent = JSON.stringify(item.args ?? {}, null, 2);
      const result = item.result ?? item.result_preview;
      el.querySelector(".tool-result").textContent = item.done ? (result ?? "") : "…";
      break;
    }
    case "compression":
      el.textContent = block.label;
      break;
    case "steer":
      el.classList.toggle("leftover", !!item.leftover);
      el.querySelector(".steer-label").textContent = item.leftover
        ? "Not delivered (back in the composer): "
        : "You steered: ";
      el.querySelector(".steer-text").textContent = item.text;
      break;
    case "approval": {
      // The item id is `<stream_id>.approval.<approval_id>` (projections/transcript.py).
      const actions = el.querySelector(".approval-actions");
      actions.dataset.stream = item.id.slice(0, item.id.lastIndexOf(".approval."));
      actions.dataset.approval = item.approval_id;
      const offered = item.choices.filter((choice) => choice in APPROVAL_CHOICES);
      if (actions.dataset.choices !== offered.join(" ")) {
        actions.dataset.choices = offered.join(" ");
        actions.replaceChildren(
          ...offered.map((choice) =>
            h("button", {
              type: "button",
              class: `btn ${APPROVAL_CHOICES[choice].kind}`,
              text: APPROVAL_CHOICES[choice].label,
              dataset: { choice },
            }),
          ),
        );
      }
      actions.hidden = !(live && item.choice == null);
      el.classList.toggle("pending", live && item.choice == null);
      el.querySelector(".approval-description").textContent = item.description;
      el.querySelector(".approval-command").textContent = item.command;
      el.querySelector(".approval-outcome").textContent = approvalOutcome(item, live);
      break;
    }
    case "clarify": {
      // The item id is `<stream_id>.clarify.<question_id>` (projections/transcript.py).
      const form = el.querySelector(".clarify-actions");
      form.dataset.stream = item.id.slice(0, item.id.lastIndexOf(".clarify."));
      form.dataset.question = item.question_id;
      const open = live && item.reason == null;
      form.hidden = !open;
      el.classList.toggle("pending", open);
      el.querySelector(".clarify-text").textContent = item.question;
      const choices = el.querySelector(".clarify-choices");
      if (choices.dataset.choices !== JSON.stringify(item.choices)) {
        choices.dataset.choices = JSON.stringify(item.choices);
        choices.replaceChildren(
          ...item.choices.map((choice) =>
            h("button", {
              type: "button",
              class: "btn",
              text: choice,
              dataset: { answer: choice },
            }),
          ),
        );
      }
      el.querySelector(".clarify-outcome").textContent = clarifyOutcome(item, live);
      break;
    }
    case "notice":
      el.className = `item terminal ${item.kind}`;
      el.querySelector(".terminal-text").textContent = item.text;
      el.setAttribute("aria-label", `${TERMINAL_LABELS[item.kind] || "Ended"}: ${item.text}`);
      // An answer cut off at the token limit can be continued, from the latest row only.
      el.querySelector(".continue").hidden = !(item.kind === "length" && last);
      break;
    case "activity": {
      el.querySelector("summary").textContent = block.summary;
      if (el.dataset.live === "1" && !live) el.open = false; // settled: one line
      if (el.dataset.live === undefined) el.open = live;
      el.dataset.live = live ? "1" : "0";
      patchChildren(el.querySelector(".activity-items"), block.children, buildBlock, (child, b) =>
        updateBlock(child, b, live, last),
      );
      break;
    }
    default:
      break;
  }
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
 *  a run in it: a settled row is drawn again only when it, or what it is drawn with, changed. */
function unchanged(el, inputs) {
  const drawn = JSON.stringify(inputs);
  if (el.drawnFrom === drawn) return true;
  el.drawnFrom = drawn;
  return false;
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
    ...(row.attachments || []).map((a) =>
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
      onclick: () => {
        this.following = true;
        this.jumpEl.hidden = true;
        root.scrollTop = root.scrollHeight;
      },
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
    this.running = !!view.live; // Edit, Regenerate and switching wait for the run to end
    const rows = [];
    for (const m of view.messages) {
      if (this.compressedAt && m.role === "user" && m.turn_id === this.compressedAt.turn_id) {
        rows.push({ key: "context-mark", role: "mark", at: this.compressedAt });
      }
      rows.push({ ...m, key: m.id });
    }
    if (rows.length && !view.live) rows[rows.length - 1].last = true;
    if (view.live) {
      rows.push({
        key: view.live.stream_id,
        id: view.live.stream_id,
        role: "assistant",
        live: view.live,
        timeline: view.live.timeline,
      });
    }
    const lost = editsLeaving(this.rowsEl, new Set(rows.map((row) => row.key)));
    patchChildren(this.rowsEl, rows, buildRow, (el, row) => this.updateRow(el, row));
    for (const edit of lost) this.onEditLost?.(edit);
    const old = inherited.map((m) => ({ ...m, key: `inh:${m.session_id}:${m.id}` }));
    patchChildren(this.inheritedEl, old, buildRow, (el, row) => this.updateRow(el, row));
    this.dividerEl.hidden = old.length === 0;
  }

  updateRow(el, row) {
    if (row.role === "mark") {
      el.textContent = compressionMarkText(row.at);
      return;
    }
    // a turn the model no longer sees is marked, with the reason (contract invariant 1)
    const reason = this.excluded.get(row.turn_id);
    if (!row.live && unchanged(el, [row, reason ?? null, this.running, this.mode])) return;
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
    el.querySelector(".model").textContent = (live ? row.live.model : row.model) || "";
    setCopySource(el, live ? "" : row.content); // the answer, once it is settled
    const blocks = blocksFor(row, this.mode, live);
    patchChildren(el.querySelector(".items"), blocks, buildBlock, (child, block) =>
      updateBlock(child, block, live, !!row.last),
    );
  }

  /** Scroll to the row `rowId` (a search result) and mark it until another is revealed;
   *  false when the transcript has no such row. */
  reveal(rowId) {
    const el = [...this.rowsEl.children].find((row) => row.dataset.key === rowId);
    for (const old of this.rowsEl.querySelectorAll(".search-hit"))
      old.classList.remove("search-hit");
    if (!el) return false;
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
