"""The run engine wired as the app wires it (real SQLite, real hub), without HTTP, for the
races that need control over the event loop's interleaving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from tether.log import Hub
from tether.log.attachments import AttachmentStore
from tether.log.sqlite import SQLiteEventStore
from tether.log.store import EventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.runs import maintenance
from tether.runs.engine import RunEngine
from tether.runs.registry import RunRegistry
from tether.runtimes.base import Runtime
from tether.sessions.service import SessionService


@dataclass
class Harness:
    store: EventStore
    registry: RunRegistry
    sessions: SessionService
    engine: RunEngine

    async def types(self, session_id: str) -> list[str]:
        return [e.type for e in await self.store.read(session_id)]

    async def wait_idle(self, session_id: str, timeout: float = 10) -> None:
        for _ in range(int(timeout / 0.01)):
            if not self.registry.busy(session_id):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("still busy")


@asynccontextmanager
async def harness(tmp_path: Path, runtime: Runtime) -> AsyncIterator[Harness]:
    store = SQLiteEventStore(
        tmp_path / "tether.db", index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION
    )
    store.attach_hub(Hub(asyncio.get_running_loop()))
    registry = RunRegistry()
    attachments = AttachmentStore(tmp_path / "attachments")
    sessions = SessionService(store, registry, attachments)
    engine = RunEngine(
        store=store, sessions=sessions, registry=registry, runtime=runtime, attachments=attachments
    )
    try:
        yield Harness(store, registry, sessions, engine)
    finally:
        await maintenance.shutdown(engine, grace=1)
        await store.aclose()
