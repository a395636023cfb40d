// unread.js: the sidebar's client-side unread stores (contract: "Client-side unread persistence
// (sidebar layer)"; docs/api.md §7). Plain ES module, no build step, no dependencies.
//
// Contract rule -> code
//  - Keys: VIEWED_KEY, MARKERS_KEY, CLEARED_PREFIX + <encoded sid> + ':' + <stamp>, DELETED_PREFIX
//    + <encoded sid>; LEGACY_CLEARED_KEY is read only by migrate().
//  - Viewed counts are generation-scoped: countBeats()/mergeCount() (a newer generation replaces,
//    same generation merges by maximum, an older one never lowers); legacy numeric values are
//    generation 0 (normCount) and are rewritten structured by the next _writeCounts().
//  - First observation of a newer generation acknowledges only transcript_generation_baseline:
//    _evaluate().
//  - Deletion records: deleteSession(); _dropDead() drops every count (and marker) whose session
//    has a live deletion record, so a stale cache prunes it instead of writing it back.
//  - Completion markers are ordered by logical stamps: markCompletion() stamps unread_order =
//    greatest observed stamp (_hwm: own clears, cached and stored markers, clear records) + 1;
//    _recordClear() writes one immutable key per clear; _clearOf() folds the maximum per session;
//    a marker wins only when unread_order > folded clear (ties go to the clear).
//  - A viewed-count advance records its clear even with no visible marker; repeated
//    acknowledgements at the same count write no new tombstone: acknowledge().
//  - One-time migration of the unsuffixed whole clear map, then removal: migrate().
//  - Retention: 7 days by wall-clock recorded_at, never by stamp (_expired()); supersession
//    only by a newer persisted record of the same session; never by list membership: prune().
//  - Quota: _set() catches QuotaExceededError (name, code 22/1014); a clear whose key cannot be
//    allocated lives in _memClears (degraded), the smaller marker-map write is still attempted,
//    older durable records stay: _recordClear().
//  - Cross-client repair: storage/focus/visibilitychange/pageshow -> _sync(): the same merge,
//    re-asserting only facts this client holds that storage lacks (never removals), so the loser
//    of a race sees a value it cannot beat and stops; onChange() repaints.

export const VIEWED_KEY = "hermes-session-viewed-counts";
export const MARKERS_KEY = "hermes-session-completion-unread";
export const LEGACY_CLEARED_KEY = "hermes-session-completion-unread-cleared";
export const CLEARED_PREFIX = `${LEGACY_CLEARED_KEY}:v1:`;
export const DELETED_PREFIX = `${VIEWED_KEY}:deleted:v1:`;
export const RETENTION_MS = 7 * 24 * 60 * 60 * 1000;

const isNum = (v) => typeof v === "number" && Number.isFinite(v);
const count = (v) => (isNum(v) ? Math.max(0, Math.trunc(v)) : 0);
// The count viewed counts hold for a Row: its activity_count, which a run settled by recovery or
// shutdown never raises (contract invariant 4: maintenance is not activity), or message_count
// for a row without one. Right after a shrink the two are equal, so the baseline applies alike.
const shownCount = (row) => (isNum(row.activity_count) ? row.activity_count : row.message_count);
const orderOf = (m) => (m && isNum(m.unread_order) ? m.unread_order : 0);
const clearKey = (sid, stamp) => `${CLEARED_PREFIX}${encodeURIComponent(sid)}:${stamp}`;
const deletedKey = (sid) => `${DELETED_PREFIX}${encodeURIComponent(sid)}`;

function parseObject(raw) {
  if (raw == null) return null;
  try {
    const v = JSON.parse(raw);
    return v && typeof v === "object" && !Array.isArray(v) ? v : null;
  } catch {
    return null;
  }
}

/** True for a storage quota failure: the standard name, Firefox's name, or legacy codes. */
export function isQuotaError(err) {
  return (
    !!err &&
    (err.name === "QuotaExceededError" ||
      err.name === "NS_ERROR_DOM_QUOTA_REACHED" ||
      err.code === 22 ||
      err.code === 1014)
  );
}

/** Legacy numeric counts are generation 0; anything else malformed is ignored. */
function normCount(v) {
  if (isNum(v)) return { message_count: count(v), transcript_generation: 0 };
  if (v && typeof v === "object" && isNum(v.message_count)) {
    return {
      message_count: count(v.message_count),
      transcript_generation: count(v.transcript_generation),
    };
  }
  return null;
}

/** Does count `a` carry a fact `b` lacks? (newer generation, or same generation and higher). */
function countBeats(a, b) {
  if (!a) return false;
  if (!b) return true;
  if (a.transcript_generation !== b.transcript_generation) {
    return a.transcript_generation > b.transcript_generation;
  }
  return a.message_count > b.message_count;
}
const mergeCount = (held, other) => (countBeats(other, held) ? other : held);

/** Does marker `a` beat `b`? Higher unread_order; a deterministic tie-break keeps caches equal. */
function markerBeats(a, b) {
  if (!a) return false;
  if (!b) return true;
  if (orderOf(a) !== orderOf(b)) return orderOf(a) > orderOf(b);
  return (
    (isNum(a.completed_at) ? a.completed_at : 0) > (isNum(b.completed_at) ? b.completed_at : 0)
  );
}

function parseClearKey(key) {
  const rest = key.slice(CLEARED_PREFIX.length);
  const cut = rest.lastIndexOf(":");
  const stamp = Number(rest.slice(cut + 1));
  if (cut <= 0 || !Number.isSafeInteger(stamp) || stamp < 0) return null;
  try {
    return { sid: decodeURIComponent(rest.slice(0, cut)), stamp };
  } catch {
    return null;
  }
}

/** In-memory stand-in when localStorage itself is unavailable (privacy modes). */
function memoryStorage() {
  const m = new Map();
  return {
    get length() {
      return m.size;
    },
    key: (i) => [...m.keys()][i] ?? null,
    getItem: (k) => (m.has(k) ? m.get(k) : null),
    setItem: (k, v) => {
      m.set(k, String(v));
    },
    removeItem: (k) => {
      m.delete(k);
    },
  };
}

function defaultStorage() {
  try {
    if (typeof window !== "undefined" && window.localStorage) return window.localStorage;
  } catch {
    /* storage blocked by the browser */
  }
  return memoryStorage();
}

const isUnreadKey = (k) =>
  k === VIEWED_KEY ||
  k === MARKERS_KEY ||
  k === LEGACY_CLEARED_KEY ||
  k.startsWith(CLEARED_PREFIX) ||
  k.startsWith(DELETED_PREFIX);

export class UnreadStore {
  constructor({
    storage = defaultStorage(),
    now = () => Date.now(),
    onChange = null,
    listen = true,
  } = {}) {
    this._storage = storage;
    this._now = now;
    this._onChange = onChange;
    this._counts = new Map(); // sid -> {message_count, transcript_generation}: held facts
    this._markers = new Map(); // sid -> marker (only markers that beat their clear)
    this._clears = new Map(); // sid -> greatest durable clear stamp (records in storage)
    this._memClears = new Map(); // sid -> clear stamp kept in memory only (quota)
    this._deleted = new Map(); // sid -> recorded_at of a live deletion record
    this._memDeleted = new Map(); // deletion records storage refused
    this._hwm = 0; // greatest logical stamp observed
    this._degraded = false;
    this._queued = false;
    this._listeners = [];
    this.migrate();
    this.prune();
    if (listen && typeof window !== "undefined") this._listen();
  }

  /** True once a quota failure forced a clear to live in memory only (show one notice). */
  get degraded() {
    return this._degraded;
  }

  /** The sidebar dot for `row` (API Row). The open, visible session never shows one. */
  hasUnread(row, { active = false } = {}) {
    return this._evaluate(row, active, true);
  }

  _evaluate(row, active, mayLoad) {
    const sid = row?.session_id;
    if (!sid || active || this._deleted.has(sid)) return false;
    const marker = this._markers.get(sid);
    if (marker && orderOf(marker) > this._clearOf(sid)) return true;
    if (!isNum(shownCount(row))) return false;
    const n = count(shownCount(row));
    const gen = count(row.transcript_generation);
    const seen = this._counts.get(sid);
    if (seen && gen < seen.transcript_generation) return false; // stale row
    if (seen && gen === seen.transcript_generation) return n > seen.message_count;
    // First sight (records the row as read) or a newer generation (acknowledges the baseline
    // only): decide on fresh storage, since another client may already know more.
    if (mayLoad) {
      this._load();
      return this._evaluate(row, active, false);
    }
    const base = isNum(row.transcript_generation_baseline)
      ? Math.min(count(row.transcript_generation_baseline), n)
      : n;
    const acked = seen ? base : n;
    this._counts.set(sid, { message_count: acked, transcript_generation: gen });
    this._writeCounts();
    return n > acked;
  }

  /** The user saw `row`: advance its viewed count and clear its completion marker. */
  acknowledge(row) {
    const sid = row?.session_id;
    if (!sid) return;
    const stored = this._load();
    if (this._deleted.has(sid)) return;
    const prev = this._counts.get(sid);
    const next = isNum(shownCount(row))
      ? mergeCount(prev, {
          message_count: count(shownCount(row)),
          transcript_generation: count(row.transcript_generation),
        })
      : prev;
    const advanced = next !== prev;
    // An advance records its clear even when no marker is visible yet (a competing client may
    // have prepared one); the same count again writes no new tombstone unless a dot is showing.
    if (advanced || this._markers.has(sid)) this._recordClear(sid);
    if (advanced) {
      this._counts.set(sid, next);
      this._writeCounts();
    }
    if (stored.markers.has(sid)) this._writeMarkers();
  }

  /** A run completed in a session the user is not viewing: light its dot. `info` may be a whole
   * Row; only message_count, transcript_generation and the optional source/profile are kept. */
  markCompletion(sessionId, info) {
    if (!sessionId) return false;
    info = info || {};
    this._load();
    if (this._deleted.has(sessionId)) return false;
    const order = this._hwm + 1;
    this._hwm = order;
    const meta = {};
    for (const k of ["source", "profile"]) if (typeof info[k] === "string") meta[k] = info[k];
    this._markers.set(sessionId, {
      ...meta,
      message_count: count(info.message_count),
      transcript_generation: count(info.transcript_generation),
      completed_at: this._now(),
      unread_order: order,
    });
    this._writeMarkers();
    return true;
  }

  /** Dismiss the session's completion marker (records a clear ordering fact first). */
  clearCompletion(sessionId) {
    if (!sessionId) return;
    const stored = this._load();
    this._recordClear(sessionId);
    if (stored.markers.has(sessionId)) this._writeMarkers();
  }

  /** The session was deleted: record it so no client re-asserts its count. */
  deleteSession(sessionId) {
    if (!sessionId) return;
    const stored = this._load();
    const at = this._now();
    if (
      !this._set(deletedKey(sessionId), JSON.stringify({ session_id: sessionId, recorded_at: at }))
    ) {
      this._memDeleted.set(sessionId, at);
    }
    this._deleted.set(sessionId, at);
    this._dropDead();
    if (stored.counts.has(sessionId)) this._writeCounts();
    if (stored.markers.has(sessionId)) this._writeMarkers();
  }

  /** One-time import of the unsuffixed whole clear map (sid -> clearedAt ms) as independent
   * records, then removal of the key. Legacy markers keep the legacy rule once: a marker whose
   * completed_at postdates the clear survives (re-stamped above it), any other is dropped. */
  migrate() {
    const raw = this._get(LEGACY_CLEARED_KEY);
    if (raw === null) return false;
    const legacy = parseObject(raw) || {};
    this._load();
    const now = this._now();
    const stamp = this._hwm + 1;
    this._hwm = stamp + 1;
    let durable = true;
    for (const [sid, v] of Object.entries(legacy)) {
      const at = isNum(v) ? v : v && (v.cleared_at ?? v.clearedAt ?? v.recorded_at);
      if (!isNum(at)) continue;
      const marker = this._markers.get(sid);
      if (marker && isNum(marker.completed_at) && marker.completed_at > at) {
        this._markers.set(sid, { ...marker, unread_order: Math.max(orderOf(marker), stamp + 1) });
      } else {
        this._markers.delete(sid);
      }
      const recordedAt = Math.min(at, now); // retention counts from the original write
      if (this._expired(recordedAt, now)) continue;
      const value = JSON.stringify({
        session_id: sid,
        stamp,
        recorded_at: recordedAt,
        migrated: true,
      });
      if (this._set(clearKey(sid, stamp), value)) {
        this._clears.set(sid, Math.max(stamp, this._clears.get(sid) ?? -1));
      } else {
        durable = false;
        this._memClears.set(sid, stamp);
        this._degraded = true;
      }
    }
    this._writeMarkers();
    if (durable) this._remove(LEGACY_CLEARED_KEY); // else retry the import on the next load
    return true;
  }

  /** Expire clear and deletion records 7 days after their wall-clock write, and drop clear
   * records superseded by a newer persisted record of the same session. Never looks at rows. */
  prune() {
    this._prune(null);
  }

  _prune(keepSid) {
    const now = this._now();
    const stored = this._load();
    const { clears, deletions } = this._scan();
    // Markers dominated by any present record leave the map before a record can go.
    let mapSafe = true;
    for (const [sid, m] of stored.markers) {
      if (orderOf(m) <= this._clearOf(sid)) {
        mapSafe = this._writeMarkers();
        break;
      }
    }
    for (const r of clears) {
      const superseded = (this._clears.get(r.sid) ?? -1) > r.stamp;
      const expired = mapSafe && r.sid !== keepSid && this._expired(r.recorded_at, now);
      if (superseded || expired) this._remove(r.key);
    }
    for (const r of deletions) if (this._expired(r.recorded_at, now)) this._remove(r.key);
    this._load();
  }

  /** Re-read storage now (what focus/visibilitychange/pageshow do); repaints via onChange. */
  refresh() {
    this._sync();
  }

  /** Detach the window listeners. */
  destroy() {
    for (const [target, type, fn] of this._listeners) target.removeEventListener(type, fn);
    this._listeners = [];
  }

  // --- internals ------------------------------------------------------------------------------

  _listen() {
    const schedule = () => this._schedule();
    const onStorage = (e) => {
      try {
        if (e.storageArea && e.storageArea === window.sessionStorage) return;
      } catch {
        /* */
      }
      if (e.key === null) {
        this._counts.clear();
        this._markers.clear();
      } // storage was cleared
      else if (!isUnreadKey(e.key)) return;
      schedule();
    };
    const onVisible = () => {
      if (document.visibilityState === "visible") schedule();
    };
    this._listeners = [
      [window, "storage", onStorage],
      [window, "focus", schedule],
      [window, "pageshow", schedule],
    ];
    if (typeof document !== "undefined")
      this._listeners.push([document, "visibilitychange", onVisible]);
    for (const [target, type, fn] of this._listeners) target.addEventListener(type, fn);
  }

  _schedule() {
    if (this._queued) return;
    this._queued = true;
    queueMicrotask(() => {
      this._queued = false;
      this._sync();
    });
  }

  // The storage-event path: merge, then re-assert only facts this client holds that storage
  // lacks. Removals are never written here, so two clients cannot undo each other forever.
  _sync() {
    const before = this._signature();
    const stored = this._load();
    const lacks = (held, have, beats) => [...held].some(([sid, v]) => beats(v, have.get(sid)));
    if (lacks(this._counts, stored.counts, countBeats)) this._writeCounts();
    if (lacks(this._markers, stored.markers, markerBeats)) this._writeMarkers();
    if (this._onChange && this._signature() !== before) {
      try {
        this._onChange();
      } catch (err) {
        console.error(err);
      }
    }
  }

  _signature() {
    const sorted = (m, f = (v) => v) =>
      [...m].map(([k, v]) => [k, f(v)]).sort((a, b) => (a[0] < b[0] ? -1 : 1));
    return JSON.stringify([
      sorted(this._counts),
      sorted(this._markers, orderOf),
      sorted(this._clears),
      sorted(this._memClears),
      sorted(this._deleted, () => 1),
    ]);
  }

  _clearOf(sid) {
    return Math.max(this._clears.get(sid) ?? -1, this._memClears.get(sid) ?? -1);
  }

  _expired(recordedAt, now) {
    // Unknown or absurdly future write times cannot prove retention either.
    return !isNum(recordedAt) || now - recordedAt > RETENTION_MS || recordedAt - now > RETENTION_MS;
  }

  // Read every store and fold it into the held (monotonic) cache; returns what storage holds.
  _load() {
    const counts = new Map();
    const markers = new Map();
    for (const [sid, v] of Object.entries(parseObject(this._get(VIEWED_KEY)) || {})) {
      const c = normCount(v);
      if (c) counts.set(sid, c);
    }
    for (const [sid, m] of Object.entries(parseObject(this._get(MARKERS_KEY)) || {})) {
      if (m && typeof m === "object") markers.set(sid, m);
    }
    const { clears, deletions } = this._scan();
    const now = this._now();
    this._clears = new Map();
    for (const r of clears) {
      this._clears.set(r.sid, Math.max(r.stamp, this._clears.get(r.sid) ?? -1));
      this._hwm = Math.max(this._hwm, r.stamp);
    }
    this._deleted = new Map(this._memDeleted);
    for (const r of deletions) {
      if (!this._expired(r.recorded_at, now)) this._deleted.set(r.sid, r.recorded_at);
    }
    for (const stamp of this._memClears.values()) this._hwm = Math.max(this._hwm, stamp);
    for (const [sid, c] of counts) this._counts.set(sid, mergeCount(this._counts.get(sid), c));
    for (const [sid, m] of markers) {
      this._hwm = Math.max(this._hwm, orderOf(m));
      if (markerBeats(m, this._markers.get(sid))) this._markers.set(sid, m);
    }
    for (const m of this._markers.values()) this._hwm = Math.max(this._hwm, orderOf(m));
    this._dropDead();
    return { counts, markers };
  }

  _dropDead() {
    for (const sid of [...this._counts.keys()])
      if (this._deleted.has(sid)) this._counts.delete(sid);
    for (const [sid, m] of [...this._markers]) {
      if (this._deleted.has(sid) || orderOf(m) <= this._clearOf(sid)) this._markers.delete(sid);
    }
  }

  _scan() {
    const clears = [];
    const deletions = [];
    const keys = [];
    try {
      for (let i = 0; i < this._storage.length; i += 1) keys.push(this._storage.key(i));
    } catch {
      /* unreadable storage: nothing to fold */
    }
    for (const key of keys) {
      if (typeof key !== "string") continue;
      if (key.startsWith(CLEARED_PREFIX)) {
        const parsed = parseClearKey(key);
        const recorded = parseObject(this._get(key))?.recorded_at;
        if (parsed) clears.push({ key, ...parsed, recorded_at: recorded });
      } else if (key.startsWith(DELETED_PREFIX)) {
        let sid;
        try {
          sid = decodeURIComponent(key.slice(DELETED_PREFIX.length));
        } catch {
          continue;
        }
        deletions.push({ key, sid, recorded_at: parseObject(this._get(key))?.recorded_at });
      }
    }
    return { clears, deletions };
  }

  // Record a clear as its own immutable key. Only a persisted record supersedes older ones; a
  // refused allocation keeps the order in memory and leaves older durable records in place.
  _recordClear(sid) {
    const stamp = this._hwm + 1;
    this._hwm = stamp;
    const key = clearKey(sid, stamp);
    const value = JSON.stringify({ session_id: sid, stamp, recorded_at: this._now() });
    let ok = this._get(key) !== null || this._set(key, value);
    if (!ok) {
      this._prune(sid); // frees expired records (never this session's), then one retry
      ok = this._set(key, value);
    }
    if (ok) {
      this._clears.set(sid, Math.max(stamp, this._clears.get(sid) ?? -1));
      for (const r of this._scan().clears)
        if (r.sid === sid && r.stamp < stamp) this._remove(r.key);
    } else {
      this._memClears.set(sid, stamp);
      this._degraded = true;
    }
    this._dropDead();
    return ok;
  }

  _writeCounts() {
    const out = {};
    for (const [sid, c] of this._counts) {
      out[sid] = { message_count: c.message_count, transcript_generation: c.transcript_generation };
    }
    return this._set(VIEWED_KEY, JSON.stringify(out));
  }

  _writeMarkers() {
    return this._set(MARKERS_KEY, JSON.stringify(Object.fromEntries(this._markers)));
  }

  _get(key) {
    try {
      return this._storage.getItem(key);
    } catch {
      return null;
    }
  }

  // Every write goes through here: quota (or any) failure is reported, never thrown at the UI.
  _set(key, value) {
    try {
      this._storage.setItem(key, value);
      return true;
    } catch (err) {
      if (!isQuotaError(err)) console.warn("unread store write failed", err);
      return false;
    }
  }

  _remove(key) {
    try {
      this._storage.removeItem(key);
    } catch {
      /* best effort */
    }
  }
}

export default UnreadStore;
