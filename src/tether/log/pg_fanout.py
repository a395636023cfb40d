"""Fan-out for the PostgreSQL backend: every committed event reaches this replica's Hub once,
in seq order per session, whichever replica wrote it.

The log is the only source. A commit sends a NOTIFY whose payload names sessions and their new
last seqs (never event bodies; well inside NOTIFY's 8000 bytes); one LISTEN connection per
replica turns that into a wake-up, and the events themselves are read from the log after the
replica's per-session publication cursor. This replica's own commits are published straight
from the writer (the events are in hand), after any gap before them was read. A lost listener
connection, or a missed notification, costs nothing but latency: on reconnecting, and on a
slow poll as a safety net, every session whose committed last seq is past the cursor is read
from the cursor, so every follower catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

import psycopg

from tether.events import Event
from tether.log.subscriptions import Hub

log = logging.getLogger("tether.log")

CHANNEL = "tether_log"
PAYLOAD_LIMIT = 7000  # bytes; NOTIFY refuses payloads of 8000 bytes or more

Reader = Callable[[dict[str, int]], Awaitable[list[Event]]]  # {sid: after} -> events
LastSeqs = Callable[[], Awaitable[dict[str, int]]]


def payloads(replica: str, seqs: dict[str, int], deleted: list[str]) -> list[str]:
    """The NOTIFY payloads announcing one commit: `{"r": replica, "s": {sid: last_seq},
    "d": [deleted sids]}`, split so that each stays under PAYLOAD_LIMIT bytes."""
    out: list[str] = []
    chunk: dict[str, int] = {}
    gone: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal chunk, gone, size
        if chunk or gone:
            out.append(json.dumps({"r": replica, "s": chunk, "d": gone}, separators=(",", ":")))
        chunk, gone, size = {}, [], 0

    for sid, seq in seqs.items():
        cost = len(sid.encode()) + 24
        if size + cost > PAYLOAD_LIMIT - 100:
            flush()
        chunk[sid] = seq
        size += cost
    for sid in deleted:
        cost = len(sid.encode()) + 4
        if size + cost > PAYLOAD_LIMIT - 100:
            flush()
        gone.append(sid)
        size += cost
    flush()
    return out


# One commit's wake-up, sent by the writer in its pipeline right after the batch's COMMIT
# (log/postgres.py): the statement is the implicit transaction the pipeline's Sync ends, so it
# costs no round trip of its own. Not inside the batch's transaction: PostgreSQL holds one
# database-wide lock from a notifying transaction's commit until its WAL flush is done, which
# would serialise every replica's commits. The wake-up need not be durable (a lost one costs
# the slow poll's latency), so its own commit never waits for a WAL flush (`set_config(...,
# true)`: for this transaction only; PostgreSQL 15 writes none for a notify-only transaction
# anyway, the setting keeps it so where a server would).
NOTIFY_SQL = (
    "SELECT set_config('synchronous_commit', 'off', true), pg_notify(%s, p) "
    "FROM unnest(%b::text[]) AS p"
)


class Fanout:
    """The publication cursors of one replica and the tasks that advance them."""

    def __init__(
        self,
        conninfo: str,
        reader: Reader,
        last_seqs: LastSeqs,
        cursors: dict[str, int],
        poll_seconds: float,
        replica: str | None = None,
    ):
        self._conninfo = conninfo
        self._replica = replica  # its own commits are published by its writer (`committed`)
        self._read = reader
        self._last_seqs = last_seqs
        self._published = cursors  # sid -> highest seq handed to the hub
        self._poll_seconds = poll_seconds
        self._lock = asyncio.Lock()
        self.hub: Hub | None = None
        self._task: asyncio.Task | None = None
        self.listening = asyncio.Event()  # set while the LISTEN connection is up
        self._woken = asyncio.Event()
        self._pending: dict[str, int] = {}
        self._deleted: list[str] = []
        self._full = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    # -- publication ------------------------------------------------------------------------
    async def committed(self, events: list[Event], deleted: list[str]) -> None:
        """This replica's own commit: publish it after whatever committed before it. A
        session the commit deleted is announced deleted first; what exists of it now (created
        again, in the same batch or since) is read from the log, from seq 1."""
        async with self._lock:
            dropped = dict.fromkeys(deleted)
            self._emit([], list(dropped))
            by_session: dict[str, list[Event]] = {}
            for event in events:
                if event.session_id not in dropped:
                    by_session.setdefault(event.session_id, []).append(event)
            gaps = {  # another replica committed in between
                sid: self._published.get(sid, 0)
                for sid, mine in by_session.items()
                if mine[0].seq > self._published.get(sid, 0) + 1
            }
            gaps.update(dict.fromkeys(dropped, 0))
            before: dict[str, list[Event]] = {}
            for event in await self._read(gaps) if gaps else []:
                before.setdefault(event.session_id, []).append(event)
            out: list[Event] = []
            for sid in dropped:
                again = before.get(sid, [])
                out.extend(again)
                if again:
                    self._published[sid] = again[-1].seq
            for sid, mine in by_session.items():
                done = self._published.get(sid, 0)
                out.extend(e for e in before.get(sid, ()) if done < e.seq < mine[0].seq)
                out.extend(e for e in mine if e.seq > done)
                self._published[sid] = max(done, mine[-1].seq)
            self._emit(out, [])

    async def catch_up(self, seqs: dict[str, int] | None, deleted: list[str]) -> None:
        """Read what another replica committed: the sessions `seqs` names, or (None) every
        session, whose committed last seq is past this replica's cursor. A session `deleted`
        names is announced deleted first, and read again from seq 1: it may have been created
        again since (a cursor of the deleted session means nothing for the new one)."""
        async with self._lock:
            complete = seqs is None
            if seqs is None:
                seqs = await self._last_seqs()
                deleted = [sid for sid in self._published if sid not in seqs]
            dropped = dict.fromkeys(deleted)

            def cursor(sid: str) -> int:
                return 0 if sid in dropped else self._published.get(sid, 0)

            behind = {sid: cursor(sid) for sid, last in seqs.items() if last > cursor(sid)}
            out = await self._read(behind) if behind else []  # one query, in seq order per session
            gone = [sid for sid in dropped if sid in self._published or complete]
            self._emit([], gone)
            for event in out:
                self._published[event.session_id] = event.seq
            self._emit(out, [])

    def _emit(self, events: list[Event], deleted: list[str]) -> None:
        for sid in deleted:
            self._published.pop(sid, None)
        hub = self.hub
        if hub is None:
            return
        try:
            for sid in deleted:
                hub.publish_deleted(sid)
            if events:
                hub.publish(events)
        except RuntimeError:  # the loop is gone: the server is shutting down
            pass

    # -- the wake-up ----------------------------------------------------------------------
    async def _listen_forever(self) -> None:
        worker = asyncio.get_running_loop().create_task(self._work_forever())
        backoff = 0.1
        try:
            while True:
                try:
                    async with await psycopg.AsyncConnection.connect(
                        self._conninfo, autocommit=True
                    ) as conn:
                        await conn.execute(f"LISTEN {CHANNEL}")
                        self.listening.set()
                        backoff = 0.1
                        self._wake(None, [])  # whatever was missed while not listening
                        async for note in conn.notifies():
                            self._wake(*_parse(note.payload, self._replica))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the server restarted, the connection was killed
                    log.warning("log fan-out: lost the LISTEN connection (%s); re-reading", exc)
                finally:
                    self.listening.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    def _wake(self, seqs: dict[str, int] | None, deleted: list[str]) -> None:
        """Coalesce a notification into what the worker reads next (None: read everything)."""
        if seqs is None:
            self._full = True
        else:
            for sid, seq in seqs.items():
                self._pending[sid] = max(seq, self._pending.get(sid, 0))
            self._deleted.extend(deleted)
        self._woken.set()

    async def _work_forever(self) -> None:
        loop = asyncio.get_running_loop()
        last_full = loop.time()
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow
                async with asyncio.timeout(self._poll_seconds):  # a cancel (aclose hangs)
                    await self._woken.wait()
            self._woken.clear()
            full = self._full or loop.time() - last_full >= self._poll_seconds
            pending, deleted = self._pending, self._deleted
            self._pending, self._deleted, self._full = {}, [], False
            try:
                if full:  # the slow poll: a notification may have been lost
                    last_full = loop.time()
                    await self.catch_up(None, [])
                elif pending or deleted:
                    await self.catch_up(pending, deleted)
            except Exception as exc:  # the database is away: the next wake-up retries
                log.warning("log fan-out: could not read the log (%s); will retry", exc)
                self._full = True
                await asyncio.sleep(0.2)


def _parse(payload: str, own: str | None = None) -> tuple[dict[str, int] | None, list[str]]:
    """A notification's sessions and deletions; nothing for this replica's own (`own`): its
    writer publishes them (`Fanout.committed`), or, if that failed, the slow poll does. Read
    here as well, a deletion would be published twice, and a session created again in the
    same commit read once from the old cursor, once from seq 1."""
    try:
        body = json.loads(payload)
        if own is not None and body.get("r") == own:
            return {}, []
        return {str(k): int(v) for k, v in body["s"].items()}, [str(s) for s in body["d"]]
    except (ValueError, KeyError, AttributeError, TypeError):
        return None, []  # not ours, or damaged: read everything
