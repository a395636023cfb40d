// One reducer per session over `(seq, event)` (docs/architecture.md §4): live, replayed and
// snapshot-hydrated events take the same path. It mirrors the server's pure fold,
// `tether/projections/transcript.py` (TranscriptFold), so `view(state)` equals the Python
// `TranscriptFold.view()` for the same events (tests/browser/test_reducer_equivalence.py).
//
// Every row, timeline item, queued entry and live scene carries `rev`, set from a per-state
// clock that only grows (also across snapshots) whenever it changes: `frameView()`, what the
// page draws each frame, copies a row again only when its `rev` moved, so a live frame's
// cost does not grow with the session's length. `view()` never contains `rev`.
//
// The folds of timeline items (text, tools, approvals, clarify questions, steers...) are in
// reducer_items.js, and the tree of branches (edit, regenerate, switch) in
// reducer_branches.js: the only modules this one imports.

import { append, createTree, cut, restore, show, snapshot } from "./reducer_branches.js";
import {
  get,
  has,
  ITEM_FOLDS,
  importedTimeline,
  markInterim,
  pyStr,
  sceneOf,
  settleSteer,
  touch,
  truthy,
} from "./reducer_items.js";

function setKey(obj, key, value) {
  if (key === "__proto__") {
    Object.defineProperty(obj, key, {
      value,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  } else {
    obj[key] = value;
  }
}

function clone(value) {
  if (Array.isArray(value)) return value.map(clone);
  if (value === null || typeof value !== "object") return value;
  const out = {};
  for (const key of Object.keys(value)) setKey(out, key, clone(value[key]));
  return out;
}

function bare(obj) {
  // a fresh copy without the bookkeeping `rev`
  const out = {};
  for (const key of Object.keys(obj)) if (key !== "rev") setKey(out, key, clone(obj[key]));
  return out;
}

function copyRow(row) {
  const out = bare(row);
  if (Array.isArray(row.timeline)) out.timeline = row.timeline.map(bare);
  return out;
}

// Downloaded through the session that holds the upload (projections/transcript.py).
function attachments(list, sessionId) {
  return (truthy(list) ? list : []).map((a) => ({
    ...a,
    url: `/api/attachments/${pyStr(a.id)}?session_id=${pyStr(sessionId)}`,
  }));
}

// A completed answer the provider ended early, by its finish_reason (as FINISH_NOTICES in
// projections/transcript.py): the notice's kind is that reason (`length`: the page offers
// Continue).
const FINISH_NOTICES = new Map([
  ["length", "Cut off at the token limit: the answer may be incomplete."],
  ["content_filter", "Stopped by the provider's content filter: the answer may be incomplete."],
]);
const finishNotice = (state, data) => {
  const reason = get(data, "finish_reason");
  return state === "completed" && FINISH_NOTICES.has(reason) ? reason : null;
};

export function noticeText(state, data) {
  const error = truthy(get(data, "error")) ? data.error : {};
  const reason = get(data, "reason");
  switch (state) {
    case "completed": {
      const finish = finishNotice(state, data);
      return finish === null ? null : FINISH_NOTICES.get(finish);
    }
    case "cancelled":
      return truthy(reason) ? `Stopped: ${pyStr(reason)}` : "Stopped.";
    case "interrupted":
      return `Interrupted: ${
        truthy(reason) ? pyStr(reason) : "the run ended before it could finish"
      }.`;
    case "error":
      return (
        `Error (${pyStr(get(error, "code", "internal"))}): ` +
        pyStr(get(error, "message", "unknown error"))
      );
    case "tool_limit_reached":
      return "Stopped: the run reached its tool-call limit before it could answer.";
    case "compression_exhausted":
      return (
        "Stopped: the conversation no longer fits the model's context window, " +
        "even after compression."
      );
    default:
      return `Ended: ${pyStr(state)}`;
  }
}

export function createSession(sessionId) {
  const messages = []; // rows, in transcript order: the branch shown
  return {
    sessionId,
    lastSeq: 0,
    clock: 0, // source of every `rev`; never goes back
    messages,
    tree: createTree(messages), // every branch (docs/api.md §10)
    active: new Map(), // stream_id -> scene {stream_id, turn_id, started_at, phase, ..., items}
    users: new Map(), // turn_id -> user row (or the snapshot's pending turn)
    queued: new Map(), // queue_id -> entry
  };
}

function newScene(state, streamId, turnId, startedAt) {
  const scene = {
    stream_id: streamId,
    turn_id: turnId,
    started_at: startedAt,
    phase: "starting",
    runtime: null,
    model: null,
    items: [],
    byId: new Map(),
    pendingSteers: new Map(),
  };
  return touch(state, scene);
}

/** Show `row` after the visible tail (its hidden siblings are labelled when shown). */
function appendRow(state, row) {
  append(state.tree, row);
  touch(state, row);
}

const HANDLERS = new Map(ITEM_FOLDS); // the item folds live in reducer_items.js
const on = (types, handler) => {
  for (const type of types) HANDLERS.set(type, handler);
};

on(["turn.submitted"], (state, env, data) => {
  const at = get(data, "submitted_at", env.at);
  if (truthy(get(data, "regenerate"))) {
    // a new answer to a turn already shown: no new user row
    state.active.set(data.stream_id, newScene(state, data.stream_id, data.turn_id, at));
    return;
  }
  const row = {
    id: data.turn_id,
    role: "user",
    turn_id: data.turn_id,
    created_at: at,
    content: get(data, "text", ""),
    attachments: attachments(get(data, "attachments"), env.session_id),
  };
  appendRow(state, row);
  state.users.set(data.turn_id, row);
  state.active.set(data.stream_id, newScene(state, data.stream_id, data.turn_id, at));
});

on(["run.started"], (state, env, data) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  if (scene.phase === "starting") scene.phase = "running";
  scene.runtime = get(data, "runtime");
  scene.model = get(data, "model");
  touch(state, scene);
});

on(["queue.added", "queue.updated", "queue.removed"], (state, env, data) => {
  const id = data.queue_id;
  if (env.type === "queue.added") {
    state.queued.set(
      id,
      touch(state, {
        queue_id: id,
        text: get(data, "text", ""),
        attachments: attachments(get(data, "attachments"), env.session_id),
        created_at: env.at,
      }),
    );
  } else if (env.type === "queue.updated" && state.queued.has(id)) {
    touch(state, Object.assign(state.queued.get(id), { text: get(data, "text", "") }));
  } else if (env.type === "queue.removed") {
    state.queued.delete(id);
  }
});

on(["run.cancel_requested"], (state, env) => {
  const scene = sceneOf(state, env);
  if (scene === undefined) return;
  scene.phase = "cancelling";
  touch(state, scene);
});

on(["run.finished"], (state, env, data) => {
  const key = env.stream_id || get(data, "stream_id", "");
  const scene = state.active.get(key);
  if (scene === undefined) return;
  state.active.delete(key);
  // A steer still waiting when the run ends was never seen by the agent (one recorded through
  // another replica as the run ended has no steer.leftover): it shows as left over.
  for (const steerId of [...scene.pendingSteers.keys()]) settleSteer(state, scene, steerId, true);
  const runState = get(data, "state", "completed");
  // Invariant 6: the compression divider is live-only unless it explains the ending.
  const items = scene.items.filter(
    (item) => item.type !== "compression" || runState === "compression_exhausted",
  );
  const text = noticeText(runState, data);
  const kind = finishNotice(runState, data) ?? runState;
  if (text !== null) {
    items.push(touch(state, { id: `${scene.stream_id}.notice`, type: "notice", kind, text }));
  }
  markInterim(state, items);
  const row = {
    id: scene.stream_id,
    role: "assistant",
    turn_id: scene.turn_id,
    created_at: scene.started_at,
    finished_at: env.at,
    content: items
      .filter((item) => item.type === "text" && !item.interim)
      .map((item) => item.text)
      .join(""),
    state: runState,
    stream_id: scene.stream_id,
    timeline: items,
  };
  if (truthy(scene.model)) row.model = scene.model; // the model that answered (run.started)
  if (truthy(get(data, "error"))) row.error = { ...data.error };
  if (truthy(get(data, "usage"))) row.usage = { ...data.usage }; // the context meter's source
  if (truthy(get(data, "finish_reason"))) row.finish_reason = data.finish_reason;
  appendRow(state, row);
});

// The rows hidden stay in the tree, as a branch beside what comes next.
on(["transcript.truncated"], (state, _env, data) => {
  cut(state.tree, data.keep_count);
});

on(["branch.switched"], (state, _env, data) => {
  const [, shown] = show(state.tree, get(data, "row_id"));
  for (const row of shown) touch(state, row); // relabelled: "‹ 2/3 ›"
});

on(["agent.imported"], (state, _env, data) => {
  for (const entry of get(data, "entries") ?? []) {
    const rows = get(entry, "rows") ?? [];
    if (get(entry, "kind") !== "turn" || rows.length === 0) continue;
    const turnId = entry.turn_id;
    const user = rows[0].role === "user" ? rows[0] : null;
    if (user !== null) {
      const count = get(user, "images", 0);
      const note = truthy(count)
        ? `\n\n[${count} ${count === 1 ? "image" : "images"} ` +
          "sent from another client; not stored in Tether]"
        : "";
      appendRow(state, {
        id: turnId,
        role: "user",
        turn_id: turnId,
        created_at: user.timestamp,
        content: (get(user, "content") || "") + note,
        attachments: [],
        origin: "agent",
      });
    }
    const rest = user !== null ? rows.slice(1) : rows;
    if (rest.length > 0) {
      const timeline = importedTimeline(state, rest, turnId);
      appendRow(state, {
        id: `${turnId}.reply`,
        role: "assistant",
        turn_id: turnId,
        created_at: rest[0].timestamp,
        finished_at: rest.at(-1).timestamp,
        content: timeline
          .filter((i) => i.type === "text" && !i.interim)
          .map((i) => i.text)
          .join(""),
        state: "completed",
        stream_id: null,
        timeline,
        origin: "agent",
      });
    }
  }
});

/** Fold one SSE envelope; false when ignored (already applied, or another session's). */
export function applyEvent(state, envelope) {
  if (!envelope || envelope.session_id !== state.sessionId) return false;
  const seq = Number(envelope.seq);
  if (!(seq > state.lastSeq)) return false;
  state.lastSeq = seq;
  const env = truthy(envelope.data) ? envelope : { ...envelope, data: {} };
  const handler = HANDLERS.get(env.type);
  if (handler !== undefined) handler(state, env, env.data);
  return true;
}

/** Replace the state with the `session` object of `GET /api/session` (or of a
 * `session.snapshot` frame); later events continue after its `last_seq`. */
export function applySnapshot(state, session) {
  if (!session || (has(session, "session_id") && session.session_id !== state.sessionId)) {
    return false;
  }
  const hydrate = (obj) => touch(state, clone(obj));
  const hydrateRow = (row) => {
    const copy = hydrate(row);
    if (Array.isArray(copy.timeline)) for (const item of copy.timeline) touch(state, item);
    return copy;
  };
  state.lastSeq = Number(session.last_seq ?? 0);
  state.messages = (session.messages ?? []).map(hydrateRow);
  state.tree = restore(state.messages, session.branches ?? null, hydrateRow);
  state.users = new Map();
  for (const row of state.messages) if (row.role === "user") state.users.set(row.turn_id, row);
  state.active = new Map();
  const live = session.live;
  if (live) {
    const scene = newScene(state, live.stream_id, live.turn_id, live.started_at);
    Object.assign(scene, {
      phase: live.phase,
      runtime: get(live, "runtime"),
      model: get(live, "model"),
    });
    for (const item of live.timeline ?? []) {
      const copy = hydrate(item);
      scene.items.push(copy);
      scene.byId.set(copy.id, copy);
    }
    for (const steer of live.pending_steers ?? []) {
      scene.pendingSteers.set(steer.steer_id, steer.text);
    }
    markInterim(state, scene.items);
    state.active.set(scene.stream_id, scene);
    if (session.pending_user_message != null || truthy(session.pending_attachments)) {
      state.users.set(live.turn_id, {
        content: session.pending_user_message,
        attachments: clone(session.pending_attachments ?? []),
      });
    }
  }
  state.queued = new Map((session.queued ?? []).map((q) => [q.queue_id, touch(state, clone(q))]));
  return true;
}

/** Exactly the shape of the Python `TranscriptFold.view()`, as fresh plain objects. */
export function view(state) {
  return { ...transcriptView(state, copyRow, bare), branches: snapshot(state.tree, copyRow) };
}

// Each row's and live item's last copy, while its `rev` stays the same.
const copies = new WeakMap();

function kept(copy) {
  return (obj) => {
    const last = copies.get(obj);
    if (last !== undefined && last.rev === obj.rev) return last.copy;
    const fresh = copy(obj);
    copies.set(obj, { rev: obj.rev, copy: fresh });
    return fresh;
  };
}

const keptRow = kept(copyRow);
const keptItem = kept(bare);

/** What the page draws each frame: `view()` without `branches` (the page asks the tree
 *  itself), a row or item that did not change since the last call the very same object as
 *  then. Read-only: the copies are shared between calls. */
export function frameView(state) {
  return transcriptView(state, keptRow, keptItem);
}

function transcriptView(state, row, item) {
  const out = {
    messages: state.messages.map(row),
    pending_user_message: null,
    pending_attachments: [],
    pending_started_at: null,
    live: null,
    queued: [...state.queued.values()].map(bare),
  };
  const scene = state.active.values().next().value;
  if (scene !== undefined) {
    const user = state.users.get(scene.turn_id);
    if (user !== undefined) {
      out.pending_user_message = user.content;
      out.pending_attachments = clone(user.attachments);
    }
    out.pending_started_at = scene.started_at;
    out.live = {
      stream_id: scene.stream_id,
      turn_id: scene.turn_id,
      phase: scene.phase,
      started_at: scene.started_at,
      runtime: scene.runtime,
      model: scene.model,
      timeline: scene.items.map(item),
      pending_steers: [...scene.pendingSteers].map(([steer_id, text]) => ({ steer_id, text })),
    };
  }
  return out;
}

/** The scene `view(state).live` shows (with its `rev` and stored items), or null. */
export function liveScene(state) {
  return state.active.values().next().value ?? null;
}
