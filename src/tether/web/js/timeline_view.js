// A row's timeline as blocks (text, thinking, tool cards, approvals, questions, how the run
// ended), each built once and patched in place when its item changes. Untrusted text only
// goes through textContent; the only HTML inserted is sanitised Markdown (markdown.js).
import { h, patchChildren } from "./dom.js";
import { MarkdownView } from "./markdown.js";

const LIVE_RENDER_MS = 100;
export const TERMINAL_LABELS = {
  cancelled: "Stopped",
  interrupted: "Interrupted",
  error: "Error",
  tool_limit_reached: "Tool limit reached",
  compression_exhausted: "Context full",
  length: "Cut off",
  content_filter: "Filtered",
};

/** Live text renders at most every LIVE_RENDER_MS (the tail only: markdown.js); settled text
 *  at once, or `later` when the page is idle. Always through the same renderer, so the
 *  settled render changes nothing. */
function setMarkdown(el, text, live, later = false) {
  el._md ??= new MarkdownView(el);
  el._pending = text;
  if (!live) {
    clearTimeout(el._renderTimer);
    el._renderTimer = null;
    // an answer still waiting to render stays waiting when its row is drawn again
    if (later || el._md.later !== null) el._md.showLater(text);
    else el._md.show(text);
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

export function buildBlock(block) {
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

export function updateBlock(el, block, live, last = false, later = false) {
  const item = block.item;
  switch (block.kind) {
    case "text":
      el.classList.toggle("interim", !!item.interim);
      setMarkdown(el, item.text, live, later);
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
      // The item id is `<stream_id>.approval.<approval_id>` (projections/run_items.py).
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
      // The item id is `<stream_id>.clarify.<question_id>` (projections/run_items.py).
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
