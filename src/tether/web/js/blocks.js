// One scene, three display modes (issue 5, contract §"Current implementation relationship"):
// a row's timeline becomes a list of keyed blocks. Transparent Stream shows every item in
// order; Compact Worklog keeps text (interim progress included) visible and groups the
// activity between texts, collapsed to one line once the turn settles; Final answer only
// shows the answer and how the run ended.

const ACTIVITY = new Set(["reasoning", "tool"]);

export function compressionLabel(item, later) {
  // Later tool, reasoning or text items prove the barrier passed (contract invariant 6).
  const passed = later.some((i) => ["tool", "reasoning", "text"].includes(i.type));
  return item.done || passed ? "Context auto-compressed" : "Compressing context";
}

function itemBlock(item, index, items) {
  switch (item.type) {
    case "compression":
      return {
        key: item.id,
        kind: "compression",
        label: compressionLabel(item, items.slice(index + 1)),
      };
    default:
      return { key: item.id, kind: item.type, item };
  }
}

/** What some activity amounts to: "Thought · 2 tools · 1 failed" ("" for none). */
export function activityParts(items) {
  const tools = items.filter((i) => i.type === "tool").length;
  const thought = items.some((i) => i.type === "reasoning");
  const parts = [];
  if (thought) parts.push("Thought");
  if (tools) parts.push(`${tools} tool${tools === 1 ? "" : "s"}`);
  const errors = items.filter((i) => i.type === "tool" && i.is_error).length;
  if (errors) parts.push(`${errors} failed`);
  return parts.join(" · ");
}

export function activitySummary(items, live) {
  const running = items.some((i) => i.type === "tool" && !i.done);
  return (live && running ? "Working… " : "") + (activityParts(items) || "Activity");
}

/** The blocks of one assistant row (`live` true while its run is active). */
export function blocksFor(row, mode, live) {
  const items = row.timeline || [];
  if (mode === "final") {
    return items.flatMap((item, index) => {
      if (item.type === "text" && !item.interim) return [itemBlock(item, index, items)];
      if (item.type === "notice") return [itemBlock(item, index, items)];
      if (item.type === "approval" && live && item.choice == null) {
        return [itemBlock(item, index, items)]; // a question waits for the user
      }
      if (item.type === "clarify" && live && item.reason == null) {
        return [itemBlock(item, index, items)];
      }
      return [];
    });
  }
  if (mode === "stream") return items.map((item, index) => itemBlock(item, index, items));
  const blocks = [];
  let group = null;
  items.forEach((item, index) => {
    if (ACTIVITY.has(item.type)) {
      if (!group) {
        group = { key: `${item.id}.activity`, kind: "activity", items: [], live };
        blocks.push(group);
      }
      group.items.push(item);
      return;
    }
    group = null;
    blocks.push(itemBlock(item, index, items));
  });
  for (const block of blocks) {
    if (block.kind === "activity") {
      block.summary = activitySummary(block.items, live);
      block.children = block.items.map((item) => itemBlock(item, 0, []));
    }
  }
  return blocks;
}
