// The files attached to drafts (docs/page.md, "Drafts"), kept in IndexedDB so that a reload,
// a crashed tab or a closed browser finds them: localStorage holds a few megabytes of strings,
// IndexedDB binary data. One record per draft, under the draft's localStorage key (docs/api.md
// §7): `{at, bytes, files: [{name, mime, blob}]}`, the files in the composer's order. Bounded:
// a file over MAX_FILE_BYTES, or one that would take all drafts' files over MAX_TOTAL_BYTES,
// is not kept (it stays attached in the tab, and the user is told which). A browser whose
// IndexedDB is missing or throws keeps files in the tab's memory only, as before; the user
// is told once, when a file would have been kept. One store for the page (drafts.js, and Log
// out in session_auth.js).

import { asDraft } from "./composer.js";

const DB = "tether-drafts";
const STORE = "files";
const MiB = 1024 * 1024;
const MAX_FILE_BYTES = 20 * MiB; // the server's limit for one attachment (docs/api.md §1)
const MAX_TOTAL_BYTES = 50 * MiB; // all drafts' files in this browser, every user's

const finished = (tx) =>
  new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error ?? new Error("aborted"));
  });

/** The keys from `prefix` on that start with it (an IDBKeyRange). */
const startingWith = (prefix) => IDBKeyRange.bound(prefix, `${prefix}\uffff`);

/** A draft file's bytes: decoded once from the base64 the composer sends. */
const blobs = new WeakMap();
function blobOf(file) {
  if (!blobs.has(file)) {
    const text = atob(file.data_base64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    blobs.set(file, new Blob([bytes], { type: file.mime }));
  }
  return blobs.get(file);
}

const sizeOf = (file) => file.size ?? blobOf(file).size;

const mib = (bytes) => `${bytes / MiB} MiB`;

export class DraftFiles {
  constructor() {
    this.db = null; // the opened database (a promise), once asked for
    this.sealed = false; // logged out: nothing is written again from this page
    this.toldUnavailable = false;
    this.told = new WeakSet(); // files already named in a notice: not named at every save
  }

  open() {
    this.db ??= new Promise((resolve, reject) => {
      const request = indexedDB.open(DB, 1); // throws where IndexedDB is refused
      request.onupgradeneeded = () => request.result.createObjectStore(STORE);
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
      request.onblocked = () => reject(new Error("blocked"));
    });
    return this.db;
  }

  /** Run `work(store)` in one transaction; its result once the transaction is complete. */
  async run(mode, work) {
    const db = await this.open();
    if (mode === "readwrite" && this.sealed) return undefined;
    const tx = db.transaction(STORE, mode);
    const result = work(tx.objectStore(STORE));
    await finished(tx);
    return result instanceof IDBRequest ? result.result : result;
  }

  /** The files stored under `name`, as composer drafts, with when they were written; null
   *  when there are none, or they cannot be read. */
  async get(name) {
    try {
      const record = await this.run("readonly", (store) => store.get(name));
      if (!record) return null;
      const files = [];
      for (const file of record.files) files.push(await asDraft(file.blob, file.name, file.mime));
      return { at: record.at, files };
    } catch {
      return null;
    }
  }

  /** Keep `files` under `name` (written at `at`), those that fit the caps. What the user
   *  is to be told, or null: the files not kept (each once), or, the first time, that none
   *  can be. The total is read and the record written in one readwrite transaction: another
   *  tab's write waits for it (IndexedDB runs them one at a time), so two tabs saving at
   *  once cannot both take the room left. */
  async put(name, files, at) {
    try {
      const left = []; // what the user is told: each file not kept, once
      await this.run("readwrite", (store) =>
        this.bytesBesides(store, name, (total) => {
          const record = this.record(files, at, total, left);
          if (record.files.length) store.put(record, name);
          else store.delete(name);
        }),
      );
      if (!left.length) return null;
      return `Attached, but not kept for a reload (the text is): ${left.join("; ")}.`;
    } catch {
      if (this.toldUnavailable) return null;
      this.toldUnavailable = true;
      return (
        "This browser does not keep attached files across a reload (its storage refused " +
        "them): they stay attached in this tab only. The text is kept."
      );
    }
  }

  /** The record of those of `files` that fit beside `total` bytes of other drafts' files;
   *  each one left out, named once, goes to `left`. */
  record(files, at, total, left) {
    const kept = [];
    for (const file of files) {
      const size = sizeOf(file);
      let why = null;
      if (size > MAX_FILE_BYTES) why = `over ${mib(MAX_FILE_BYTES)}, the server's limit`;
      else if (total + size > MAX_TOTAL_BYTES) {
        why = `over the ${mib(MAX_TOTAL_BYTES)} kept for all drafts' files`;
      }
      if (why === null) {
        kept.push(file);
        total += size;
      } else if (!this.told.has(file)) {
        this.told.add(file);
        left.push(`${file.name} (${why})`);
      }
    }
    return {
      at,
      bytes: kept.reduce((sum, file) => sum + sizeOf(file), 0),
      files: kept.map((file) => ({ name: file.name, mime: file.mime, blob: blobOf(file) })),
    };
  }

  /** `then(total)` with the bytes every record but `name` holds, within the transaction. */
  bytesBesides(store, name, then) {
    let total = 0;
    const cursor = store.openCursor();
    cursor.onsuccess = () => {
      const at = cursor.result;
      if (!at) return then(total);
      if (at.key !== name) total += at.value.bytes ?? 0;
      at.continue();
    };
  }

  /** Take `name`'s files out (sent, cleared, its session deleted); quietly where the
   *  storage cannot be used: there is nothing in it then. */
  async remove(name) {
    try {
      await this.run("readwrite", (store) => store.delete(name));
    } catch {
      // nothing stored can be left where nothing could be stored
    }
  }

  /** The draft keys with files stored that start with `prefix`. */
  async keys(prefix) {
    try {
      return await this.run("readonly", (store) => store.getAllKeys(startingWith(prefix)));
    } catch {
      return [];
    }
  }

  /** Records written before `at` leave (every user's: a draft left 30 days). */
  async dropOlderThan(at) {
    try {
      await this.run("readwrite", (store) => {
        const cursor = store.openCursor();
        cursor.onsuccess = () => {
          const record = cursor.result;
          if (!record) return;
          if (!(record.value?.at >= at)) record.delete();
          record.continue();
        };
      });
    } catch {
      // unreadable storage holds nothing of ours
    }
  }

  /** Log out: the files of every draft whose key starts with `prefix` leave, and this page
   *  writes none again. */
  async forget(prefix) {
    this.sealed = true;
    try {
      const db = await this.open();
      const tx = db.transaction(STORE, "readwrite");
      tx.objectStore(STORE).delete(startingWith(prefix));
      await finished(tx);
    } catch {
      // nothing stored can be left where nothing could be stored
    }
  }
}
