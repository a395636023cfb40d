"""Run ownership across replicas on PostgreSQL (docs/operations.md "Several replicas").

Each replica heartbeats a lease row (`replica_leases`: renewed every `RENEW_SECONDS`, valid
for `LEASE_SECONDS`, both on the database's clock, so replicas' clocks need not agree). The
counter row names the replica running the session's open run (`sessions.open_owner`, set by
the run's `turn.submitted`, cleared by its `run.finished`, log/postgres.py) and the run's epoch
(`sessions.open_epoch`: 0 when admitted, bumped at each takeover).

A run whose owner has no live lease is an orphan. `claim` takes orphans over: in one
transaction it locks their counter rows with `FOR UPDATE SKIP LOCKED` (two survivors never
claim one run, and a row a writer holds is left for the next round), names the claimer the
owner and bumps `open_epoch` (the fencing token). The claimer then records them interrupted
as their owner. The writer checks the owner on every append of an open run, under the same
row lock: once a run is taken over (epoch > 0) only its new owner appends to it (and a Stop,
from anywhere), so its old owner's appends are refused (RunTakenOver): a paused and resumed
replica never writes after a takeover. Before any takeover any replica may append to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether.events import TURN_SUBMITTED
from tether.log.errors import StorageError
from tether.log.pg_rows import storage_error
from tether.log.store import OpenStream

RENEW_SECONDS = 2.0
LEASE_SECONDS = 10.0
ATTEMPT_SECONDS = 3.0  # one renewal, connecting included, before it counts as failed

_NOW = "extract(epoch from clock_timestamp())"


class LeaseConnection:
    """This replica's lease, on a connection of its own rather than one of the log's pool: a
    pool kept busy past LEASE_SECONDS (slow reads, imports, a small `--database-pool-size`)
    cost a healthy replica its lease, and its users' runs a takeover. The connection is
    opened on first use and again once lost (a restart, a terminated backend). A renewal that
    has not answered within ATTEMPT_SECONDS fails and its connection is dropped, so a
    database that answers nothing never holds the lease loop, which then lets go of the runs
    once the lease has run out (runs/leases.py), as with a database that refuses."""

    def __init__(self, url: str, replica_id: str):
        self._url = url
        self._replica_id = replica_id
        self._conn: psycopg.AsyncConnection | None = None

    async def renew(self) -> None:
        """Extend this replica's lease by LEASE_SECONDS from now."""
        await self._run(
            "INSERT INTO replica_leases (replica_id, expires_at) "
            f"VALUES (%s, {_NOW} + %s) "
            "ON CONFLICT (replica_id) DO UPDATE SET expires_at = excluded.expires_at",
            (self._replica_id, LEASE_SECONDS),
        )

    async def release(self) -> None:
        """Drop this replica's lease (a clean shutdown: nothing of it is left to take over)."""
        await self._run("DELETE FROM replica_leases WHERE replica_id=%s", (self._replica_id,))

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _run(self, sql: str, params: tuple[Any, ...]) -> None:
        """`sql` within ATTEMPT_SECONDS. Past it, or when the caller is cancelled, the attempt
        is abandoned: it unwinds in the background (psycopg cancels the query on the server)
        and closes its connection; the next one opens a new connection."""
        attempt = asyncio.ensure_future(self._execute(sql, params))
        attempt.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            await asyncio.wait_for(asyncio.shield(attempt), ATTEMPT_SECONDS)
        except TimeoutError:
            raise StorageError(
                "could not use the PostgreSQL database (lease): no answer within "
                f"{ATTEMPT_SECONDS:g} s"
            ) from None
        except psycopg.Error as exc:
            raise storage_error("lease", exc) from exc
        finally:
            if not attempt.done():
                self._conn = None
                attempt.cancel()

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> None:
        """On the connection kept from before, and when the server ended that one while it
        sat idle (found only by using it), once more on a new one: both statements can run
        twice."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            try:
                await self._on(conn, sql, params)
                return
            except psycopg.OperationalError:
                pass
        conn = self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        await self._on(conn, sql, params)

    async def _on(self, conn: psycopg.AsyncConnection, sql: str, params: tuple[Any, ...]) -> None:
        try:
            await conn.execute(sql, params)
        except BaseException:  # failed or abandoned: in an unknown state, never used again
            if self._conn is conn:
                self._conn = None
            with contextlib.suppress(Exception):
                await conn.close()
            raise


async def claim(
    pool: AsyncConnectionPool, replica_id: str, *, mine: bool = False, strays: bool = False
) -> list[OpenStream]:
    """Take over the open runs whose owner has no live lease (and those without an owner);
    with `mine`, this replica's own too (shutdown); with `strays`, add the unfinished streams
    no counter row names (history without a run). The caller settles what is returned. Runs
    this replica took over before (epoch > 0) and has not settled yet are returned again: a
    settling that failed is retried on the next round, not left open while this one lives."""
    try:
        async with pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT s.session_id, s.open_stream FROM sessions s "
                "WHERE s.open_stream IS NOT NULL AND (s.open_owner IS NULL "
                "OR (s.open_owner = %s AND (%s OR s.open_epoch > 0)) "
                "OR (s.open_owner <> %s AND NOT EXISTS ("
                "SELECT 1 FROM replica_leases l WHERE l.replica_id = s.open_owner "
                f"AND l.expires_at > {_NOW}))) "
                "ORDER BY s.session_id FOR UPDATE SKIP LOCKED",
                (replica_id, mine, replica_id),
            )
            claimed = await cur.fetchall()
            if claimed:
                await conn.execute(
                    "UPDATE sessions SET open_owner=%s, open_epoch=open_epoch+1 "
                    "WHERE session_id = ANY(%s)",
                    (replica_id, [sid for sid, _ in claimed]),
                )
            streams = [stream for _, stream in claimed]
            cur = await conn.execute(
                "SELECT t.session_id, t.stream_id, t.turn_id FROM events t "
                "WHERE t.type=%s AND t.stream_id IS NOT NULL AND (t.stream_id = ANY(%s) OR "
                "(%s AND NOT EXISTS (SELECT 1 FROM closed_streams c "
                "WHERE c.stream_id=t.stream_id) AND NOT EXISTS (SELECT 1 FROM sessions o "
                "WHERE o.open_stream = t.stream_id))) ORDER BY t.id",
                (TURN_SUBMITTED, streams, strays),
            )
            return [OpenStream(*row) for row in await cur.fetchall()]
    except psycopg.Error as exc:
        raise storage_error("takeover", exc) from exc
