"""A Stop that finds a run whose turn is still on its way to the log (layer: runs engine and
controls, runs/engine.py `_record`, runs/controls.py `cancel`, over the PostgreSQL log;
contract invariant 9: a Stop is one durable `run.cancel_requested` of a run the log holds).
Two engines wired as the app wires them, on one real database."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from pg import database

from tether.log.errors import SessionOccupied
from tether.settings import Settings

from engine_harness import GatedRuntime, Harness, harness, has, hold_append

pytestmark = pytest.mark.slow


def _replica(data: Path, url: str) -> AbstractAsyncContextManager[Harness]:
    return harness(data, GatedRuntime(), Settings(data_dir=data, database_url=url))


def test_a_stop_of_a_turn_the_database_then_refuses_records_nothing(tmp_path: Path) -> None:
    """Replica A registers its run before it appends the turn; a Stop by session through A
    finds it there. Replica B admits a turn in the session first, so the database refuses
    A's (SessionOccupied): A's run never was. The Stop wrote its `run.cancel_requested` all
    the same, for a stream the log never held, in the session B's run occupies, and said
    `cancelled: true` for it. It now waits for the turn's outcome: nothing to stop."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            stops: list[asyncio.Task] = []

            async def meanwhile() -> None:
                stops.append(asyncio.create_task(a.controls.cancel(session_id=sid)))
                await asyncio.sleep(0.1)  # the Stop does what it does before the turn's write
                await b.engine.start(sid, "b's turn", [], None)

            hold_append(a, has("turn.submitted"), meanwhile)
            with pytest.raises(SessionOccupied):
                await a.engine.start(sid, "a's turn", [], None)
            assert (await stops[0])["cancelled"] is False
            assert "run.cancel_requested" not in await a.types(sid)
            assert isinstance(b.engine.runtime, GatedRuntime)
            b.engine.runtime.gate.set()
            await b.wait_idle(sid)
            finished = [e for e in await b.store.read(sid) if e.type == "run.finished"]
            assert [e.data["state"] for e in finished] == ["completed"]

    with database() as url:
        asyncio.run(main(url))
