"""The SQLite event log: one writer thread, group commit, publish after commit.

Shape taken from Datasette's database.py: every write is a message to one writer thread, which
drains whatever is queued into one transaction (group commit: 50 concurrent appenders cost one
fsync per batch), allocates `seq` and inserts the row in the same critical section (contract:
run-journal sequence publication), commits, and only then publishes to live subscribers in seq
order. Reads use their own connections and never write.

Durability: WAL with `synchronous=FULL`, so a commit is on disk (WAL fsynced) before `append`
returns; an acknowledged event survives `kill -9` and power loss. FULL instead of NORMAL costs
one fsync per batch, which group commit amortises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.events import RUN_FINISHED, TURN_SUBMITTED, Event
from tether.log import compact_json, owners, sqlite_search
from tether.log.errors import (
    InvalidEvent,
    LogError,
    SessionExists,
    SessionNotFound,
    StorageError,
    StreamClosed,
)
from tether.log.migrations import apply_migrations
from tether.log.private import FILE_MODE, private_file, tighten
from tether.log.sqlite_open import (
    connect,
    refuse_cut_short,
    refuse_foreign,
    refuse_read_only,
    row_to_event,
)
from tether.log.sqlite_reads import SQLiteReads
from tether.log.store import Draft, IndexFold, SearchFold, StreamEvents
from tether.log.subscriptions import Hub

log = logging.getLogger("tether.log")

_MAX_BATCH = 1000
_CLOSED_STREAM_CACHE = 50_000


@dataclass(eq=False)
class _Op:
    kind: str  # "create" | "append" | "delete" | "create_many" | "claim"
    session_id: str = ""
    drafts: list[Draft] = field(default_factory=list)
    many: list[tuple[str, list[Draft]]] = field(default_factory=list)  # "create_many"
    owner: str | None = None  # create(_many): the new sessions'; claim: who takes the unowned
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


_dumps = compact_json.dumps


def _encode(draft: Draft) -> str:
    """The row's JSON, or InvalidEvent for data that JSON or UTF-8 cannot carry (a lone
    surrogate would otherwise fail inside SQLite, mid-batch)."""
    try:
        payload = _dumps(draft.data)
        payload.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # a UnicodeEncodeError is a ValueError
        raise InvalidEvent(f"{draft.type}: {exc}") from exc
    return payload


class SQLiteEventStore(SQLiteReads):
    """The `log.store.EventStore` backend on one SQLite file; see the module docstring.
    `index_fold` is the per-session fold (the sidebar row) that is kept in the same
    transaction as the events; `index_version` names its code, so a new fold rebuilds the
    index from the log at start instead of trusting stale state. The writer keeps every
    session's last seq and index state in memory, so those reads cost no query.
    `search_fold` (with `search_version`) names the rows the full-text index holds
    (log/sqlite_search.py); without one nothing is indexed and `search` finds nothing."""

    def __init__(
        self,
        path: Path | str,
        *,
        index_fold: IndexFold,
        index_version: str,
        search_fold: SearchFold | None = None,
        search_version: str | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.path = Path(path)
        self._fold = index_fold
        self._search_fold = search_fold
        self._clock = clock
        self._hub: Hub | None = None
        self._readers: list[sqlite3.Connection] = []
        self._reader_local = threading.local()
        self._readers_lock = threading.Lock()
        self._closed_streams: dict[str, bool] = {}
        try:
            refuse_read_only(self.path)
            private_file(self.path)  # before SQLite would create it 0644
            for leftover in (Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                if leftover.exists():
                    tighten(leftover, FILE_MODE)
            self._db = connect(self.path)
            refuse_foreign(self._db, self.path)  # before anything below writes to the file
            refuse_cut_short(self._db, self.path)
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StorageError(f"{self.path}: could not switch to WAL (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            apply_migrations(self._db, str(self.path))
            self._last_seq, self._index = self._load_index(index_version)
            sqlite_search.ensure_index(self._db, search_fold, search_version, index_fold)
            self._stream_events = sqlite_search.stream_reader(self._db)
            # What readers see: updated only after COMMIT, so a reader never learns of a seq
            # that it cannot read yet. The writer works on _last_seq / _index.
            self._visible_seq = dict(self._last_seq)
            self._visible_index = dict(self._index)
            # Who owns each session (docs/api.md §15), as committed; changed by the writer
            # only after COMMIT, like the visible index.
            self._owners: dict[str, str] = dict(
                self._db.execute("SELECT session_id, owner FROM session_owners")
            )
            self._owner_changes: dict[str, str | None] = {}
        except sqlite3.DatabaseError as exc:
            raise StorageError(
                f"Cannot open the Tether database {self.path}: {exc}. "
                "The file was left as it is; restore it from a backup or move it aside."
            ) from exc
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._closing = False  # set by the writer as it ends; `_submit` refuses from then on
        self._submit_lock = threading.Lock()
        self._thread = threading.Thread(target=self._writer_loop, name="tether-log-writer")
        self._thread.daemon = True
        self._thread.start()

    # -- start-up ---------------------------------------------------------------------------
    def _load_index(self, version: str) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        db = self._db
        stored_version = db.execute("SELECT value FROM meta WHERE key='index_version'").fetchone()
        last_seq = dict(db.execute("SELECT session_id, MAX(seq) FROM events GROUP BY session_id"))
        index: dict[str, dict[str, Any]] = {}
        stale = set(last_seq)
        if stored_version and stored_version[0] == version:
            stored = db.execute("SELECT session_id, last_seq, state FROM session_index")
            for sid, seq, state in stored:
                if last_seq.get(sid) == seq:
                    index[sid] = json.loads(state)
                    stale.discard(sid)
        if stale or not stored_version or stored_version[0] != version:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "DELETE FROM session_index WHERE session_id NOT IN "
                "(SELECT DISTINCT session_id FROM events)"
            )
            for sid in stale:
                state = None
                rows = db.execute(
                    "SELECT session_id, seq, type, at, stream_id, turn_id, data FROM events "
                    "WHERE session_id=? ORDER BY seq",
                    (sid,),
                )
                for row in rows:
                    state = self._fold(state, row_to_event(row))
                assert state is not None
                index[sid] = state
                db.execute(
                    "INSERT OR REPLACE INTO session_index VALUES (?, ?, ?)",
                    (sid, last_seq[sid], _dumps(state)),
                )
            db.execute("INSERT OR REPLACE INTO meta VALUES ('index_version', ?)", (version,))
            db.execute("COMMIT")
        return last_seq, index

    def attach_hub(self, hub: Hub | None) -> None:
        """Committed batches go to `hub` from now on (None: nobody is listening)."""
        self._hub = hub

    # -- writes -----------------------------------------------------------------------------
    def _submit(self, op: _Op) -> concurrent.futures.Future:
        with self._submit_lock:
            if self._closing:
                raise StorageError("the log is closed")
            self._queue.put(op)
        return op.future

    def submit_append(self, session_id: str, drafts: list[Draft]) -> concurrent.futures.Future:
        """Thread-safe append for callers outside the event loop (runtime callback threads)."""
        return self._submit(_Op("append", session_id, list(drafts)))

    async def create_session(
        self, session_id: str, drafts: list[Draft], owner: str | None = None
    ) -> list[Event]:
        op = _Op("create", session_id, list(drafts), owner=owner)
        return await asyncio.wrap_future(self._submit(op))

    async def session_owner(self, session_id: str) -> str | None:
        return self._owners.get(session_id)

    async def claim_unowned(self, owner: str) -> int:
        claimed = await asyncio.wrap_future(self._submit(_Op("claim", owner=owner)))
        return len(claimed)

    async def create_sessions(
        self, sessions: list[tuple[str, list[Draft]]], owner: str | None = None
    ) -> list[list[Event]]:
        op = _Op("create_many", many=[(sid, list(drafts)) for sid, drafts in sessions], owner=owner)
        return await asyncio.wrap_future(self._submit(op))

    async def append(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        return await asyncio.wrap_future(self.submit_append(session_id, drafts))

    async def delete_session(self, session_id: str, *, only_idle: bool = False) -> None:
        # only_idle: this one process's run registry has decided, under the session lock
        await asyncio.wrap_future(self._submit(_Op("delete", session_id)))

    def _writer_loop(self) -> None:
        try:
            self._write_until_closed()
        finally:  # what was queued behind the close (or a writer that died) is answered
            with self._submit_lock:
                self._closing = True
            while True:
                try:
                    left = self._queue.get_nowait()
                except queue.Empty:
                    break
                if left is not None and left.future.set_running_or_notify_cancel():
                    left.future.set_exception(StorageError("the log is closed"))

    def _write_until_closed(self) -> None:
        stop = False
        while not stop:
            op = self._queue.get()
            if op is None:
                break
            batch = [op]
            while len(batch) < _MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            # A caller that gave up before its batch began writes nothing; from here on its
            # future cannot be cancelled, so a late cancel loses only its answer (as a dropped
            # connection would) and never the writer (set_result on a cancelled future raises).
            batch = [op for op in batch if op.future.set_running_or_notify_cancel()]
            if batch:
                self._write_batch(batch)

    def _write_batch(self, batch: list[_Op]) -> None:
        outcomes: list[tuple[_Op, Any]] = []  # events, a list of them per session, or LogError
        undo_seq: dict[str, int | None] = {}
        undo_index: dict[str, dict[str, Any] | None] = {}
        deleted: list[str] = []
        self._owner_changes = {}
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for op in batch:
                if op.kind == "claim":
                    outcomes.append((op, self._claim(op.owner or "")))
                    continue
                sid = op.session_id
                for one in [sid] if op.kind != "create_many" else [s for s, _ in op.many]:
                    if one not in undo_seq:
                        undo_seq[one] = self._last_seq.get(one)
                        undo_index[one] = self._index.get(one)
                try:
                    if op.kind == "create_many":
                        outcomes.append((op, self._insert_many(op)))
                    elif op.kind == "delete":
                        self._delete(sid)
                        deleted.append(sid)
                        outcomes.append((op, []))
                    else:
                        outcomes.append((op, self._insert(op)))
                except LogError as exc:
                    outcomes.append((op, exc))
            for sid in undo_seq:
                state = self._index.get(sid)
                if state is None:
                    self._db.execute("DELETE FROM session_index WHERE session_id=?", (sid,))
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO session_index VALUES (?, ?, ?)",
                        (sid, self._last_seq[sid], _dumps(state)),
                    )
            self._db.execute("COMMIT")
        except Exception as exc:  # anything: the batch is rolled back whole, the writer lives on
            self._owner_changes = {}
            self._rollback(undo_seq, undo_index)
            if not isinstance(exc, sqlite3.Error):
                log.exception("log writer: batch failed")
            error = StorageError(f"could not write to {self.path}: {exc}")
            for op in batch:
                op.future.set_exception(error)
            return
        for sid in undo_seq:
            if sid in self._last_seq:
                self._visible_seq[sid] = self._last_seq[sid]
                self._visible_index[sid] = self._index[sid]
            else:
                self._visible_seq.pop(sid, None)
                self._visible_index.pop(sid, None)
        for sid, owner in self._owner_changes.items():
            if owner is None:
                self._owners.pop(sid, None)
            else:
                self._owners[sid] = owner
        self._publish(outcomes, deleted)

    def _rollback(self, undo_seq: dict[str, int | None], undo_index: dict) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")
        for sid, seq in undo_seq.items():
            if seq is None:
                self._last_seq.pop(sid, None)
                self._index.pop(sid, None)
            else:
                self._last_seq[sid] = seq
                self._index[sid] = undo_index[sid]
        self._closed_streams.clear()

    def _publish(self, outcomes: list, deleted: list[str]) -> None:
        hub = self._hub
        committed = [
            ev
            for op, result in outcomes
            if isinstance(result, list) and op.kind not in ("create_many", "claim")
            for ev in result
        ]
        # Many sessions created at once (an import) go out one session per batch, so the loop
        # serves other work between them instead of dispatching every event in one callback.
        created = [
            events
            for op, result in outcomes
            if op.kind == "create_many" and isinstance(result, list)
            for events in result
        ]
        if hub is not None:
            try:
                if committed:
                    hub.publish(committed)
                for events in created:
                    hub.publish(events)
                for sid in deleted:
                    hub.publish_deleted(sid)
            except RuntimeError:  # the loop is gone: the server is shutting down
                pass
        for op, result in outcomes:
            if op.kind == "claim":
                op.future.set_result(result)
            elif isinstance(result, LogError):
                op.future.set_exception(result)
            else:
                op.future.set_result(result)

    def _insert(self, op: _Op) -> list[Event]:
        checked = self._check(op.kind, op.session_id, op.drafts)
        events = self._write(op.session_id, op.drafts, *checked)
        if op.kind == "create":
            self._own(op.session_id, op.owner)
        return events

    def _own(self, sid: str, owner: str | None) -> None:
        """Record a new session's owner, in the transaction that creates it."""
        if owner is not None:
            self._db.execute("INSERT OR REPLACE INTO session_owners VALUES (?, ?)", (sid, owner))
            self._owner_changes[sid] = owner

    def _insert_many(self, op: _Op) -> list[list[Event]]:
        """Every session is checked before any is written, so a refusal writes none."""
        if len({sid for sid, _ in op.many}) != len(op.many):
            raise SessionExists("the same session twice in one creation")
        finished_here: set[str] = set()  # one session's finished stream closes it for all
        checked = []
        for sid, drafts in op.many:
            checked.append(self._check("create", sid, drafts, finished_here))
            finished_here |= checked[-1][1]
        written = [
            self._write(sid, drafts, *check)
            for (sid, drafts), check in zip(op.many, checked, strict=True)
        ]
        for sid, _ in op.many:
            self._own(sid, op.owner)
        return written

    def _check(
        self, kind: str, sid: str, drafts: list[Draft], closed: set[str] | None = None
    ) -> tuple[int, set[str], list[str]]:
        """Refuse before writing anything: the last seq, the streams this append finishes
        and each draft's JSON."""
        last = self._last_seq.get(sid)
        if kind == "create":
            if last is not None:
                raise SessionExists(sid)
            last = 0
        elif last is None:
            raise SessionNotFound(sid)
        finishing: set[str] = set()
        for draft in drafts:
            if draft.stream_id is not None:
                sealed = draft.stream_id in finishing or draft.stream_id in (closed or ())
                if sealed or self._stream_closed(draft.stream_id):
                    raise StreamClosed(draft.stream_id)
                if draft.type == RUN_FINISHED:
                    finishing.add(draft.stream_id)
        return last, finishing, [_encode(draft) for draft in drafts]

    def _write(
        self, sid: str, drafts: list[Draft], last: int, finishing: set[str], payloads: list[str]
    ) -> list[Event]:
        now = self._clock()
        state = self._index.get(sid)
        events = []
        # A session created here has its whole log in this call: the search fold reads its
        # streams from memory instead of back from the file (an import: one read per run).
        streams: dict[str, list[Event]] | None = {} if last == 0 else None
        read_stream = self._stream_events if streams is None else _from_memory(streams)
        for draft, payload in zip(drafts, payloads, strict=True):
            last += 1
            at = now if draft.at is None else draft.at
            event = Event(sid, last, draft.type, at, draft.data, draft.stream_id, draft.turn_id)
            if streams is not None and draft.stream_id is not None:
                streams.setdefault(draft.stream_id, []).append(event)
            self._db.execute(
                "INSERT INTO events (session_id, seq, type, at, stream_id, turn_id, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, last, draft.type, at, draft.stream_id, draft.turn_id, payload),
            )
            if draft.type in owners.CARRIERS:
                owners.record(self._db, sid, draft.data, draft.blobs)
            if draft.type == TURN_SUBMITTED:
                sqlite_search.record_turn_text(self._db, sid, event)
            if self._search_fold is not None:
                change = self._search_fold(state, event, read_stream)
                if change.add:
                    sqlite_search.apply_change(self._db, sid, change)
            state = self._fold(state, event)
            events.append(event)
        for stream_id in finishing:
            self._closed_streams[stream_id] = True
        self._last_seq[sid] = last
        if state is not None:
            self._index[sid] = state
        return events

    def _claim(self, owner: str) -> list[str]:
        unowned = [
            sid
            for sid in self._last_seq
            if sid not in self._owners and self._owner_changes.get(sid) is None
        ]
        for sid in unowned:
            self._db.execute("INSERT OR IGNORE INTO session_owners VALUES (?, ?)", (sid, owner))
            self._owner_changes[sid] = owner
        return unowned

    def _stream_closed(self, stream_id: str) -> bool:
        closed = self._closed_streams.get(stream_id)
        if closed is None:
            if len(self._closed_streams) > _CLOSED_STREAM_CACHE:
                self._closed_streams.clear()
            closed = (
                self._db.execute(
                    "SELECT 1 FROM events WHERE stream_id=? AND type=? LIMIT 1",
                    (stream_id, RUN_FINISHED),
                ).fetchone()
                is not None
            )
            self._closed_streams[stream_id] = closed
        return closed

    def _delete(self, sid: str) -> None:
        if sid not in self._last_seq:
            raise SessionNotFound(sid)
        self._db.execute("DELETE FROM events WHERE session_id=?", (sid,))
        owners.forget(self._db, sid)
        sqlite_search.forget(self._db, sid)
        self._db.execute("DELETE FROM session_owners WHERE session_id=?", (sid,))
        self._owner_changes[sid] = None
        del self._last_seq[sid]
        self._index.pop(sid, None)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """`aclose` for callers without an event loop (tests, bench, tools)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        self._db.close()


def _from_memory(streams: dict[str, list[Event]]) -> StreamEvents:
    """`StreamEvents` over the streams of the events written so far (seq order)."""

    def stream_events(stream_id: str, types: frozenset[str]) -> list[Event]:
        return [event for event in streams.get(stream_id, ()) if event.type in types]

    return stream_events
