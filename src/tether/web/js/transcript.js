// The conversation view: rows keyed by message id, blocks keyed by item id, each patched in
// place when its content changes. Untrusted text only ever goes through textContent; the only
// HTML inserted is the server's sanitized Markdown.
import { blocksFor } from "./blocks.js";
import { formatDuration, h, patchChildren } from "./dom.js";
import { cachedHtml, renderMarkdown } from "./markdown.js";

const LIVE_RENDER_MS = 200;
const TERMINAL_LABELS = {
  cancelled: "Stopped",
  interrupted: "Interrupted",
  error: "Error",
  tool_limit_reached: "Tool limit reached",
  compression_exhausted: "Context full",
};

function setMarkdown(el, text, live) {
  if (el._text === text) return;
  el._text = text;
  const html = cachedHtml(text);
  if (html != null) {
    el.classList.remove("plain");
    el.innerHTML = html;
    return;
  }
  if (!el._rendered) {
    // show the words at once; formatting follows
    el.classList.add("plain");
    el.textContent = text;
  }
  clearTimeout(el._renderTimer);
  el._renderTimer = setTimeout(
    () => {
      renderMarkdown(text).then((rendered) => {
        if (el._text !== text) return;
        if (rendered == null) {
          el.classList.add("plain");
          el.textContent = text;
          return;
        }
        el.classList.remove("plain");
        el._rendered = true;
        el.innerHTML = rendered;
      });
    },
    live ? LIVE_RENDER_MS : 0,
  );
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
      return h("div", { class: "item terminal", role: "status" });
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

function updateBlock(el, block, live) {
  const item = block.item;
  switch (block.kind) {
    case "text":
      el.classList.toggle("interim", !!item.interim);
      setMarkdown(el, item.text, live);
      break;
    case "reasoning":
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
      el.textContent = item.text;
      el.setAttribute("aria-label", `${TERMINAL_LABELS[item.kind] || "Ended"}: ${item.text}`);
      break;
    case "activity": {
      el.querySelector("summary").textContent = block.summary;
      if (el.dataset.live === "1" && !live) el.open = false; // settled: one line
      if (el.dataset.live === undefined) el.open = live;
      el.dataset.live = live ? "1" : "0";
      patchChildren(el.querySelector(".activity-items"), block.children, buildBlock, (child, b) =>
        updateBlock(child, b, live),
      );
      break;
    }
    default:
      break;
  }
}

function buildRow(row) {
  if (row.role === "user") {
    return h(
      "div",
      { class: "row user" },
      h(
        "div",
        { class: "user-bubble" },
        h("div", { class: "user-text" }),
        h("div", { class: "user-attachments" }),
      ),
    );
  }
  return h(
    "div",
    { class: "row assistant" },
    h(
      "div",
      { class: "assistant-head" },
      h("span", { class: "working" }),
      h("span", { class: "model" }),
    ),
    h("div", { class: "items" }),
  );
}

function updateUserRow(el, row) {
  // A turn another client of the agent wrote (its CLI): marked, so nobody wonders who sent it.
  el.classList.toggle("elsewhere", row.origin === "agent");
  el.title = row.origin === "agent" ? "Sent from another client of the agent (its CLI)" : "";
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
        : h("a", { class: "file-chip", href: a.url, download: a.name, text: a.name }),
    ),
  );
}

export class TranscriptView {
  constructor(root) {
    this.root = root;
    this.mode = "worklog";
    this.inheritedEl = h("div", { class: "inherited", "aria-label": "Earlier session" });
    this.dividerEl = h("div", {
      class: "divider inherited-divider",
      role: "separator",
      text: "Continued from an earlier session",
    });
    this.rowsEl = h("div", { class: "rows" });
    root.append(this.inheritedEl, this.dividerEl, this.rowsEl);
    this.dividerEl.hidden = true;
  }

  setMode(mode) {
    this.mode = mode;
  }

  clear() {
    this.rowsEl.replaceChildren();
    this.inheritedEl.replaceChildren();
    this.dividerEl.hidden = true;
  }

  /** Patch the DOM to show `view` (the reducer's view of one session). */
  render(view, inherited = []) {
    const nearBottom = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 80;
    const rows = view.messages.map((m) => ({ ...m, key: m.id }));
    if (view.live) {
      rows.push({
        key: view.live.stream_id,
        id: view.live.stream_id,
        role: "assistant",
        live: view.live,
        timeline: view.live.timeline,
      });
    }
    patchChildren(this.rowsEl, rows, buildRow, (el, row) => this.updateRow(el, row));
    const old = inherited.map((m) => ({ ...m, key: `inh:${m.session_id}:${m.id}` }));
    patchChildren(this.inheritedEl, old, buildRow, (el, row) => this.updateRow(el, row));
    this.dividerEl.hidden = old.length === 0;
    if (nearBottom) this.root.scrollTop = this.root.scrollHeight;
  }

  updateRow(el, row) {
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
      working.textContent = "";
    }
    el.querySelector(".model").textContent = live && row.live.model ? row.live.model : "";
    const blocks = blocksFor(row, this.mode, live);
    patchChildren(el.querySelector(".items"), blocks, buildBlock, (child, block) =>
      updateBlock(child, block, live),
    );
  }

  tickOne(working) {
    const elapsed = Date.now() / 1000 - Number(working.dataset.started);
    working.textContent =
      working.dataset.phase === "cancelling" ? "Stopping…" : `Working ${formatDuration(elapsed)}`;
  }

  /** Called every second: the live "Working mm:ss" timers. */
  tick() {
    for (const el of this.rowsEl.querySelectorAll(".working[data-started]")) this.tickOne(el);
  }
}
