"""A replica's lease against a busy pool and a stuck database (layer: runs leases,
runs/leases.py, log/pg_leases.py, over the PostgreSQL log; contract invariant 4: a takeover is
maintenance, so it must happen only to a replica that is really gone, never to a healthy one
whose pool was busy). Two engines wired as the app wires them, each with its lease loop, on
one real database; the pool is held busy by connections checked out of it, the renewal stuck
by a lock another connection holds on the lease row."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import psycopg
import pytest
from pg import database

from tether.log.pg_leases import LEASE_SECONDS, RENEW_SECONDS
from tether.runs import leases
from tether.runs.registry import CANCELLING
from tether.runtimes.base import Runtime, RuntimeEvent, TextDelta, TurnInput
from tether.settings import Settings

from engine_harness import Harness, harness

pytestmark = pytest.mark.slow


class HeldRuntime(Runtime):
    """Streams a first delta, waits for its gate, then the rest."""

    name = "held"
    model = "held-1"
    demo = False

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        yield TextDelta("first ")
        await self.gate.wait()
        yield TextDelta("second")


async def _streaming(h: Harness, sid: str) -> None:
    for _ in range(1000):
        if "text.delta" in await h.types(sid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the run never streamed")


@contextlib.asynccontextmanager
async def _leased(h: Harness) -> AsyncIterator[asyncio.Task]:
    """The replica's lease loop, started as the app starts it (renewed once first)."""
    assert h.engine.shared is not None
    await h.engine.shared.renew_lease()
    task = asyncio.create_task(leases.lease_forever(h.engine))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_a_replica_whose_pool_is_busy_past_the_lease_keeps_its_run(tmp_path: Path) -> None:
    """Every connection of replica A's pool (`--database-pool-size 2`) is checked out for
    longer than the lease while its run streams (a burst of slow reads or imports). A must
    still renew its lease: its run completes, B never takes it over, and nobody records it
    interrupted."""
    runtime = HeldRuntime()

    async def main(url: str) -> None:
        small = Settings(data_dir=tmp_path / "a", database_url=url, database_pool_size=2)
        other = Settings(data_dir=tmp_path / "b", database_url=url)
        async with (
            harness(tmp_path / "a", runtime, small) as a,
            harness(tmp_path / "b", HeldRuntime(), other) as b,
            _leased(a),
            _leased(b),
        ):
            sid = (await a.sessions.create(None))["session_id"]
            await a.engine.start(sid, "go", [], None)
            await _streaming(a, sid)
            pool = a.engine.shared._pool  # type: ignore[union-attr]
            async with AsyncExitStack() as held:  # the pool is busy: nothing left to lend
                for _ in range(2):
                    await held.enter_async_context(pool.connection())
                await asyncio.sleep(LEASE_SECONDS + 2 * RENEW_SECONDS + 1)
            runtime.gate.set()
            await a.wait_idle(sid, timeout=20)
            events = await b.store.read(sid)
            finished = [e.data for e in events if e.type == "run.finished"]
            assert [f["state"] for f in finished] == ["completed"], finished
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
                cur = await admin.execute(
                    "SELECT open_epoch FROM sessions WHERE session_id=%s", (sid,)
                )
                assert await cur.fetchone() == (0,), "the run was taken over"

    with database() as url:
        asyncio.run(main(url))


def test_a_replica_whose_renewal_is_stuck_lets_go_of_its_runs(tmp_path: Path) -> None:
    """The database answers nothing to the renewal (its lease row locked by another
    connection, as a stuck server or a cut network would leave it). The replica cannot know
    it still holds the lease: once LEASE_SECONDS have passed since its last renewal it stops
    its own runs, as documented, instead of waiting for the renewal forever."""
    runtime = HeldRuntime()

    async def main(url: str) -> None:
        settings = Settings(data_dir=tmp_path, database_url=url)
        async with harness(tmp_path, runtime, settings) as a, _leased(a):
            sid = (await a.sessions.create(None))["session_id"]
            await a.engine.start(sid, "go", [], None)
            await _streaming(a, sid)
            async with await psycopg.AsyncConnection.connect(url) as locker:
                await locker.execute("SELECT * FROM replica_leases FOR UPDATE")
                locked = time.monotonic()
                for _ in range(int((LEASE_SECONDS + 3 * RENEW_SECONDS + 3) / 0.1)):
                    runs = [r for r in a.registry.runs() if r.session_id == sid]
                    if not runs or runs[0].phase == CANCELLING or runs[0].resolved:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the replica never let go of its run")
                held = time.monotonic() - locked  # renewed at most RENEW_SECONDS before
                assert held >= LEASE_SECONDS - RENEW_SECONDS - 0.5, f"let go after {held:.1f} s"
                await locker.rollback()
            await a.wait_idle(sid, timeout=20)
            finished = [e.data for e in await a.store.read(sid) if e.type == "run.finished"]
            assert [f["state"] for f in finished] == ["interrupted"], finished
            assert finished[0]["maintenance"] is True

    with database() as url:
        asyncio.run(main(url))


def test_a_lease_connection_the_server_ended_is_opened_again(tmp_path: Path) -> None:
    """The lease's connection is ended by the server (a restart, `pg_terminate_backend`):
    the next renewal opens a new one instead of failing until the lease is lost."""

    async def main(url: str) -> None:
        settings = Settings(data_dir=tmp_path, database_url=url)
        async with harness(tmp_path, HeldRuntime(), settings) as a:
            assert a.engine.shared is not None
            await a.engine.shared.renew_lease()
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                await asyncio.sleep(0.2)
                await admin.execute("UPDATE replica_leases SET expires_at = 0")
                await a.engine.shared.renew_lease()
                cur = await admin.execute(
                    "SELECT count(*) FROM replica_leases "
                    "WHERE expires_at > extract(epoch from clock_timestamp())"
                )
                assert await cur.fetchone() == (1,)

    with database() as url:
        asyncio.run(main(url))
