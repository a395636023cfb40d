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

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether.events import TURN_SUBMITTED
from tether.log.pg_rows import storage_error
from tether.log.store import OpenStream

RENEW_SECONDS = 2.0
LEASE_SECONDS = 10.0

_NOW = "extract(epoch from clock_timestamp())"


async def renew(pool: AsyncConnectionPool, replica_id: str) -> None:
    """Extend this replica's lease by LEASE_SECONDS from now."""
    try:
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO replica_leases (replica_id, expires_at) "
                f"VALUES (%s, {_NOW} + %s) "
                "ON CONFLICT (replica_id) DO UPDATE SET expires_at = excluded.expires_at",
                (replica_id, LEASE_SECONDS),
            )
    except psycopg.Error as exc:
        raise storage_error("lease", exc) from exc


async def release(pool: AsyncConnectionPool, replica_id: str) -> None:
    """Drop this replica's lease (a clean shutdown: nothing of it is left to take over)."""
    try:
        async with pool.connection() as conn:
            await conn.execute("DELETE FROM replica_leases WHERE replica_id=%s", (replica_id,))
    except psycopg.Error as exc:
        raise storage_error("lease", exc) from exc


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
