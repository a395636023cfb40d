// What the user typed and has not sent, one draft per session (docs/page.md, "Drafts"): the
// composer's text and files, and the edits left open on its messages. The composer shows the
// draft of the session shown; a New chat has its own, which becomes its session's when that
// is created. Text and edits are kept in localStorage, by user and session, so a reload, a
// crashed tab or a browser closed and opened again finds them; files in IndexedDB
// (draft_files.js), read back when the draft is shown. Two tabs of one session: the last to
// write wins, and a draft another tab sent or emptied is gone in this one too. A deleted
// session's draft leaves: when a stream says so, and when the list is read again (at start,
// after a gap) and the server says the session is gone; then a rotated parent's draft moves
// to its continuation.

import { get, q } from "./api.js";
import { asDrafts } from "./branches.js";
import { DraftFiles } from "./draft_files.js";

export const NEW_CHAT = "new"; // the key of the New chat's draft (a session id never is)
const PREFIX = "tether-draft:v1:";
const SAVE_MS = 300; // typing is written at most this often (and at once when the tab hides)
const MAX_AGE_MS = 30 * 24 * 3600 * 1000; // a draft left this long is dropped
const MAX_CHARS = 1_000_000; // all of a browser's drafts together; the oldest go first

let sealed = false; // logged out: nothing is written again from this page
const fileStore = new DraftFiles();

function storage() {
  try {
    return window.localStorage ?? null;
  } catch {
    return null; // storage disabled (some privacy modes throw on access)
  }
}

/** Every stored draft key of `user` (all users' when `user` is undefined). */
function storedKeys(user) {
  const store = storage();
  const prefix = user === undefined ? PREFIX : `${PREFIX}${encodeURIComponent(user)}:`;
  const keys = [];
  try {
    for (let i = 0; i < (store?.length ?? 0); i++) {
      const key = store.key(i);
      if (key?.startsWith(prefix)) keys.push(key);
    }
  } catch {
    // unreadable storage holds nothing of ours
  }
  return keys;
}

function parse(raw) {
  try {
    const draft = JSON.parse(raw ?? "null");
    return draft && typeof draft.text === "string" && Array.isArray(draft.edits) ? draft : null;
  } catch {
    return null;
  }
}

/** What a draft holds, to tell whether it changed. */
function fingerprint({ text, edits, files }) {
  return JSON.stringify([text, edits, files.map((file) => [file.name, file.size])]);
}

/** Log out: this user's drafts, text and files, leave the browser (another person may use
 *  it next), and this page, about to go, writes none again. */
export async function forgetDrafts(user) {
  sealed = true;
  for (const key of storedKeys(user ?? "")) storage()?.removeItem(key);
  await fileStore.forget(`${PREFIX}${encodeURIComponent(user ?? "")}:`);
}

/** What became of those of `sids` the lists do not show (the default one and the archived
 *  one, each whole in one answer): `gone`, those whose own read says 404
 *  `session_not_found` (one in neither list may still be there), and `moved`: a rotated
 *  parent (in neither list) -> the listed session it continues in, found from the lists (a
 *  continuation's row names its parent) or else from its own row, once: its draft goes
 *  there, so no later load asks after it again. Throws when a list cannot be read: then
 *  nothing is proven. */
async function fates(sids) {
  const listed = new Set();
  const child = new Map(); // a listed continuation's parent -> it
  let unknown = sids;
  for (const params of [{}, { archived: 1 }]) {
    if (!unknown.length) break;
    for (const row of (await get(`/api/sessions?${q(params)}`)).sessions) {
      listed.add(row.session_id);
      if (row.parent_session_id) child.set(row.parent_session_id, row.session_id);
    }
    unknown = unknown.filter((sid) => !listed.has(sid) && !child.has(sid));
  }
  const gone = [];
  const moved = new Map();
  for (const sid of sids) {
    let at = sid;
    for (const seen = new Set(); !listed.has(at) && !seen.has(at); ) {
      seen.add(at);
      let next = child.get(at);
      try {
        next ??= (await get(`/api/session?${q({ session_id: at })}`)).session
          .continuation_session_id;
      } catch (err) {
        if (err.code === "session_not_found" && at === sid) gone.push(sid);
      }
      if (!next) break;
      at = next;
    }
    if (at !== sid && listed.has(at)) moved.set(sid, at);
  }
  return { gone, moved };
}

export class Drafts {
  /** `composer`: the Composer (draft(), setDraft(draft), restore(text, files));
   *  `editsShown()`: the edits left open in the session shown (`openEdits`, branches.js);
   *  `notify(message)`. */
  constructor({ composer, editsShown, notify }) {
    this.composer = composer;
    this.notify = notify;
    this.editsShown = editsShown;
    this.key = null; // the draft the composer shows: a session id, NEW_CHAT, or none yet
    this.user = null; // null: not known, so nothing is stored (this tab's memory only)
    this.memory = new Map(); // key -> {text, edits, files, at}: this tab's, files included
    this.seen = null; // the draft shown as last read or written (fingerprint)
    this.timer = null;
    this.files = fileStore;
    this.written = new Map(); // storage key -> {files, at} of its record, as this tab knows
    this.known = new Map(); // storage key -> `at` of its stored text as this tab last saw it
    this.loads = new Map(); // key -> its newest read of stored files (loadFiles)
    this.chain = Promise.resolve(); // the file store's reads and writes, one after another
    this.pending = 0; // of them, not done yet
    this.pruning = Promise.resolve();
    this.pruned = 0; // prunes done (a test waits for one)
    const transcript = document.getElementById("transcript"); // its edit boxes
    for (const type of ["input", "click"]) transcript.addEventListener(type, () => this.changed());
    window.addEventListener("pagehide", () => this.save());
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "hidden") this.save();
    });
  }

  /** Whose drafts these are (`GET /api/auth/status`'s `username`, "" without accounts);
   *  null when it could not be asked: then nothing is read or written. */
  setUser(user) {
    this.user = user;
    const now = Date.now();
    for (const key of storedKeys()) {
      const draft = parse(storage()?.getItem(key));
      if (!draft || !(now - draft.at < MAX_AGE_MS)) storage()?.removeItem(key);
    }
    if (user !== null) this.queue(() => this.files.dropOlderThan(now - MAX_AGE_MS));
  }

  /** Run `job` after the file store's earlier ones: a draft's files are read before they are
   *  written over, and written in the order they changed. */
  queue(job) {
    this.pending++;
    this.chain = this.chain
      .then(job)
      .catch(() => {}) // a failed read or write leaves the draft in this tab's memory
      .finally(() => this.pending--);
  }

  storageKey(key) {
    return `${PREFIX}${encodeURIComponent(this.user)}:${encodeURIComponent(key)}`;
  }

  /** `key`'s draft: the newer of this tab's and the stored one (another tab's, a reload's).
   *  This tab's, once seen stored and since taken out by another tab (sent, emptied), is
   *  gone here too, unless `keep` (a rescue: nothing typed is lost). */
  read(key, keep = false) {
    let mine = this.memory.get(key);
    const name = this.user === null ? null : this.storageKey(key);
    const stored = name === null ? null : parse(this.getItem(name));
    if (stored) this.known.set(name, stored.at);
    else if (!keep && mine && this.known.get(name) >= mine.at) {
      this.memory.delete(key);
      this.known.delete(name);
      this.written.delete(name); // what its files' record holds is not known here now
      mine = undefined;
    }
    const newer = stored && !(mine?.at >= stored.at) ? stored : mine;
    return { text: newer?.text ?? "", edits: newer?.edits ?? [], files: mine?.files ?? [] };
  }

  getItem(key) {
    try {
      return storage()?.getItem(key) ?? null;
    } catch {
      return null;
    }
  }

  write(key, { text, edits, files }) {
    const empty = !text.trim() && !edits.length && !files.length;
    const at = Date.now();
    if (empty) this.memory.delete(key);
    else this.memory.set(key, { text, edits, files, at });
    if (this.user === null || sealed) return;
    const name = this.storageKey(key);
    // another tab wrote or took out the stored draft since this one saw it: its files are
    // written again (this tab's idea of what the store holds is out of date)
    if (this.known.get(name) !== parse(this.getItem(name))?.at) this.written.delete(name);
    this.queue(() => this.syncFiles(key));
    try {
      this.known.delete(name);
      if (empty) storage()?.removeItem(name);
      else if (this.store(name, JSON.stringify({ text, edits, at }))) this.known.set(name, at);
    } catch {
      // storage unavailable: this tab's memory keeps the draft
    }
  }

  /** The file store gets `key`'s files as last written here, unless it holds them already. */
  async syncFiles(key) {
    const name = this.storageKey(key);
    const mine = this.memory.get(key);
    const files = mine?.files ?? [];
    const before = this.written.get(name)?.files;
    if (before?.length === files.length && before.every((file, i) => file === files[i])) return;
    this.written.set(name, { files, at: mine?.at ?? 0 });
    if (!files.length) return this.files.remove(name);
    const notice = await this.files.put(name, files, mine.at);
    if (notice) this.notify(notice);
  }

  /** `key`'s stored files, when written after `since` (when this tab last wrote its draft;
   *  0: never) and not by this tab itself since (a second `add`), take the place of `from`
   *  (the files this tab had for it), before any attached since, in this tab's draft and in
   *  the composer if it shows `key`. Only the newest read of a key does (an older one's
   *  `from` is out of date): never twice. */
  loadFiles(key, since, from, shown = null) {
    if (this.user === null) return;
    const read = {};
    this.loads.set(key, read);
    this.queue(async () => {
      const name = this.storageKey(key);
      const stored = this.loads.get(key) === read ? await this.files.get(name) : null;
      const ours = stored?.at === this.written.get(name)?.at;
      if (!stored || !(stored.at > since) || ours || this.loads.get(key) !== read) return;
      this.written.set(name, stored);
      const merged = (files) => [...stored.files, ...files.filter((file) => !from.includes(file))];
      const mine = this.memory.get(key);
      if (mine) mine.files = merged(mine.files);
      if (key !== this.key || shown === null) return;
      // shown as read: now as stored too (a tab that only shows it writes nothing back)
      const files = stored.files;
      if (this.seen === fingerprint(shown)) this.seen = fingerprint({ ...shown, files });
      this.composer.showFiles(merged(this.composer.draft().files));
      this.changed();
    });
  }

  /** `key`'s draft leaves: this tab's, the stored text and edits, and its files. */
  forget(key) {
    this.memory.delete(key);
    if (this.user === null) return;
    const name = this.storageKey(key);
    this.known.delete(name);
    try {
      storage()?.removeItem(name);
    } catch {
      // unreadable storage holds nothing of ours
    }
    this.queue(() => {
      this.written.set(name, { files: [], at: 0 });
      return this.files.remove(name);
    });
  }

  /** The session list was read again (at start, after a gap in the streams): a draft whose
   *  session the server says is gone leaves, one deleted while no page of this browser was
   *  there to see it, and a rotated parent's moves to its continuation. Any doubt keeps the
   *  draft. */
  prune() {
    this.pruning = this.pruning.then(async () => {
      try {
        if (this.user === null || sealed) return;
        const prefix = `${PREFIX}${encodeURIComponent(this.user)}:`;
        const names = new Set([...storedKeys(this.user), ...(await this.files.keys(prefix))]);
        const keys = [...names].map((name) => decodeURIComponent(name.slice(prefix.length)));
        const sids = keys.filter((key) => key !== NEW_CHAT);
        if (!sids.length) return;
        const { gone, moved } = await fates(sids);
        for (const sid of gone) if (sid !== this.key) this.forget(sid);
        if (moved.size) await this.exclusively((locked) => this.moveAll(moved, locked));
      } catch {
        // the server could not be asked: every draft stays
      } finally {
        this.pruned++;
      }
    });
  }

  /** Store one draft, within MAX_CHARS for all: the oldest others go first (this tab keeps
   *  its own copies of them), and when the browser's quota is reached anyway, older ones
   *  until it fits (or none is left). Whether it was stored. */
  store(name, value) {
    const store = storage();
    const others = storedKeys()
      .filter((key) => key !== name)
      .map((key) => ({ key, raw: store.getItem(key) ?? "" }))
      .map(({ key, raw }) => ({ key, size: key.length + raw.length, at: parse(raw)?.at ?? 0 }))
      .sort((a, b) => a.at - b.at);
    let total = others.reduce((sum, d) => sum + d.size, name.length + value.length);
    for (;;) {
      if (total <= MAX_CHARS) {
        try {
          store.setItem(name, value);
          return true;
        } catch {
          if (!others.length) throw new Error("no room for the draft");
        }
      }
      if (!others.length) return false; // alone over the cap: in this tab's memory only
      const dropped = others.shift();
      store.removeItem(dropped.key);
      this.known.delete(dropped.key);
      total -= dropped.size;
    }
  }

  /** Write the draft shown now (at once), if it changed here since it was shown: a tab that
   *  only shows a session must not write back over what another tab typed since. */
  save() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.key === null) return;
    const draft = { ...this.composer.draft(), edits: this.editsShown() };
    const seen = fingerprint(draft);
    if (seen === this.seen) return;
    this.seen = seen;
    this.write(this.key, draft);
  }

  /** Something was typed, attached or removed: written within SAVE_MS. */
  changed() {
    if (this.timer === null) this.timer = setTimeout(() => this.save(), SAVE_MS);
  }

  /** The composer shows `key`'s draft (the one shown before is saved first: `save`); the
   *  first time, what was typed while the page loaded is kept after it. */
  show(key) {
    const first = this.key === null;
    const draft = this.read(key);
    const since = this.memory.get(key)?.at ?? 0;
    const shown = { ...draft, files: [...draft.files] };
    this.key = key;
    this.seen = fingerprint(draft);
    if (first) {
      const typed = this.composer.draft();
      draft.text = [draft.text, typed.text].filter((text) => text.trim()).join("\n\n");
      draft.files.push(...typed.files);
      if (typed.text.trim() || typed.files.length) this.changed();
    }
    this.composer.setDraft(draft);
    this.loadFiles(key, since, shown.files, shown);
  }

  /** The New chat's session was created: its draft is that session's from now on. */
  adopt(sid) {
    if (this.key !== NEW_CHAT) return;
    this.save();
    this.write(sid, this.read(NEW_CHAT));
    this.write(NEW_CHAT, { text: "", edits: [], files: [] });
    this.key = sid;
  }

  /** The edits left open in session `sid` when it was last shown, or null. */
  edits(sid) {
    const { edits } = this.read(sid);
    return edits.length ? edits : null;
  }

  /** Text that belongs to session `key` (a send it refused): in its composer, first. */
  add(key, text, files = []) {
    if (key === this.key) {
      this.composer.restore(text, files);
      return;
    }
    const since = this.memory.get(key)?.at ?? 0;
    const draft = this.read(key);
    this.loadFiles(key, since, draft.files); // the stored ones are not written over
    draft.text = [text, draft.text].filter((part) => part.trim()).join("\n\n");
    draft.files = [...files, ...draft.files];
    this.write(key, draft);
  }

  /** Edits that can no longer be saved where they were typed go to the composer shown,
   *  never sent by themselves: the user decides where they go. */
  async toComposer(edits, notice) {
    for (const { text, kept } of edits) this.composer.restore(text, await asDrafts(kept));
    this.notify(notice);
  }

  /** Session `sid` is gone: its draft leaves the storage, and what was typed in it is not
   *  lost with it: into the composer shown, unsent, with a notice. */
  rescue(sid) {
    const since = this.memory.get(sid)?.at ?? 0;
    const { text, files, edits } = this.read(sid, true);
    const name = this.user === null ? null : this.storageKey(sid);
    this.queue(async () => {
      // its stored files, when newer than this tab's (a reload, another tab), go along
      const stored = name === null ? null : await this.files.get(name);
      this.rescued(text, stored?.at > since ? stored.files : files, edits);
    });
    this.forget(sid);
  }

  /** Run `work(locked)` while no other tab of this browser moves this user's drafts (a Web
   *  Lock, held until `work` is done); where the browser has no Web Locks (an insecure
   *  context), at once and unlocked. */
  exclusively(work) {
    const locks = navigator.locks;
    if (!locks) return work(false);
    return locks.request(`${PREFIX}${encodeURIComponent(this.user)}`, () => work(true));
  }

  /** Each [sid, to] of `moves`: `sid`'s draft, unless shown, moves to `to` (`move`), and,
   *  when `locked`, the lock is kept until the text and the files are written: another tab
   *  moving the same draft at once then finds it moved, never both adding it. */
  async moveAll(moves, locked) {
    for (const [sid, to] of moves) if (sid !== this.key) this.move(sid, to, locked);
    if (!locked) return;
    for (let tail; tail !== this.chain; ) {
      tail = this.chain; // a job run queues more (`add`): waited for too
      await tail;
    }
  }

  /** Session `sid` continues in `to` (rotated): its draft, files and open edits included,
   *  becomes `to`'s, before what `to` has (a send from `sid` would go there too). `locked`
   *  (no other tab moves drafts meanwhile): the draft as stored now decides, so this tab's
   *  copy of one another tab has moved already is not moved again (`read`); unlocked, this
   *  tab's copy moves in any case (nothing typed is lost). */
  move(sid, to, locked = false) {
    const { text, files, edits } = this.read(sid, !locked);
    const since = this.memory.get(sid)?.at ?? 0;
    const name = this.storageKey(sid);
    this.queue(async () => {
      const stored = await this.files.get(name);
      const typed = edits.filter((edit) => edit.text.trim());
      const kept = [];
      for (const edit of typed) kept.push(...(await asDrafts(edit.kept)));
      const all = [...typed.map((edit) => edit.text), text].filter((t) => t.trim());
      const moving = [...kept, ...(stored?.at > since ? stored.files : files)];
      if (all.length || moving.length) this.add(to, all.join("\n\n"), moving);
    });
    this.forget(sid);
  }

  /** What was typed in a deleted session: into the composer shown, unsent, with a notice. */
  rescued(text, files, edits) {
    const typed = edits.filter((edit) => edit.text.trim());
    if (text.trim() || files.length) {
      this.composer.restore(text, files);
      if (!typed.length) {
        this.notify(
          "A session was deleted before you sent what you typed in it: it is in the composer.",
        );
      }
    }
    if (typed.length) {
      this.toComposer(
        typed,
        "A session was deleted while you were editing one of its messages: " +
          "your edit is in the composer, unsent.",
      );
    }
  }
}
