// The sidebar: sessions grouped Pinned / Today / Yesterday / Older, kept current by the
// sidebar stream (`GET /api/events`). Each row is a link whose accessible name carries its
// title and its state ("running", "unread"); arrow keys move between rows.
import { del, get, patch, q } from "./api.js";
import { composing, h, patchChildren, setAttr, setHidden, setText } from "./dom.js";
import { recheckSignIn } from "./session_auth.js";
import { SidebarRelay } from "./sidebar_relay.js";
import { exportLinks } from "./transfer.js";

function groupOf(row, now = new Date()) {
  if (row.pinned) return "Pinned";
  const day = new Date(row.updated_at * 1000);
  const start = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  if (day.getTime() >= start) return "Today";
  if (day.getTime() >= start - 86_400_000) return "Yesterday";
  return "Older";
}
const GROUPS = ["Pinned", "Today", "Yesterday", "Older"];

/** "now", "5 min", "2 h", "3 d", then the date: how long ago a row last had activity. */
export function relativeTime(seconds, now = Date.now() / 1000) {
  const ago = Math.max(0, now - seconds);
  if (ago < 60) return "now";
  if (ago < 3600) return `${Math.floor(ago / 60)} min`;
  if (ago < 86_400) return `${Math.floor(ago / 3600)} h`;
  if (ago < 7 * 86_400) return `${Math.floor(ago / 86_400)} d`;
  return new Date(seconds * 1000).toLocaleDateString();
}
const FAILED = { error: "failed", interrupted: "interrupted" };

export class Sidebar {
  /** opts: unread (UnreadStore), onOpen(sid), onDeleted(sid), onChanged(row), notify(msg),
   *  onReread() (the list is read again where changes may have been missed: reread) */
  constructor(opts) {
    this.opts = opts;
    this.list = document.getElementById("session-list");
    this.search = document.getElementById("search");
    this.archivedToggle = document.getElementById("show-archived");
    this.rows = new Map();
    this.loads = 0; // lists asked for: only the last one's answer is drawn
    // The order in which this page learnt of each row (a request's rows date from when it
    // was sent, a stream's change from when it came): a row older than the newest one learnt
    // is dropped. Kept for deleted sessions too, so a late list does not bring one back, and
    // for rows a search left out, so a list that has them gets their newest.
    this.clock = 0;
    this.learnt = new Map(); // session_id -> {clock, row}: its newest row (null: deleted)
    this.busySeen = new Map();
    this.renderPending = false; // a draw is asked for the next frame (renderSoon)
    this.activeId = null;
    this.feed = null; // the feed's relay handle while it is the sidebar's own stream
    this.feedWanted = false; // no session stream carries the changes: the feed should follow
    this.feedRefusals = 0; // in a row, for the wait before connecting again
    this.feedTimer = null;
    this.relay = new SidebarRelay({
      onChange: (change) => this.onChanged(change),
      onGap: () => this.reread(),
    });
    this.searchTimer = null;
    this.search.addEventListener("input", () => {
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => this.load(), 200);
    });
    this.archivedToggle.addEventListener("change", () => this.load());
    this.list.addEventListener("keydown", (e) => this.onKey(e));
    document.addEventListener("click", (e) => {
      if (!e.target.closest?.(".row-menu, .row-menu-btn")) this.closeMenus();
    });
  }

  get filtering() {
    return this.search.value.trim() !== "" || this.archivedToggle.checked;
  }

  async load() {
    const params = {};
    if (this.archivedToggle.checked) params.archived = 1;
    if (this.search.value.trim()) params.q = this.search.value.trim();
    const asked = ++this.loads;
    const sent = this.stamp();
    const { sessions } = await get(`/api/sessions?${q(params)}`);
    if (asked !== this.loads) return; // a later load (another search, say) answers instead
    const rows = new Map();
    for (const listed of sessions) {
      const sid = listed.session_id;
      const row = this.newer(sid, sent, listed) ? listed : this.learnt.get(sid).row;
      if (row && this.visible(row)) {
        rows.set(sid, row);
        this.trackCompletion(row);
      }
    }
    // A session the list lacks but a stream brought after it was asked for (a new chat):
    // unless a search or the archive decides membership, it stays.
    for (const [sid, { clock, row }] of this.filtering ? [] : this.learnt) {
      if (!rows.has(sid) && clock > sent && row && this.visible(row)) rows.set(sid, row);
    }
    this.rows = rows;
    this.render();
  }

  /** The list read again where the streams may have missed changes (the page's first stream,
   *  a dropped one, a resync): a deletion missed is not told as one, so the page is told. */
  reread() {
    this.load();
    this.opts.onReread?.();
  }

  /** The clock for a request about to read rows (pass it to onChanged with its answer). */
  stamp() {
    return ++this.clock;
  }

  /** Whether `row` of `sid` (null: deleted), learnt at `clock`, is at least as new as the
   *  newest learnt, which it then becomes. A request reads what the server had once it
   *  arrived, so a change that came before it was sent is in its answer; one that came
   *  while it was on its way may be newer, and wins. */
  newer(sid, clock, row) {
    if ((this.learnt.get(sid)?.clock ?? 0) > clock) return false;
    this.learnt.set(sid, { clock, row });
    return true;
  }

  /** Follow the sidebar stream on its own connection (when no session stream carries it). */
  connectFeed() {
    this.feedWanted = true;
    if (this.feed || this.feedTimer) return;
    const feed = new EventSource("/api/events");
    const source = this.relay.add(() => feed.close());
    this.feed = source;
    feed.addEventListener("heartbeat", () => {
      this.feedRefusals = 0;
      source.frame();
    });
    feed.addEventListener("session.changed", (e) => {
      source.frame();
      source.change(JSON.parse(e.data));
    });
    feed.addEventListener("resync", () => {
      source.frame();
      this.reread();
    });
    feed.onerror = () => {
      source.lost(); // the browser reconnects it by itself, unless it was refused (signed out)
      recheckSignIn();
      if (feed.readyState === EventSource.CLOSED && this.feed === source) this.feedRefused();
    };
  }

  /** The feed was answered with a status (429: the client's stream slots are all held; 503),
   *  on which a browser gives up for good: connect again after a wait that grows with each
   *  refusal in a row, unless a session stream carries the changes by then. */
  feedRefused() {
    this.feed = null;
    this.feedRefusals += 1;
    const wait = Math.min(8000, 500 * 2 ** Math.min(this.feedRefusals - 1, 4));
    this.feedTimer = setTimeout(() => {
      this.feedTimer = null;
      if (this.feedWanted) this.connectFeed();
    }, wait);
  }

  /** The open session's stream carries the changes now: the feed gives way to it. */
  retireFeed() {
    this.feedWanted = false;
    clearTimeout(this.feedTimer);
    this.feedTimer = null;
    this.feed?.retire();
    this.feed = null;
  }

  visible(row) {
    if (this.archivedToggle.checked) return row.archived;
    return !row.archived && !row.continuation_session_id;
  }

  /** A row (or its deletion, `row: null`) from a stream, or read by a request sent at `clock`. */
  onChanged({ session_id: sid, row }, clock = this.stamp()) {
    if (!this.newer(sid, clock, row)) return;
    if (row) this.opts.onChanged?.(row);
    if (this.filtering && row && !this.rows.has(sid)) return; // the search decides membership
    if (!row || !this.visible(row)) this.rows.delete(sid);
    else {
      this.rows.set(sid, row);
      this.trackCompletion(row);
      // Seen as it arrives, not at the next draw: a switch to another session before that
      // draw would otherwise leave this one's new rows unread (a dot the user never earned).
      if (this.isActive(sid)) this.opts.unread.acknowledge(row);
    }
    if (!row) this.opts.onDeleted?.(sid);
    this.renderSoon();
  }

  /** Rows change in bursts (twenty runs starting at once are eighty changes): they are drawn
   * once per frame, not once each. A hidden page draws later; showing it draws at once. */
  renderSoon() {
    if (this.renderPending) return;
    this.renderPending = true;
    const draw = () => {
      if (this.renderPending) this.render();
    };
    if (document.visibilityState === "visible") requestAnimationFrame(draw);
    else setTimeout(draw, 200);
  }

  /** A run that finished while the session was not being viewed lights its dot, when it
   * brought something the reader has not seen. Recovery, shutdown, a restart and the reclaimer
   * also end a busy spell, but bring no activity (contract invariant 4): no dot. */
  trackCompletion(row) {
    const wasBusy = this.busySeen.get(row.session_id);
    this.busySeen.set(row.session_id, row.busy);
    if (wasBusy && !row.busy && !this.isActive(row.session_id) && this.opts.unread.hasUnread(row)) {
      this.opts.unread.markCompletion(row.session_id, row);
    }
  }

  isActive(sid) {
    return sid === this.activeId && document.visibilityState === "visible";
  }

  setActive(sid) {
    this.activeId = sid;
    this.render();
  }

  sorted() {
    return [...this.rows.values()].sort(
      (a, b) =>
        b.pinned - a.pinned ||
        b.updated_at - a.updated_at ||
        a.session_id.localeCompare(b.session_id),
    );
  }

  render() {
    this.renderPending = false;
    const now = new Date();
    const sorted = this.sorted();
    const specs = [];
    for (const name of GROUPS) {
      const rows = sorted.filter((r) => groupOf(r, now) === name);
      if (!rows.length) continue;
      specs.push({ key: `group:${name}`, group: name });
      for (const row of rows) specs.push({ key: row.session_id, row });
    }
    if (!specs.length) specs.push({ key: "empty", empty: this.emptyText() });
    patchChildren(
      this.list,
      specs,
      (spec) => this.build(spec),
      (el, spec) => this.update(el, spec),
    );
  }

  emptyText() {
    const query = this.search.value.trim();
    if (query) return `No session matches “${query}”.`;
    if (this.archivedToggle.checked) return "No archived sessions.";
    return "No sessions yet. Start one with New chat.";
  }

  build(spec) {
    if (spec.empty !== undefined) return h("p", { class: "sidebar-empty", role: "status" });
    if (spec.group) return h("div", { class: "group-label", role: "heading", "aria-level": 2 });
    const link = h(
      "a",
      { class: "session-link" },
      h("span", { class: "session-name", dir: "auto" }),

      h("span", { class: "running-dot" }),
      h("span", { class: "unread-dot" }),
    );
    link.addEventListener("click", (e) => {
      if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
      e.preventDefault();
      this.opts.onOpen(link.closest(".session-row").dataset.key);
    });
    const menuBtn = h("button", {
      type: "button",
      class: "row-menu-btn",
      text: "⋯",
      "aria-haspopup": "menu",
    });
    menuBtn.addEventListener("click", (e) => {
      e.stopPropagation();
      this.openMenu(menuBtn.closest(".session-row"));
    });
    // beside the link, not in it (its label says both, and its visible text is its title)
    const failed = h("span", { class: "session-failed", "aria-hidden": "true" });
    const when = h("span", { class: "session-when", "aria-hidden": "true" });
    return h("div", { class: "session-row" }, link, failed, when, menuBtn);
  }

  update(el, spec) {
    if (spec.empty !== undefined) {
      setText(el, spec.empty);
      return;
    }
    if (spec.group) {
      setText(el, spec.group);
      return;
    }
    const row = spec.row;
    const active = row.session_id === this.activeId;
    if (this.isActive(row.session_id)) this.opts.unread.acknowledge(row);
    const unread =
      !active && this.opts.unread.hasUnread(row, { active: this.isActive(row.session_id) });
    const link = el.querySelector(".session-link");
    setAttr(link, "href", `/s/${row.session_id}`);
    setAttr(link, "aria-current", active ? "page" : null);
    el.classList.toggle("active", active);
    setText(el.querySelector(".session-name"), row.title);
    const failed = row.busy ? undefined : FAILED[row.last_run_state];
    setText(el.querySelector(".session-failed"), failed ?? "");
    const when = relativeTime(row.updated_at);
    setText(el.querySelector(".session-when"), when);
    setHidden(el.querySelector(".running-dot"), !row.busy);
    setHidden(el.querySelector(".unread-dot"), !unread);
    const states = [
      row.busy && "running",
      failed && `last run ${failed}`,
      unread && "unread",
      row.pinned && "pinned",
      when,
    ].filter(Boolean);
    setAttr(link, "aria-label", [row.title, ...states].join(", "));
    setAttr(el.querySelector(".row-menu-btn"), "aria-label", `Actions for ${row.title}`);
  }

  closeMenus() {
    for (const menu of this.list.querySelectorAll(".row-menu")) menu.remove();
    for (const row of this.list.querySelectorAll(".menu-open")) row.classList.remove("menu-open");
  }

  openMenu(el) {
    this.closeMenus();
    const row = this.rows.get(el.dataset.key);
    if (!row) return;
    const next = this.neighbour(el);
    const item = (label, action, refocus = true) =>
      h("button", {
        type: "button",
        role: "menuitem",
        text: label,
        onclick: async (e) => {
          e.stopPropagation();
          this.closeMenus();
          await action();
          if (refocus) this.refocus(row.session_id, next);
        },
      });
    const menu = h(
      "div",
      { class: "row-menu", role: "menu" },
      item("Rename", () => this.rename(el, row), false), // its box takes the focus
      item(row.pinned ? "Unpin" : "Pin", () => this.update1(row, { pinned: !row.pinned })),
      item(row.archived ? "Unarchive" : "Archive", () =>
        this.update1(row, { archived: !row.archived }),
      ),
      ...exportLinks(row.session_id).map(({ label, href }) =>
        h("a", {
          role: "menuitem",
          href,
          download: true,
          text: label,
          onclick: (e) => {
            e.stopPropagation();
            this.closeMenus();
            this.refocus(row.session_id, next);
          },
        }),
      ),
      item("Delete…", () => this.remove(row)),
    );
    menu.addEventListener("keydown", (e) => {
      // focus returns to the menu's button; Tab goes on from there, leaving the menu closed
      // rather than walking its items with the menu left open behind the focus
      if (e.key === "Escape" || e.key === "Tab") {
        this.closeMenus();
        el.querySelector(".row-menu-btn").focus();
        return;
      }
      // a menu's items are walked with the arrow keys (round), Home and End (ARIA's menu)
      const items = [...menu.querySelectorAll('[role="menuitem"]')];
      const at = items.indexOf(document.activeElement);
      const to = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: items.length - 1 }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      items[(to + items.length) % items.length].focus();
    });
    el.classList.add("menu-open");
    el.append(menu);
    menu.querySelector("button").focus();
  }

  /** The key of the session row after `el` in the list, else of the one before it. */
  neighbour(el) {
    const rows = [...this.list.querySelectorAll(":scope > .session-row")];
    const at = rows.indexOf(el);
    return (rows[at + 1] ?? rows[at - 1])?.dataset.key ?? null;
  }

  /** After a row menu's action the item pressed is gone (and Pin moves the row, which takes
   *  the focus from it): the focus goes to the row's Actions button, or to the link of the
   *  row that took its place when it left the list, rather than to the page's body, where a
   *  keyboard user starts again from the top. A focus the user moved meanwhile stays (one
   *  still on the Delete dialog's button, closed and so not shown, is lost all the same). */
  refocus(sid, next) {
    const at = document.activeElement;
    if (at && at !== document.body && at.getClientRects().length > 0) return;
    this.render();
    const rows = [...this.list.querySelectorAll(":scope > .session-row")];
    const find = (key) => rows.find((r) => r.dataset.key === key);
    const target =
      find(sid)?.querySelector(".row-menu-btn") ??
      find(next)?.querySelector(".session-link") ??
      this.search;
    target.focus();
  }

  async update1(row, changes) {
    try {
      const sent = this.stamp();
      const { session } = await patch("/api/session", { session_id: row.session_id, ...changes });
      this.onChanged({ session_id: row.session_id, row: session }, sent);
    } catch (err) {
      this.opts.notify(err.message);
    }
  }

  rename(el, row) {
    const input = h("input", { class: "rename-input", dir: "auto", "aria-label": "New title" });
    input.value = row.title;
    const link = el.querySelector(".session-link");
    link.hidden = true;
    el.prepend(input);
    input.focus();
    input.select();
    let done = false;
    const finish = (save) => {
      if (done) return;
      done = true;
      input.remove();
      link.hidden = false;
      const title = input.value.trim();
      if (save && title && title !== row.title) this.update1(row, { title });
      link.focus();
    };
    input.addEventListener("keydown", (e) => {
      if (composing(e)) return;
      if (e.key === "Enter") finish(true);
      if (e.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
  }

  async remove(row) {
    const dialog = document.getElementById("confirm-dialog");
    document
      .getElementById("confirm-text")
      .replaceChildren(
        "Delete “",
        h("bdi", { text: row.title }),
        "”? Its messages and attachments are removed for good.",
      );
    dialog.showModal();
    const answer = await new Promise((resolve) =>
      dialog.addEventListener("close", () => resolve(dialog.returnValue), { once: true }),
    );
    if (answer !== "ok") return;
    try {
      await del(`/api/session?${q({ session_id: row.session_id })}`);
      this.opts.unread.deleteSession(row.session_id);
      this.onChanged({ session_id: row.session_id, row: null });
    } catch (err) {
      this.opts.notify(err.message);
    }
  }

  onKey(e) {
    if (e.key !== "ArrowDown" && e.key !== "ArrowUp") return;
    const links = [...this.list.querySelectorAll(".session-link:not([hidden])")];
    const index = links.indexOf(document.activeElement);
    if (index < 0) return;
    e.preventDefault();
    const next = links[index + (e.key === "ArrowDown" ? 1 : -1)];
    next?.focus();
  }
}
