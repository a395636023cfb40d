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
A batch whose COMMIT was sent but whose answer a lost connection took is read back on a new
connection (its transaction's status) before it is answered: committed or rolled back, as the
database decided, never a durable batch reported failed.

Admission is the database's too: the counter row names the session's unfinished run
(`open_stream`, set by its `turn.submitted`, cleared by its `run.finished`), so a second
`turn.submitted` with a stream is refused with SessionOccupied (409 `session_busy`) whichever
replica sends it, in the same locked transaction. Stop is recorded once per run the same way
(`cancel_stream`): a second `run.cancel_requested` of the run is refused with CancelRequested;
and an answer once per prompt (`answered`): a second `approval.answered` / `clarify.answered`
of the same prompt is refused with PromptAnswered. (The batch's transaction and these rules:
log/pg_batch.py.)

Reads go to the database (a connection pool), never to process memory: another replica may
have written since. The only cache is of streams known to be finished, which stays true.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether.events import Event, new_id
from tether.log import pg_leases, pg_owners, pg_rows, pg_search
from tether.log.errors import InvalidEvent, LogError, SessionNotFound, StorageError
from tether.log.pg_batch import BatchTransaction
from tether.log.pg_fanout import CHANNEL, NOTIFY_SQL, Fanout, payloads
from tether.log.pg_reads import PostgresReads
from tether.log.pg_rows import (
    Batch,
    Op,
    flat,
    redact,
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
_RESOLVE_SECONDS = 30.0  # reading back a lost COMMIT's outcome, before it is reported unknown


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
                apply_migrations(db, f"at {redact(url)}")
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
            check=self._usable,
        )
        self._sweeping = False
        self._lease = pg_leases.LeaseConnection(url, self.replica_id)
        self._fanout = Fanout(
            url, self._read_after, self._all_last_seqs, cursors, poll_seconds, self.replica_id
        )
        self._transactions = BatchTransaction(
            self.replica_id, clock, index_fold, search_fold, self._closed_streams
        )
        self._queue: asyncio.Queue[Op | None] | None = None
        self._writer: asyncio.Task | None = None
        self._start_lock: asyncio.Lock | None = None
        self._stopped = False

    async def _usable(self, conn: psycopg.AsyncConnection) -> None:
        """The pool's check as it lends a connection, without a round trip: one the server
        closed while it sat idle (a restart, a terminated backend) has the server's goodbye
        or its EOF waiting on the socket, which reading finds. The pool then lends another
        instead of failing the operation with it; the other idle ones are checked at once (a
        restart cut them all: found one by one, each would cost the pool's back-off)."""
        try:  # twice: a first read may get the goodbye, only the next one the EOF
            conn.pgconn.consume_input()
            conn.pgconn.consume_input()
            if conn.pgconn.status == psycopg.pq.ConnStatus.OK:
                return
        except psycopg.OperationalError:
            pass
        if not self._sweeping:
            self._sweeping = True
            try:
                await self._pool.check()
            finally:
                self._sweeping = False
        raise psycopg.OperationalError("the server closed this idle connection")

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
        try:
            pg_rows.check_ids([session_id, *(sid for sid, _ in many or [])], drafts)
        except InvalidEvent:
            if kind.startswith("delete"):  # no session can have such an id
                raise SessionNotFound(session_id) from None
            raise
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
        """All in the writer's transaction, all or none (a savepoint: log/pg_batch.py
        `_insert_many`)."""
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
        lost = False  # COMMIT was sent and the connection went before its answer came
        try:
            # One pipeline: BEGIN, the locking SELECT and the read of finished streams in one
            # round trip, everything else, COMMIT and the wake-up of the other replicas in a
            # second, which the pipeline's exit syncs. BEGIN, COMMIT and the savepoint are
            # statements of the pipeline: psycopg's `transaction()` syncs the pipeline at both
            # ends, which was a third of a batch's CPU (bench/README.md). On a failure, before
            # or at COMMIT, nothing is committed: the connection's context rolls the open
            # transaction back as it exits. A failure after COMMIT answered is the wake-up's
            # alone: the batch is durable, and the other replicas' slow poll publishes it. A
            # connection lost after COMMIT was sent, before its answer, leaves it unknown: it
            # is read back (`_committed_after_all`) before anyone is answered.
            async with self._pool.connection() as conn:
                try:
                    async with conn.pipeline():
                        commit, announced, gone = await self._transactions.run(
                            conn, batch, work, outcomes
                        )
                        if announced or gone:
                            await conn.execute(
                                NOTIFY_SQL, (CHANNEL, payloads(self.replica_id, announced, gone))
                            )
                except psycopg.Error as exc:
                    if not was_committed(commit):
                        lost = commit is not None and conn.broken
                        raise
                    log.warning("log fan-out: could not notify (%s); the slow poll will", exc)
                if not was_committed(commit):  # a failed transaction ends as ROLLBACK
                    status = None if commit is None else commit.statusmessage
                    raise RuntimeError(f"COMMIT answered {status}")
                durable = True
        except Exception as exc:
            resolved: bool | None = False
            if lost and work.xact is not None:
                resolved = await self._committed_after_all(work.xact, exc)
                durable = resolved is True
            if not durable:  # anything: the batch is rolled back whole, the writer lives on
                if not isinstance(exc, psycopg.Error):
                    log.exception("log writer: batch failed")
                error = storage_error("write", exc)
                if resolved is None:
                    error = StorageError(
                        "could not use the PostgreSQL database (write): the connection was "
                        "lost after COMMIT was sent, and whether it committed could not be "
                        f"read back: {exc}"
                    )
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

    async def _committed_after_all(self, xact: tuple[int, int], exc: Exception) -> bool | None:
        """A batch's COMMIT was sent and the connection was lost before its answer came: it
        may have committed. Reporting a committed batch as failed let its callers undo what
        its events made durable (release the bytes a turn refers to, unregister a run the
        database holds open) or write it again, so its outcome is read on a new connection:
        its transaction's status (`txid_status`). While that is still in progress (its
        backend has not noticed the loss yet) the backend is ended, which settles it.
        True: committed; False: rolled back; None: could not be read within
        `_RESOLVE_SECONDS` (the database away), reported as a failure that says so."""
        txid, pid = xact
        deadline = time.monotonic() + _RESOLVE_SECONDS
        while True:
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute("SELECT txid_status(%s)", (txid,))
                    row = await cur.fetchone()
                    status = row[0] if row else None
                    if status == "in progress":
                        await conn.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE pid=%s AND backend_xid::text=%s",
                            (pid, str(txid % 2**32)),
                        )
            except psycopg.Error as error:
                status = None
                log.warning("log writer: reading a lost COMMIT's outcome failed: %s", error)
            if status in ("committed", "aborted"):
                log.warning(
                    "log writer: the connection was lost after COMMIT was sent (%s); read "
                    "back on a new one: %s",
                    exc,
                    status,
                )
                return status == "committed"
            if time.monotonic() > deadline:
                log.error("log writer: whether a batch committed is unknown (%s)", exc)
                return None
            await asyncio.sleep(0.05)

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
        await self._lease.renew()

    async def release_lease(self) -> None:
        await self._lease.release()

    async def claim_orphans(self, *, mine: bool = False, strays: bool = False) -> list[OpenStream]:
        await self._start()
        return await pg_leases.claim(self._pool, self.replica_id, mine=mine, strays=strays)

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[None]:
        """A transaction-level advisory lock on `name`, on a connection of its own held for
        the block: released when its transaction ends, also when the block fails, the
        connection breaks or goes back to the pool mid-transaction (a session-level lock
        could outlive a cancelled block on a pooled connection)."""
        await self._start()
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"tether:{name}",)
                )
                yield
        except psycopg.Error as exc:
            raise storage_error("write", exc) from exc

    async def aclose(self) -> None:
        self._stopped = True
        try:
            if self._writer is not None and self._queue is not None and not self._writer.done():
                self._queue.put_nowait(None)
                with contextlib.suppress(Exception):  # shielded: a caller's deadline leaves
                    await asyncio.shield(self._writer)  # the writer to answer what it took
        finally:  # also when the caller is cancelled: the listener and the pool still close
            await self._fanout.stop()
            await self._lease.close()
            await self._pool.close()
