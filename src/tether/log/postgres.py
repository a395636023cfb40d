"""The PostgreSQL event log, shared by any number of replicas (docs/operations.md).

Writes keep the SQLite backend's shape per replica: every write is a message to one writer
task, which drains whatever is queued into one transaction (group commit); a second batch may
be written while the first waits for its commit, on sessions the first does not hold. Seqs
come from the per-session counter row (`sessions.last_seq`, log/pg_schema.py), locked with
`SELECT ... FOR UPDATE` in the transaction that inserts the events, so they are contiguous
whatever the number of writers and replicas. A batch locks its sessions in one fixed order
(by session id), so two replicas' batches never deadlock. The index fold state is updated in
the same row and transaction. Right behind the COMMIT, in the same round trip, the writer sends a
NOTIFY naming the sessions and their new last seqs; publication to the Hub goes through
log/pg_fanout.py, with the log as the only source.

Durability: PostgreSQL's default `synchronous_commit=on`, so COMMIT returns once the WAL is
flushed: an acknowledged append survives `kill -9` of the replica and of the database server.

Admission is the database's too: the counter row names the session's unfinished run
(`open_stream`, set by its `turn.submitted`, cleared by its `run.finished`), so a second
`turn.submitted` with a stream is refused with SessionOccupied (409 `session_busy`) whichever
replica sends it, in the same locked transaction. Stop is recorded once per run the same way
(`cancel_stream`): a second `run.cancel_requested` of the run is refused with CancelRequested;
and an answer once per prompt (`answered`): a second `approval.answered` / `clarify.answered`
of the same prompt is refused with PromptAnswered.

Reads go to the database (a connection pool), never to process memory: another replica may
have written since. The only cache is of streams known to be finished, which stays true.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether.events import (
    APPROVAL_ANSWERED,
    CLARIFY_ANSWERED,
    QUEUE_ADDED,
    RUN_CANCEL_REQUESTED,
    RUN_FINISHED,
    TURN_SUBMITTED,
    Event,
    new_id,
)
from tether.log import owners, pg_counters, pg_leases, pg_owners, pg_rows, pg_search
from tether.log.errors import (
    CancelRequested,
    LogError,
    PromptAnswered,
    RunTakenOver,
    SessionExists,
    SessionNotFound,
    SessionOccupied,
    StorageError,
    StreamClosed,
)
from tether.log.pg_fanout import CHANNEL, NOTIFY_SQL, Fanout, payloads
from tether.log.pg_reads import PostgresReads
from tether.log.pg_rows import (
    INSERT_EVENTS_SQL,
    Batch,
    Op,
    as_columns,
    encode,
    flat,
    redact,
    restore,
    snapshot,
    storage_error,
    take_runnable,
    was_committed,
)
from tether.log.pg_schema import apply_migrations
from tether.log.store import Draft, IndexFold, OpenStream, SearchFold
from tether.log.subscriptions import Hub

log = logging.getLogger("tether.log")

_MAX_BATCH = 1000
_IN_FLIGHT = 2  # batches being written at once, each on its own connection
_CLOSED_STREAM_CACHE = 50_000
_ANSWERS = {APPROVAL_ANSWERED: "approval_id", CLARIFY_ANSWERED: "question_id"}


class PostgresEventStore(PostgresReads):
    """The `log.store.EventStore` backend on one PostgreSQL database; see the module docstring.
    Opening applies the migrations and rebuilds stale index states (synchronously, so a bad
    URL fails at start with a clear message); the pool, the writer and the listener start on
    first use inside the event loop."""

    storage = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        index_fold: IndexFold,
        index_version: str,
        replica_id: str | None = None,
        clock: Callable[[], float] = time.time,
        poll_seconds: float = 5.0,
        pool_size: int = 16,
        search_fold: SearchFold | None = None,
        search_version: str | None = None,
    ):
        self.url = url
        self.replica_id = replica_id or new_id("replica")
        self._fold = index_fold
        self._clock = clock
        self._closed_streams: set[str] = set()
        self._decoded_states = {}
        self._search_fold = search_fold
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as db:
                apply_migrations(db)
                cursors = self._load_index(db, index_version)
                pg_search.ensure_index(db, search_fold, search_version, index_fold)
        except psycopg.Error as exc:
            raise StorageError(
                f"Cannot open the Tether database at {redact(url)}: {exc}".strip()
            ) from exc
        self._pool = AsyncConnectionPool(  # a request waits at most 10 s for the database
            url,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=10,
            kwargs={"autocommit": True},
        )
        self._fanout = Fanout(url, self._read_after, self._all_last_seqs, cursors, poll_seconds)
        self._queue: asyncio.Queue[Op | None] | None = None
        self._writer: asyncio.Task | None = None
        self._start_lock: asyncio.Lock | None = None
        self._stopped = False

    # -- start-up ---------------------------------------------------------------------------
    def _load_index(self, db: psycopg.Connection, version: str) -> dict[str, int]:
        return pg_rows.load_index(db, self._fold, version)

    async def _start(self) -> None:
        if self._writer is not None:
            return
        if self._stopped:
            raise StorageError("the log is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._writer is not None:
                return
            await self._pool.open(wait=False)
            self._queue = asyncio.Queue()
            self._writer = asyncio.get_running_loop().create_task(self._writer_loop())

    def attach_hub(self, hub: Hub | None) -> None:
        """Committed batches, this replica's and every other's, go to `hub` from now on."""
        self._fanout.hub = hub
        if hub is not None:
            self._fanout.start()

    async def wait_listening(self, timeout: float = 10.0) -> None:
        """Until the LISTEN connection is up (tests and start-up use it)."""
        await asyncio.wait_for(self._fanout.listening.wait(), timeout)

    # -- writes -----------------------------------------------------------------------------
    async def _submit(
        self,
        kind: str,
        session_id: str,
        drafts: list[Draft],
        owner: str | None = None,
        many: list[tuple[str, list[Draft]]] | None = None,
    ) -> Any:
        await self._start()
        assert self._queue is not None
        if self._stopped:
            raise StorageError("the log is closed")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(Op(kind, session_id, list(drafts), future, owner, list(many or [])))
        return await future

    async def create_session(
        self, session_id: str, drafts: list[Draft], owner: str | None = None
    ) -> list[Event]:
        return await self._submit("create", session_id, drafts, owner)

    async def create_sessions(
        self, sessions: list[tuple[str, list[Draft]]], owner: str | None = None
    ) -> list[list[Event]]:
        """All in the writer's transaction, all or none (a savepoint: see `_insert_many`)."""
        many = [(sid, list(drafts)) for sid, drafts in sessions]
        if not many:
            return []
        every = [d for _, drafts in many for d in drafts]
        return await self._submit("create_many", many[0][0], every, owner, many)

    async def append(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        return await self._submit("append", session_id, drafts)

    async def delete_session(self, session_id: str, *, only_idle: bool = False) -> None:
        await self._submit("delete_idle" if only_idle else "delete", session_id, [])

    async def _writer_loop(self) -> None:
        """Group commit, with up to `_IN_FLIGHT` batches at once on sessions no other batch
        in flight holds: a burst that arrives while one batch waits for its WAL flush starts
        its own instead of waiting behind it (bench/README.md). A session's operations still
        run one batch after another, in the order they were queued (`take_runnable`)."""
        assert self._queue is not None
        waiting: list[Op] = []  # taken from the queue, not yet in a batch
        flying: dict[asyncio.Task, set[str]] = {}  # batches in flight and their sessions
        stopping = False
        while waiting or flying or not stopping:
            while not stopping and not self._queue.empty():
                op = self._queue.get_nowait()
                if op is None:
                    stopping = True
                else:
                    waiting.append(op)
            if waiting and len(flying) < _IN_FLIGHT:
                held = {sid for sessions in flying.values() for sid in sessions}
                batch, waiting = take_runnable(waiting, held, _MAX_BATCH)
                batch = [op for op in batch if not op.future.cancelled()]  # the caller gave up
                if batch:  # before its batch began: nothing of it is written (as with SQLite)
                    task = asyncio.get_running_loop().create_task(self._write_batch(batch))
                    flying[task] = {sid for op in batch for sid in op.sids()}
                    continue
                if waiting and not flying:
                    continue
            getter = None if stopping else asyncio.ensure_future(self._queue.get())
            wakers = {*flying, *([getter] if getter else [])}
            if not wakers:  # stopping, and what waited was given up by its callers
                continue
            try:
                await asyncio.wait(wakers, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the batches in flight finish and answer; the
                self._refuse_unwritten(waiting, getter)  # rest is told, never left waiting
                raise
            for task in [task for task in flying if task.done()]:
                del flying[task]
                if not task.cancelled() and task.exception() is not None:
                    log.error("log writer: a batch failed", exc_info=task.exception())
            if getter is not None:
                if getter.done():  # not `in` wait's answer: it may have finished since
                    op = getter.result()
                    if op is None:
                        stopping = True
                    else:
                        waiting.append(op)
                else:  # a cancelled get leaves its item in the queue
                    getter.cancel()

    def _refuse_unwritten(self, waiting: list[Op], getter: asyncio.Future | None) -> None:
        """The writer is cancelled: every operation it took or that is still queued fails
        with "the log is closed" (nothing of them was written)."""
        assert self._queue is not None
        self._stopped = True
        if getter is not None and not getter.done():
            getter.cancel()
        elif getter is not None and not getter.cancelled() and getter.result() is not None:
            waiting.append(getter.result())
        while not self._queue.empty():
            op = self._queue.get_nowait()
            if op is not None:
                waiting.append(op)
        for op in waiting:
            if not op.future.done():
                op.future.set_exception(StorageError("the log is closed"))

    async def _write_batch(self, batch: list[Op]) -> None:
        outcomes: list[tuple[Op, list[Any] | LogError]] = []
        work = Batch()
        durable = False
        commit: psycopg.AsyncCursor | None = None
        try:
            # One pipeline: BEGIN, the locking SELECT and the read of finished streams in one
            # round trip, everything else, COMMIT and the wake-up of the other replicas in a
            # second, which the pipeline's exit syncs. BEGIN, COMMIT and the savepoint are
            # statements of the pipeline: psycopg's `transaction()` syncs the pipeline at both
            # ends, which was a third of a batch's CPU (bench/README.md). On a failure, before
            # or at COMMIT, nothing is committed: the connection's context rolls the open
            # transaction back as it exits. A failure after COMMIT answered is the wake-up's
            # alone: the batch is durable, and the other replicas' slow poll publishes it.
            async with self._pool.connection() as conn:
                try:
                    async with conn.pipeline():
                        commit, announced, gone = await self._transaction(
                            conn, batch, work, outcomes
                        )
                        if announced or gone:
                            await conn.execute(
                                NOTIFY_SQL, (CHANNEL, payloads(self.replica_id, announced, gone))
                            )
                except psycopg.Error as exc:
                    if not was_committed(commit):
                        raise
                    log.warning("log fan-out: could not notify (%s); the slow poll will", exc)
                if not was_committed(commit):  # a failed transaction ends as ROLLBACK
                    status = None if commit is None else commit.statusmessage
                    raise RuntimeError(f"COMMIT answered {status}")
                durable = True
        except Exception as exc:
            if not durable:  # anything: the batch is rolled back whole, the writer lives on
                if not isinstance(exc, psycopg.Error):
                    log.exception("log writer: batch failed")
                error = storage_error("write", exc)
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(error)
                return
        for stream_id, _ in work.closing_written:
            if len(self._closed_streams) > _CLOSED_STREAM_CACHE:
                self._closed_streams.clear()
            self._closed_streams.add(stream_id)
        committed = [
            ev for _, result in outcomes if isinstance(result, list) for ev in flat(result)
        ]
        try:
            await self._fanout.committed(committed, work.deleted)
        except Exception as exc:  # committed all the same: the slow poll publishes it later
            log.warning("log fan-out: could not read a gap before a commit (%s)", exc)
        for op, result in outcomes:
            if op.future.done():
                continue
            if isinstance(result, LogError):
                op.future.set_exception(result)
            else:
                op.future.set_result(result)

    async def _transaction(
        self,
        conn: psycopg.AsyncConnection,
        batch: list[Op],
        work: Batch,
        outcomes: list[tuple[Op, list[Any] | LogError]],
    ) -> tuple[psycopg.AsyncCursor, dict[str, int], list[str]]:
        """The batch's transaction, sent in the open pipeline: its COMMIT's cursor, the new
        last seqs and the deleted sessions to announce."""
        await conn.execute("BEGIN")
        await pg_counters.lock(conn, batch, work, self._load_closed(conn, batch, work))
        for op in batch:
            try:
                if op.kind in ("delete", "delete_idle"):
                    await self._delete(
                        conn, op.session_id, work, only_idle=op.kind == "delete_idle"
                    )
                    outcomes.append((op, []))
                elif op.kind == "create_many":
                    outcomes.append((op, await self._insert_many(conn, op, work)))
                else:
                    outcomes.append((op, await self._insert(conn, op, work)))
            except LogError as exc:
                outcomes.append((op, exc))
        events, work.rows = work.rows, []  # the last events go in with the
        await self._flush(conn, work)  # counter rows, in one statement
        announced = await pg_counters.write(conn, work, events)
        commit = await conn.execute("COMMIT")
        return commit, announced, [sid for sid in work.deleted if work.last[sid] is None]

    async def _load_closed(
        self, conn: psycopg.AsyncConnection, batch: list[Op], work: Batch
    ) -> None:
        """Which of the batch's streams are finished, read after the sessions were locked (a
        stream is finished in its session's transaction, so this cannot change under us):
        sent behind the locking SELECT in the pipeline, so PostgreSQL runs it once the locks
        are held, and both come back in one round trip. The answer is the batch's own
        (`work.finished_before`): another batch in flight may clear the shared cache meanwhile."""
        streams = {d.stream_id for op in batch for d in op.drafts if d.stream_id is not None}
        work.finished_before = streams & self._closed_streams
        wanted = streams - work.finished_before
        if wanted:
            cur = await conn.execute(
                "SELECT stream_id FROM closed_streams WHERE stream_id = ANY(%b)", (list(wanted),)
            )
            for (stream_id,) in await cur.fetchall():
                work.finished_before.add(stream_id)
                self._closed_streams.add(stream_id)

    async def _insert(self, conn: psycopg.AsyncConnection, op: Op, work: Batch) -> list[Event]:
        sid = op.session_id
        last = work.last[sid]
        if op.kind == "create":
            if last is not None:
                raise SessionExists(sid)
            last = 0
        elif last is None:
            raise SessionNotFound(sid)
        finishing: set[str] = set()
        open_stream = work.open.get(sid)
        cancel_stream = work.cancel.get(sid)
        owner, epoch = work.owner.get(sid, (None, 0))
        answered = work.answered.get(sid, [])
        for draft in op.drafts:
            if draft.needs_no_run and open_stream is not None:  # a run of another replica
                raise SessionOccupied(sid, open_stream)
            if draft.stream_id is not None:
                stream = draft.stream_id
                if stream in finishing or stream in work.closed or stream in work.finished_before:
                    raise StreamClosed(stream)
                if (  # the fence: once taken over, only the new owner writes the run (a Stop
                    # comes from anywhere): the old owner's late appends are refused
                    stream == open_stream
                    and epoch > 0
                    and owner != self.replica_id
                    and draft.type != RUN_CANCEL_REQUESTED
                ):
                    raise RunTakenOver(stream)
                if draft.type == RUN_FINISHED:
                    finishing.add(stream)
                    if stream == open_stream:
                        open_stream, owner, epoch, answered = None, None, 0, []
                elif draft.type == TURN_SUBMITTED and open_stream != stream:
                    if draft.admits_run and open_stream is not None:  # one run per session
                        raise SessionOccupied(sid, open_stream)
                    open_stream, answered = stream, []
                    owner, epoch = (self.replica_id if draft.admits_run else None), 0
                elif draft.type == RUN_CANCEL_REQUESTED:
                    if stream == cancel_stream:  # Stop, once per run, from any replica
                        raise CancelRequested(stream)
                    cancel_stream = stream
                elif draft.type in _ANSWERS:  # an answer, once per prompt, from any replica
                    prompt = f"{stream}/{draft.type}/{draft.data[_ANSWERS[draft.type]]}"
                    if prompt in answered:
                        raise PromptAnswered(stream, prompt)
                    answered = [*answered, prompt]
        payloads_ = [encode(sid, draft) for draft in op.drafts]  # refuse before writing
        uploads = [await self._uploads(conn, sid, d, work) for d in op.drafts]
        now = self._clock()
        state = work.state[sid]
        events = []
        for draft, payload in zip(op.drafts, payloads_, strict=True):
            last += 1
            at = now if draft.at is None else draft.at
            event = Event(sid, last, draft.type, at, draft.data, draft.stream_id, draft.turn_id)
            queue_id = draft.data.get("queue_id") if draft.type == QUEUE_ADDED else None
            text = draft.data.get("text") if draft.type == TURN_SUBMITTED else None
            work.rows.append(
                (
                    sid,
                    last,
                    draft.type,
                    float(at),
                    draft.stream_id,
                    draft.turn_id,
                    payload,
                    queue_id if isinstance(queue_id, str) else None,
                    text.replace("\x00", "") if isinstance(text, str) else None,
                )
            )
            if self._search_fold is not None:
                change = await pg_search.fold_change(
                    conn, self._search_fold, state, event, lambda: self._flush(conn, work)
                )
                await pg_search.apply_change(conn, sid, change)
            state = self._fold(state, event)
            events.append(event)
        if op.kind == "create":
            await pg_owners.record(conn, sid, op.owner)
        for rows in uploads:
            work.uploads.update(rows)
        for stream_id in finishing:
            work.closing.append((stream_id, sid))
            work.closed.add(stream_id)
        work.last[sid] = last
        work.state[sid] = state
        work.open[sid] = open_stream
        work.cancel[sid] = cancel_stream
        work.owner[sid] = (owner, epoch)
        work.answered[sid] = answered
        work.touched.add(sid)
        return events

    async def _insert_many(
        self, conn: psycopg.AsyncConnection, op: Op, work: Batch
    ) -> list[list[Event]]:
        """Every session of an import in a savepoint: a refusal of any rolls back what the
        others wrote (and the batch's memory of it), so it writes none of them."""
        if len(set(op.sids())) != len(op.many):
            raise SessionExists("the same session twice in one creation")
        await self._flush(conn, work)  # what came before stays out of the savepoint
        saved = snapshot(work)
        await conn.execute("SAVEPOINT create_many")
        try:
            created = [
                await self._insert(conn, Op("create", sid, drafts, op.future, op.owner), work)
                for sid, drafts in op.many
            ]
        except LogError:
            await conn.execute("ROLLBACK TO SAVEPOINT create_many")
            await conn.execute("RELEASE SAVEPOINT create_many")
            restore(work, saved)
            raise
        await conn.execute("RELEASE SAVEPOINT create_many")
        return created

    async def _uploads(
        self, conn: psycopg.AsyncConnection, sid: str, draft: Draft, work: Batch
    ) -> dict[tuple[str, str], tuple]:
        """The attachment rows (log/owners.py) the draft brings: a new upload with its blob; a
        reference moved from elsewhere takes the blob of the upload it names."""
        if draft.type not in owners.CARRIERS:
            return {}
        out: dict[tuple[str, str], tuple] = {}
        for ref in draft.data.get("attachments") or []:
            blob = draft.blobs.get(ref["id"])
            if blob is None:
                blob = next((r[2] for k, r in work.uploads.items() if k[1] == ref["id"]), None)
            if blob is None:
                cur = await conn.execute(
                    "SELECT blob FROM attachments WHERE id=%s LIMIT 1", (ref["id"],)
                )
                found = await cur.fetchone()
                blob = found[0] if found else ref["id"]
            key = (sid, ref["id"])
            if key not in work.uploads:
                out[key] = (sid, ref["id"], blob, ref["name"], ref["mime"], ref["size"])
        return out

    async def _flush(self, conn: psycopg.AsyncConnection, work: Batch) -> None:
        """Write what the batch gathered so far: before a delete, a savepoint or a stream
        read, everything; at the end, all but the events, which go in with the counter rows
        (`pg_counters.write`)."""
        async with conn.cursor() as cur:
            if work.rows:
                await cur.execute(INSERT_EVENTS_SQL, as_columns(work.rows))
            if work.uploads:
                await cur.executemany(
                    "INSERT INTO attachments (session_id, id, blob, name, mime, size) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    list(work.uploads.values()),
                )
            if work.closing:
                await cur.executemany(
                    "INSERT INTO closed_streams (stream_id, session_id) VALUES (%s, %s)",
                    work.closing,
                )
        work.rows, work.uploads = [], {}
        work.closing_written.extend(work.closing)
        work.closing = []

    async def _delete(
        self, conn: psycopg.AsyncConnection, sid: str, work: Batch, *, only_idle: bool
    ) -> None:
        if work.last[sid] is None:
            raise SessionNotFound(sid)
        running = work.open[sid]
        if only_idle and running is not None:  # another replica's run needs its log
            raise SessionOccupied(sid, running)
        await self._flush(conn, work)
        for table in ("events", "attachments", "closed_streams", "session_owners", "search_rows"):
            await conn.execute(f"DELETE FROM {table} WHERE session_id=%s", (sid,))
        work.closed -= {stream for stream, owner in work.closing_written if owner == sid}
        work.closing_written = [(s, owner) for s, owner in work.closing_written if owner != sid]
        work.last[sid] = None
        work.state[sid] = None
        work.open[sid] = None
        work.cancel[sid] = None
        work.owner[sid] = (None, 0)
        work.answered[sid] = []
        work.touched.add(sid)
        work.deleted.append(sid)

    async def claim_unowned(self, owner: str) -> int:
        await self._start()
        try:
            async with self._pool.connection() as conn:
                return await pg_owners.claim(conn, owner)
        except psycopg.Error as exc:
            raise storage_error("write", exc) from exc

    # -- leases and takeover (log/pg_leases.py) -------------------------------------------
    async def renew_lease(self) -> None:
        await self._start()
        await pg_leases.renew(self._pool, self.replica_id)

    async def release_lease(self) -> None:
        await pg_leases.release(self._pool, self.replica_id)

    async def claim_orphans(self, *, mine: bool = False, strays: bool = False) -> list[OpenStream]:
        await self._start()
        return await pg_leases.claim(self._pool, self.replica_id, mine=mine, strays=strays)

    async def aclose(self) -> None:
        self._stopped = True
        try:
            if self._writer is not None and self._queue is not None and not self._writer.done():
                self._queue.put_nowait(None)
                with contextlib.suppress(Exception):  # shielded: a caller's deadline leaves
                    await asyncio.shield(self._writer)  # the writer to answer what it took
        finally:  # also when the caller is cancelled: the listener and the pool still close
            await self._fanout.stop()
            await self._pool.close()
