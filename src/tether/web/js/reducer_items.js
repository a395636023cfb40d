// The page reducer's folds of a run's timeline items (docs/architecture.md §4): text and
// reasoning deltas, tools, compression passes, approval prompts, clarify questions and
// steers, and the timeline of a turn another client of the agent wrote; with the helpers that
// read JSON the way the Python fold does (`tether/projections/run_items.py`). reducer.js
// folds the session around them (turns, runs, the queue, snapshots) and owns `view()`. Like
// it, this module is a pure fold: no DOM, no other import.

const BARRIERS = new Set(["tool", "compression", "steer"]);
// A steer that was never delivered is no barrier: the agent never saw it.
const isBarrier = (item) => BARRIERS.has(item.type) && !truthy(get(item, "leftover"));

export const has = (obj, key) => obj !== null && typeof obj === "object" && Object.hasOwn(obj, key);
// Python's `dict.get(key, default)`: a present null stays null.
export const get = (obj, key, fallback = null) => (has(obj, key) ? obj[key] : fallback);

function strings(values) {
  return Array.isArray(values) ? values.filter((v) => typeof v === "string") : [];
}

/** An approval prompt's answers; one recorded before choices existed offered two. */
function offered(choices) {
  const list = strings(choices);
  return list.length > 0 ? list : ["once", "deny"];
}

export function truthy(value) {
  // Python truthiness of a JSON value
  if (Array.isArray(value)) return value.length > 0;
  if (value !== null && typeof value === "object") return Object.keys(value).length > 0;
  return Boolean(value);
}

export function pyStr(value) {
  // what an f-string shows for a JSON scalar
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

// Python's `text[:length]` counts code points, not UTF-16 units.
function pySlice(text, length) {
  if (length === null || length === undefined || typeof text !== "string") return text;
  if (!/[\uD800-\uDFFF]/.test(text)) return text.slice(0, length);
  return Array.from(text).slice(0, length).join("");
}

/** Mark `obj` changed: a view's copy of it is made again (reducer.js `frameView`). */
export function touch(state, obj) {
  obj.rev = ++state.clock;
  return obj;
}

// Text that a tool, compression or steer item follows is interim progress; the trailing text
// is the answer. Kept on the stored items so a flip bumps the item's rev.
export function markInterim(state, items) {
  let last = -1;
  items.forEach((item, index) => {
    if (isBarrier(item)) last = index;
  });
  items.forEach((item, index) => {
    if (item.type !== "text") return;
    const interim = index < last;
    if (item.interim !== interim) {
      item.interim = interim;
      touch(state, item);
    }
  });
}

export function sceneOf(state, env) {
  return state.active.get(env.stream_id || get(env.data, "stream_id", ""));
}

// RunScene.item: the item with this id, created from `make` when absent.
function ensureItem(state, scene, id, make) {
  let item = scene.byId.get(id);
  if (item === undefined) {
    item = touch(state, { id, ...make });
    scene.items.push(item);
    scene.byId.set(id, item);
    markInterim(state, scene.items);
  }
  return item;
}

/** The folds of item events, by event type; reducer.js adds the session's own. */
export const ITEM_FOLDS = new Map();
const on = (types, fold) => {
  for (const type of types) ITEM_FOLDS.set(type, fold);
};

on(["reasoning.delta", "text.delta"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  const type = env.type === "reasoning.delta" ? "reasoning" : "text";
  const item = ensureItem(state, scene, `${scene.stream_id}.${data.item_id}`, { type, text: "" });
  item.text = (item.text ?? "") + (get(data, "text", "") ?? "");
  touch(state, item);
});

on(["tool.started"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  ensureItem(state, scene, `${scene.stream_id}.tool.${data.call_id}`, {
    type: "tool",
    call_id: data.call_id,
    name: get(data, "name", ""),
    args: get(data, "args"),
    result_preview: null,
    is_error: false,
    duration_ms: null,
    done: false,
  });
});

on(["tool.completed"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  const item = ensureItem(state, scene, `${scene.stream_id}.tool.${data.call_id}`, {
    type: "tool",
    call_id: data.call_id,
    name: get(data, "name", ""),
    args: null,
  });
  Object.assign(item, {
    result_preview: get(data, "result_preview"),
    result: get(data, "result"),
    is_error: truthy(get(data, "is_error")),
    duration_ms: get(data, "duration_ms"),
    done: true,
  });
  touch(state, item);
});

on(["compression.started", "compression.completed"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  const item = ensureItem(state, scene, `${scene.stream_id}.compression.${data.pass_id}`, {
    type: "compression",
    pass_id: data.pass_id,
    done: false,
  });
  if (env.type === "compression.completed") {
    Object.assign(item, {
      done: true,
      tokens_before: get(data, "tokens_before"),
      tokens_after: get(data, "tokens_after"),
    });
    touch(state, item);
  }
});

on(["approval.requested", "approval.resolved"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  const asked = env.type === "approval.requested" ? data : {}; // an answer asks nothing
  const item = ensureItem(state, scene, `${scene.stream_id}.approval.${data.approval_id}`, {
    type: "approval",
    approval_id: data.approval_id,
    command: get(asked, "command", ""),
    description: get(asked, "description", ""),
    choices: offered(get(asked, "choices")),
    choice: null,
    reason: null,
  });
  if (env.type === "approval.resolved") {
    Object.assign(item, { choice: get(data, "choice"), reason: get(data, "reason") });
    touch(state, item);
  }
});

on(["clarify.requested", "clarify.resolved"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  const asked = env.type === "clarify.requested" ? data : {}; // an answer asks nothing
  const item = ensureItem(state, scene, `${scene.stream_id}.clarify.${data.question_id}`, {
    type: "clarify",
    question_id: data.question_id,
    question: get(asked, "question", ""),
    choices: strings(get(asked, "choices")),
    text: null,
    reason: null,
  });
  if (env.type === "clarify.resolved") {
    Object.assign(item, { text: get(data, "text"), reason: get(data, "reason") });
    touch(state, item);
  }
});

on(["reasoning.trimmed"], (state, env, data) => {
  const scene = sceneOf(state, env);
  const item = scene?.byId.get(`${scene.stream_id}.${data.item_id}`);
  if (item === undefined) return;
  item.text = pySlice(item.text, data.length);
  touch(state, item);
});

// Accepted steers wait beside the timeline until the agent takes them in (delivered: a steer
// item where it did) or the run ends without it (leftover: an item that is no barrier).
on(["steer.accepted"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  scene.pendingSteers.set(data.steer_id, get(data, "text", ""));
  touch(state, scene);
});

on(["steer.delivered", "steer.leftover"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  const leftover = env.type === "steer.leftover";
  for (const steerId of get(data, "steer_ids", []) ?? [])
    settleSteer(state, scene, steerId, leftover);
});

export function settleSteer(state, scene, steerId, leftover) {
  if (!scene.pendingSteers.has(steerId)) return;
  const text = scene.pendingSteers.get(steerId);
  scene.pendingSteers.delete(steerId);
  touch(state, scene);
  if (text !== null && text !== undefined) {
    ensureItem(state, scene, `${scene.stream_id}.steer.${steerId}`, {
      type: "steer",
      text,
      leftover,
    });
  }
}

// Turns another client of the agent wrote (`agent.imported`): shown like settled runs; the
// model-facing half and compactions are the server's business
// (tether/projections/agent_rows.py mirrors this).
function jsonOr(raw) {
  if (typeof raw !== "string") return raw;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

export function importedTimeline(state, rows, turnId) {
  const items = [];
  const tools = new Map();
  for (const row of rows) {
    const key = `${turnId}.${pyStr(row.row_id)}`;
    if (row.role === "assistant") {
      if (truthy(get(row, "reasoning"))) {
        items.push({ id: `${key}.r`, type: "reasoning", text: row.reasoning });
      }
      if (truthy(get(row, "content")))
        items.push({ id: `${key}.t`, type: "text", text: row.content });
      for (const call of get(row, "tool_calls") ?? []) {
        const item = {
          id: `${turnId}.tool.${pyStr(call.id)}`,
          type: "tool",
          call_id: call.id,
          name: get(call, "name", ""),
          args: jsonOr(get(call, "arguments")),
          result_preview: null,
          is_error: false,
          duration_ms: null,
          done: false,
        };
        tools.set(call.id, item);
        items.push(item);
      }
    } else if (row.role === "tool") {
      const item = tools.get(get(row, "tool_call_id") || "");
      if (item === undefined) continue;
      const result = get(row, "content") || "";
      Object.assign(item, { result, result_preview: pySlice(result, 500), done: true });
    }
  }
  for (const item of items) touch(state, item);
  markInterim(state, items);
  return items;
}
