// One reattach state machine per open session, with a visible state (contract invariant 3,
// docs/architecture.md §4): connecting → replaying N events → live; reconnecting after an error;
// stalled when heartbeats stop (shown, then reconnected); degraded when the server could not
// honour the cursor and sent a snapshot. The cursor is always the reducer's last seq, so a
// resume asks for exactly what is missing.

// The durable event types, served from their definitions (tether/events.py): the page listens
// for each one, and a new type needs no change here.
import { EVENT_TYPES } from "./event_types.js";

const STALL_FACTOR = 2.5;
const MAX_BACKOFF_MS = 8000;

export class SessionStream {
  /**
   * handlers: cursor() → last applied seq; onEvent(envelope); onSnapshot(session);
   * onHeartbeat(data); onState(state, detail); onDeleted(); onBroken() (at each reconnect);
   * onResync() (the server could not tell each sidebar change: refetch the list).
   * relay: the sidebar's SidebarRelay, which gets the sidebar changes this stream carries.
   */
  constructor(sessionId, handlers, { heartbeatMs = 5000, relay = null } = {}) {
    this.sessionId = sessionId;
    this.h = handlers;
    this.heartbeatMs = heartbeatMs;
    this.es = null;
    this.target = 0;
    this.failures = 0;
    this.stopped = false;
    this.lastFrameAt = 0;
    this.source = relay?.add(() => this.stop()) ?? null;
    this.watchdog = null;
    this.retryTimer = null;
    this.state = "idle";
  }

  setState(state, detail = {}) {
    if (state === this.state && state !== "replaying") return;
    this.state = state;
    this.h.onState?.(state, detail);
  }

  start(knownLastSeq = 0) {
    this.target = Math.max(this.target, knownLastSeq);
    this.stopped = false;
    this.open();
    this.watchdog = setInterval(() => this.checkStall(), 1000);
  }

  /** Another stream takes over: from now on only sidebar changes are passed on, until the
   *  sidebar's relay stops this one, once its successor follows (sidebar_relay.js). */
  retire() {
    const { cursor, onResync } = this.h;
    this.h = { cursor, onEvent() {}, onSnapshot() {}, onResync };
    if (this.source) this.source.retire();
    else this.stop();
  }

  stop() {
    this.stopped = true;
    clearInterval(this.watchdog);
    clearTimeout(this.retryTimer);
    this.es?.close();
    this.es = null;
  }

  open() {
    const after = this.h.cursor();
    // sidebar=1: this one connection also carries the sidebar's changes (one per tab).
    const url = `/api/sessions/${encodeURIComponent(this.sessionId)}/events?after=${after}&sidebar=1`;
    this.es = new EventSource(url);
    this.lastFrameAt = Date.now();
    this.setState(this.target > after ? "replaying" : "connecting", {
      missing: this.target - after,
    });
    this.es.onopen = () => {
      this.failures = 0;
      if (this.target <= this.h.cursor()) this.setState("live");
    };
    this.es.onerror = () => this.reconnect();
    for (const type of EVENT_TYPES) this.es.addEventListener(type, (e) => this.onFrame(e));
    this.es.addEventListener("heartbeat", (e) => this.onHeartbeat(e));
    this.es.addEventListener("session.snapshot", (e) => this.onSnapshot(e));
    this.es.addEventListener("session.deleted", () => {
      this.stop();
      this.source?.lost();
      this.h.onDeleted?.();
    });
    this.es.addEventListener("session.changed", (e) => {
      this.seen();
      this.source?.change(JSON.parse(e.data));
    });
    this.es.addEventListener("resync", () => {
      this.seen();
      this.h.onResync?.();
    });
  }

  /** A frame arrived: the stall watchdog is fed, and the relay hears of it (a connection's
   *  first frame says the stream follows the sidebar). */
  seen() {
    this.lastFrameAt = Date.now();
    this.source?.frame();
  }

  onFrame(e) {
    this.seen();
    this.h.onEvent(JSON.parse(e.data));
    const cursor = this.h.cursor();
    if (this.state === "replaying" && cursor < this.target) {
      this.setState("replaying", { missing: this.target - cursor });
    } else if (this.state !== "live") {
      this.setState("live");
    }
  }

  onHeartbeat(e) {
    this.seen();
    const data = JSON.parse(e.data);
    this.target = Math.max(this.target, data.last_seq);
    this.h.onHeartbeat?.(data);
    // Degraded stays until the next event proves the stream is whole again: a heartbeat
    // alone would clear it a fraction of a second after the snapshot, before anyone saw it.
    if (this.state !== "degraded" && this.h.cursor() >= data.last_seq) this.setState("live");
  }

  onSnapshot(e) {
    this.seen();
    const data = JSON.parse(e.data);
    this.h.onSnapshot(data.session);
    this.target = Math.max(this.target, data.session.last_seq);
    this.setState("degraded", { reason: "restored from a snapshot" });
  }

  checkStall() {
    if (this.stopped || !this.es) return;
    if (Date.now() - this.lastFrameAt > this.heartbeatMs * STALL_FACTOR) {
      this.setState("stalled");
      this.reconnect();
    }
  }

  reconnect() {
    if (this.stopped) return;
    this.source?.lost(); // which stops this stream if it was giving way
    if (this.stopped) return;
    this.es?.close();
    this.es = null;
    this.h.onBroken?.();
    this.failures += 1;
    if (this.state !== "stalled") this.setState("reconnecting", { attempt: this.failures });
    const delay = Math.min(MAX_BACKOFF_MS, 250 * 2 ** Math.min(this.failures, 6));
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => {
      if (!this.stopped) this.open();
    }, delay);
  }
}
