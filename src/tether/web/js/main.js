// The app: wires the sidebar, the open session (reducer + stream + view) and the composer.
// One reducer per session over (seq, event): live events, replayed events and snapshots all
// go through it, so a reload, a reconnect and a session switch show the same rows.
import { authStatus, recheckSignIn } from "./session_auth.js";
import "./password.js";
import { del, get, patch, post, q } from "./api.js";
import { BranchActions, openEdits } from "./branches.js";
import { Composer } from "./composer.js";
import { Drafts, NEW_CHAT } from "./drafts.js";
import { setText } from "./dom.js";
import { applyEvent, applySnapshot, createSession, frameView, liveScene } from "./reducer.js";
import { MessageSearch } from "./search.js";
import { SessionSettings } from "./session_settings.js";
import { SettingsPanel, showTheme } from "./settings.js";
import { Sidebar } from "./sidebar.js";
import { position, refused, sendQueued } from "./refusals.js";
import { openFailed } from "./open_failed.js";
import { RunPrompts } from "./run_prompts.js";
import { SessionStream } from "./stream.js";
import { ImportControl } from "./transfer.js";
import { TranscriptView } from "./transcript.js";
import { UnreadStore } from "./unread.js";

const $ = (id) => document.getElementById(id);
const LIVE_FRAME_MS = 100; // the live Markdown's own cadence (transcript.js)
const DEFAULT_TITLE = "New chat"; // the server's name for a session its first message has not named
// What Continue sends under an answer cut off at the token limit (a visible user turn).
const CONN_TEXT = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  stalled: "Stalled",
  degraded: "Degraded (snapshot)",
  idle: "",
};

/** The sidebar row within a `GET /api/session` body: the session without its transcript. */
function rowOf(session) {
  const { messages, live, queued, inherited_messages, branches, ...row } = session;
  return row;
}

class App {
  constructor() {
    this.sessions = new Map(); // sid -> {state, inherited, row}
    this.openId = null;
    this.stream = null;
    this.health = null;
    this.ownSteers = new Set();
    this.renderQueued = false;
    this.renderedAt = 0;
    this.transcript = new TranscriptView($("transcript"));
    this.unread = new UnreadStore({ onChange: () => this.sidebar?.render() });
    this.sidebar = new Sidebar({
      unread: this.unread,
      onOpen: (sid) => this.open(sid, { push: true }),
      onDeleted: (sid) => this.onDeleted(sid),
      onChanged: (row) => this.onRowChanged(row),
      notify: (msg) => this.notify(msg),
      onReread: () => this.drafts.prune(), // drafts of sessions deleted unseen
    });
    this.composer = new Composer({
      send: (text, files) => this.send(text, files),
      stop: () => this.stop(),
      steer: (text) => this.steer(text),
      queue: (text, files) => this.queue(text, files),
      // the error, not a notice: the composer keeps the edit and says why (composer.js)
      editQueued: (id, text) =>
        patch(`/api/chat/queue?${q({ queue_id: id })}`, { text }).then(
          () => null,
          (err) => err,
        ),
      removeQueued: (id) => this.call(() => del(`/api/chat/queue?${q({ queue_id: id })}`)),
      sendQueued: (id) => sendQueued(this, id),
      notify: (msg) => this.notify(msg),
      changed: (now) => (now ? this.drafts.save() : this.drafts.changed()),
    });
    this.drafts = new Drafts({
      composer: this.composer,
      notify: (msg) => this.notify(msg),
      // a session's edits not opened again yet, else those open in the transcript
      editsShown: () => this.sessions.get(this.openId)?.edits ?? openEdits(this.transcript.rowsEl),
    });
    this.search = new MessageSearch({
      onPick: (sid, rowId, shown) => this.openAt(sid, rowId, shown),
    });
    this.importer = new ImportControl({ onImported: () => this.sidebar.load() });
    this.settings = new SessionSettings({
      ensureSession: () => this.ensureSession(),
      // a row read by a request sent at `sent`: the sidebar keeps whichever is newer
      onRow: (row, sent) => this.sidebar.onChanged({ session_id: row.session_id, row }, sent),
      stamp: () => this.sidebar.stamp(),
      notify: (msg) => this.notify(msg),
      onNames: (names) => {
        this.transcript.setNames(names);
        this.showBadge();
      },
    });
    this.panel = new SettingsPanel({
      sessionSettings: this.settings,
      notify: (msg) => this.notify(msg),
    });
  }

  async boot() {
    this.setupChrome();
    const status = await authStatus; // whose drafts these are (drafts.js)
    this.drafts.setUser(status ? (status.username ?? "") : null);
    this.health = await get("/api/health");
    this.showBadge();
    // the model itself is the per-session picker beside it (session_settings.js)
    $("model-label").textContent = this.health.demo ? "Demo runtime: no model is called" : "";
    await Promise.all([this.sidebar.load(), this.settings.load()]);
    window.addEventListener("popstate", () => this.route());
    document.addEventListener("visibilitychange", () => this.sidebar.render());
    setInterval(() => this.transcript.tick(), 1000);
    setInterval(() => this.sidebar.render(), 60_000); // relative times ("2 h") stay true
    this.prompts = new RunPrompts($("transcript"), this); // approvals, questions, Continue
    this.branches = new BranchActions($("transcript"), this); // Edit, Regenerate, ‹ 2/3 ›
    this.transcript.onEditLost = (edit) =>
      this.drafts.toComposer(
        [edit],
        "Not sent: the message you were editing is no longer shown (another branch is). " +
          "Your edit is in the composer.",
      );
    await this.route();
  }

  /** The runtime's model (`GET /api/health`), named as the pickers name it once the list is
   *  read (`ModelNames`). */
  showBadge() {
    if (!this.health) return;
    const badge = $("runtime-badge");
    const model = this.health.model ? this.settings.names.label(this.health.model) : "";
    badge.textContent = this.health.demo ? "Demo runtime (offline)" : model;
    badge.title = badge.textContent; // whole, where its line cuts a long model name
    badge.classList.toggle("demo", !!this.health.demo);
  }

  /** The transcript is about to show another session (or none): the edits left open in the
   *  one shown stay with it, opened again when it is shown next (renderNow). */
  leaveTranscript() {
    this.drafts.save();
    const entry = this.sessions.get(this.openId);
    if (entry?.loaded) entry.edits = openEdits(this.transcript.rowsEl);
    this.transcript.clear();
  }

  setupChrome() {
    const root = document.documentElement;
    showTheme();
    $("theme-toggle").addEventListener("click", () => {
      root.dataset.theme = root.dataset.theme === "dark" ? "light" : "dark";
      localStorage.setItem("tether-theme", root.dataset.theme);
    });
    const mode = $("display-mode");
    mode.value = localStorage.getItem("tether-display-mode") || "worklog";
    this.transcript.setMode(mode.value);
    mode.addEventListener("change", () => {
      localStorage.setItem("tether-display-mode", mode.value);
      this.transcript.setMode(mode.value);
      this.scheduleRender();
    });
    addEventListener("storage", (e) => {
      if (e.key !== "tether-display-mode" && e.key !== null) return;
      // chosen in another tab of this browser: shown here at once, as the theme is
      mode.value = localStorage.getItem("tether-display-mode") || "worklog";
      this.transcript.setMode(mode.value);
      this.scheduleRender();
    });
    $("new-chat").addEventListener("click", () => this.newChat());
    const shell = $("shell");
    const toggle = $("menu-toggle");
    // The phone's drawer: opened by ☰ (which it never covers), closed by ☰, its × button, a
    // tap on the dimmed page or Esc; closing by hand returns focus to ☰.
    const setNav = (open, { refocus = false } = {}) => {
      shell.classList.toggle("nav-open", open);
      toggle.setAttribute("aria-expanded", String(open));
      if (refocus) toggle.focus();
    };
    const navOpen = () => shell.classList.contains("nav-open");
    toggle.addEventListener("click", () => setNav(!navOpen()));
    $("scrim").addEventListener("click", () => setNav(false, { refocus: true }));
    $("nav-close").addEventListener("click", () => setNav(false, { refocus: true }));
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && navOpen() && !e.target.closest?.(".row-menu, dialog")) {
        setNav(false, { refocus: true });
      }
    });
    this.closeNav = () => setNav(false);
  }

  async route() {
    const match = location.pathname.match(/^\/s\/([A-Za-z0-9_-]{1,64})$/);
    if (match) await this.open(match[1], { push: false });
    else this.showEmpty();
  }

  showEmpty() {
    this.stream?.retire(); // until the feed follows (sidebar_relay.js)
    this.stream = null;
    this.sidebar.connectFeed();
    this.leaveTranscript();
    this.openId = null;
    this.drafts.show(NEW_CHAT);
    this.sidebar.setActive(null);
    $("empty-state").hidden = false;
    this.running = false;
    this.showHeader();
    this.setConn("idle");
    this.composer.setRunning(false);
    this.composer.renderQueue([]);
  }

  newChat() {
    history.pushState({}, "", "/");
    this.showEmpty();
    this.closeNav?.();
    $("message").focus();
  }

  entry(sid) {
    if (!this.sessions.has(sid)) {
      this.sessions.set(sid, {
        state: createSession(sid),
        inherited: [],
        row: null,
        loaded: false,
        edits: this.drafts.edits(sid), // left open before a reload: opened again
      });
    }
    return this.sessions.get(sid);
  }

  async open(sid, { push }) {
    if (push) history.pushState({}, "", `/s/${sid}`);
    this.closeNav?.();
    this.stream?.retire(); // until the next stream follows (sidebar_relay.js)
    this.stream = null;
    this.leaveTranscript();
    this.openId = sid;
    this.drafts.show(sid);
    this.sidebar.setActive(sid);
    $("empty-state").hidden = true;
    const entry = this.entry(sid);
    if (entry.loaded) this.renderNow();
    await this.load(sid, entry);
  }

  /** Read the session opened and follow its stream (again, when it could not be read). */
  async load(sid, entry) {
    let body;
    const sent = this.sidebar.stamp();
    try {
      body = (await get(`/api/session?${q({ session_id: sid })}`)).session;
    } catch (err) {
      return openFailed(this, sid, err, () => this.load(sid, entry));
    }
    if (this.openId !== sid) return;
    if (!entry.loaded) applySnapshot(entry.state, body);
    entry.loaded = true;
    entry.inherited = body.inherited_messages || [];
    // Its row as the server has it now: the open session is seen (and read) at its newest.
    this.sidebar.onChanged({ session_id: sid, row: rowOf(body) }, sent);
    this.renderNow();
    this.stream?.retire(); // the same session opened twice at once: one stream stays
    this.stream = new SessionStream(
      sid,
      {
        cursor: () => entry.state.lastSeq,
        onEvent: (env) => this.onEvent(entry, env),
        onSnapshot: (session) => {
          applySnapshot(entry.state, session);
          entry.inherited = session.inherited_messages || entry.inherited;
          this.scheduleRender();
        },
        onState: (state, detail) => this.setConn(state, detail),
        onBroken: recheckSignIn,
        onDeleted: () => this.onDeleted(sid),
        onResync: () => this.sidebar.reread(),
      },
      { heartbeatMs: 5000, relay: this.sidebar.relay },
    );
    this.sidebar.retireFeed();
    this.stream.start(body.last_seq);
  }

  /** A search result: open its session and show the row that matched. */
  async openAt(sid, rowId, shown = true) {
    if (this.openId !== sid) await this.open(sid, { push: true });
    if (this.openId !== sid || this.transcript.reveal(rowId)) return;
    if (shown === false) {
      // a hidden branch: show it (branch.switched), as its ‹ › would
      const switched = await this.branches.showRow(this.entry(sid), rowId);
      if (switched === null || this.openId !== sid) return; // refused: the notice says why
      this.renderNow();
      if (switched && this.transcript.reveal(rowId)) return;
    }
    this.notify(
      shown === false
        ? "That message is on another branch of this session: use ‹ › where it forks to show it."
        : "That message is no longer in the session.",
    );
  }

  onEvent(entry, env) {
    if (!applyEvent(entry.state, env)) return;
    if (env.type === "steer.leftover" && env.data.steer_ids.some((id) => this.ownSteers.has(id))) {
      this.composer.restore(env.data.text); // no typed word is lost
      this.notify("The agent finished before it saw your steer; it is back in the composer.");
    }
    if (env.type === "session.rotated") this.showContinuation(env.data.continuation_session_id);
    if (env.type === "turn.submitted" && entry.row?.title === DEFAULT_TITLE) {
      this.refreshRow(entry.state.sessionId); // the first message names it: ask the server
    }
    this.scheduleRender();
  }

  /** A new chat's title as soon as the server has it, even when its sidebar change went by
   *  before this tab's stream connected (the stream replays events, not sidebar changes). */
  async refreshRow(sid) {
    try {
      const sent = this.sidebar.stamp();
      const { session } = await get(`/api/session?${q({ session_id: sid })}`);
      this.sidebar.onChanged({ session_id: sid, row: rowOf(session) }, sent);
    } catch {
      // the sidebar stream brings it later
    }
  }

  onRowChanged(row) {
    const entry = this.sessions.get(row.session_id);
    if (entry) entry.row = { ...entry.row, ...row };
    if (row.session_id === this.openId) {
      this.showHeader();
      if (row.continuation_session_id) this.showContinuation(row.continuation_session_id);
    }
  }

  /** The header and the tab title: the open session's title, and whether a run is going. */
  showHeader() {
    const entry = this.sessions.get(this.openId);
    const title = entry?.row?.title ?? "Tether";
    $("session-title").textContent = title;
    this.settings.show(entry?.row);
    $("run-badge").hidden = !this.running;
    // the title isolated (FSI ... PDI, a string has no element to carry dir="auto"): a bidi
    // control an older server left in it reorders nothing of the rest of the tab's name
    document.title = this.openId
      ? `${this.running ? "● " : ""}\u2068${title}\u2069 · Tether`
      : "Tether";
  }

  onDeleted(sid) {
    if (sid === this.openId) {
      history.replaceState({}, "", "/");
      this.showEmpty(); // its draft saved as it was left, for rescue
      this.notify("This session was deleted.");
    }
    this.sessions.delete(sid);
    this.drafts.rescue(sid);
  }

  showContinuation(childId) {
    this.notify("This conversation continues in a newer session.", {
      label: "Open it",
      action: () => this.open(childId, { push: true }),
    });
  }

  /** One render per animation frame; while a run streams, at most one per LIVE_FRAME_MS:
   *  every frame costs the browser layout, paint and compositing, and a delta every 20 ms
   *  rendered as it comes kept a core busy per tab (bench/README.md, "outside_latency"). */
  scheduleRender() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    const frame = () =>
      requestAnimationFrame(() => {
        this.renderQueued = false;
        this.renderedAt = performance.now();
        this.renderNow();
      });
    const wait = this.running ? this.renderedAt + LIVE_FRAME_MS - performance.now() : 0;
    if (wait > 0) setTimeout(frame, wait);
    else frame();
  }

  renderNow() {
    const entry = this.sessions.get(this.openId);
    if (!entry) return;
    const v = frameView(entry.state);
    if (!v.live) this.refreshContext(entry);
    this.transcript.setContext(entry.context);
    this.transcript.render(v, entry.inherited);
    if (entry.edits) {
      // back in a session with edits left open: as they were, or in the composer if their
      // message is no longer shown (a switch or an edit elsewhere meanwhile)
      const lost = this.branches.reopen(this.transcript.rowsEl, entry.edits);
      entry.edits = null;
      if (lost.length) {
        this.drafts.toComposer(
          lost,
          "Not sent: a message you were editing is no longer shown (another branch is). " +
            "Your edit is in the composer.",
        );
      }
    }
    const live = v.live;
    if (this.running !== !!live) {
      this.running = !!live;
      this.showHeader();
    }
    this.composer.busy = !!live;
    this.composer.setRunning(!!live && live.phase !== "cancelling");
    this.composer.renderQueue(v.queued || [], !live);
    this.renderMeter(v);
  }

  /** Settled history shows what the model no longer sees (the compression divider and the
   *  excluded turns): asked of the model-context layer once per settled log position. */
  async refreshContext(entry) {
    const seq = entry.state.lastSeq;
    if (entry.contextSeq === seq || entry.contextLoading) return;
    entry.contextLoading = true;
    try {
      const sid = entry.state.sessionId ?? this.openId;
      entry.context = await get(`/api/session/context?${q({ session_id: sid })}`);
      entry.contextSeq = seq;
    } catch {
      // the marks wait for the next settled render
    } finally {
      entry.contextLoading = false;
    }
    if (entry === this.sessions.get(this.openId)) this.scheduleRender();
  }

  renderMeter(v) {
    const window_ = this.health?.context_window;
    const last = [...v.messages].reverse().find((m) => m.role === "assistant" && m.usage);
    const meter = $("context-meter");
    if (!window_ && last && !this.healthAskedAgain) {
      // The server looks the window up at the first turn, after the page read /api/health.
      this.healthAskedAgain = true;
      get("/api/health").then((health) => {
        this.health = health;
        this.scheduleRender();
      });
    }
    if (!window_ || !last) {
      meter.hidden = true;
      return;
    }
    const used = last.usage.prompt_tokens + last.usage.completion_tokens;
    const share = Math.min(1, used / window_);
    meter.hidden = false;
    $("meter-fill").style.width = `${Math.round(share * 100)}%`;
    $("meter-bar").setAttribute("aria-valuenow", String(Math.round(share * 100)));
    $("meter-bar").setAttribute("aria-valuetext", `${Math.round(share * 100)}% of the context`);
    $("meter-text").textContent =
      `${Math.round(share * 100)}% of ${window_.toLocaleString()} tokens`;
  }

  setConn(state, detail = {}) {
    const offline = state === "reconnecting" || state === "stalled";
    this.transcript.setOffline(offline);
    this.composer.setOffline(offline);
    if (offline) this.notify("The server is unreachable. Reconnecting…", null, "offline");
    else if (this.noticeKind === "offline") this.clearNotice(); // back: the banner goes itself
    const el = $("conn");
    el.dataset.state = state;
    // A status is announced once: the live region's words change only with the state; the
    // count of events still to replay is shown beside it, outside the region.
    const text = state === "replaying" ? "Replaying events…" : (CONN_TEXT[state] ?? state);
    setText(el, text);
    $("conn-count").textContent = state === "replaying" ? String(detail.missing ?? "") : "";
  }

  clearNotice() {
    $("notice-bar").hidden = true;
    this.noticeKind = null;
  }

  notify(message, action, kind = "message") {
    this.noticeKind = kind;
    const bar = $("notice-bar");
    bar.replaceChildren(document.createTextNode(message));
    if (action) {
      const btn = document.createElement("button");
      btn.className = "btn";
      btn.textContent = action.label;
      btn.addEventListener("click", () => {
        bar.hidden = true;
        action.action();
      });
      bar.append(" ", btn);
    }
    const close = document.createElement("button");
    close.className = "chip-x";
    close.textContent = "×";
    close.setAttribute("aria-label", "Dismiss");
    close.addEventListener("click", () => {
      bar.hidden = true;
    });
    bar.append(" ", close);
    bar.hidden = false;
  }

  async call(fn) {
    try {
      return await fn();
    } catch (err) {
      this.notify(err.message);
      return null;
    }
  }

  async ensureSession() {
    if (this.openId) return this.openId;
    const sent = this.sidebar.stamp();
    const { session } = await post("/api/sessions", {});
    this.sidebar.onChanged({ session_id: session.session_id, row: session }, sent);
    this.drafts.adopt(session.session_id); // the New chat's draft goes with it
    await this.open(session.session_id, { push: true });
    return session.session_id;
  }

  send(text, files) {
    this.transcript.follow(); // a reader scrolled up sees their message and its answer come
    return this.submit("/api/chat/start", text, files);
  }

  /** Send or queue a message with the position of the view it was typed in (409 if another
   *  tab changed it; a queued message into an idle session starts at once, so it too). */
  async submit(route, text, files) {
    let sid;
    try {
      sid = await this.ensureSession();
      const after_seq = position(this, sid);
      await post(route, { session_id: sid, message: text, attachments: files, after_seq });
    } catch (err) {
      this.refused(err, text, files, sid);
    }
  }

  /** A refused send keeps its text (refusals.js); branches.js sends edits through it too. */
  refused(err, text, files, sid = this.openId) {
    return refused(this, err, text, files, sid);
  }

  async stop() {
    const entry = this.sessions.get(this.openId);
    const live = entry && liveScene(entry.state);
    const body = live ? { stream_id: live.stream_id } : { session_id: this.openId };
    await this.call(() => post("/api/chat/cancel", body));
  }

  async steer(text) {
    const sid = this.openId;
    const entry = this.sessions.get(sid);
    const live = entry && liveScene(entry.state);
    if (!live) {
      this.composer.restore(text);
      return;
    }
    try {
      const res = await post("/api/chat/steer", { stream_id: live.stream_id, text });
      if (res.accepted) this.ownSteers.add(res.steer_id);
      else {
        this.composer.restore(text);
        this.notify(res.reason);
      }
    } catch (err) {
      this.refused(err, text, [], sid);
    }
  }

  queue(text, files) {
    return this.submit("/api/chat/queue", text, files);
  }
}

const app = new App();
window.tether = app; // for debugging from the console
app.boot();
