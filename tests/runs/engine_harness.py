"""The run engine wired as the app wires it (`tether.services.build_services`: real SQLite,
real hub, the queue and rotation between turns), without HTTP, for the races that need
control over the event loop's interleaving."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.events import Event
from tether.log import Draft
from tether.log.store import EventStore
from tether.log.subscriptions import Hub
from tether.runs import maintenance
from tether.runs.controls import RunControls
from tether.runs.engine import RunEngine
from tether.runs.queue import QueueService
from tether.runs.registry import RunRegistry
from tether.runtimes.base import Runtime, RuntimeEvent, TextDelta, TurnInput
from tether.services import build_services
from tether.sessions.service import SessionService
from tether.settings import Settings


@dataclass
class Harness:
    store: EventStore
    registry: RunRegistry
    sessions: SessionService
    engine: RunEngine
    queue: QueueService
    controls: RunControls
    hub: Hub

    async def types(self, session_id: str) -> list[str]:
        return [e.type for e in await self.store.read(session_id)]

    def note_reads(self, reads: list[str]) -> None:
        """Append to `reads` the session of every log read from now on (a probe: the real
        read still runs)."""
        real_read = self.store.read

        async def read(session_id: str, *args: Any, **kwargs: Any) -> list[Event]:
            reads.append(session_id)
            return await real_read(session_id, *args, **kwargs)

        self.store.read = read  # type: ignore[method-assign]

    async def wait_idle(self, session_id: str, timeout: float = 10) -> None:
        for _ in range(int(timeout / 0.01)):
            if not self.registry.busy(session_id):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("still busy")


@asynccontextmanager
async def harness(
    tmp_path: Path, runtime: Runtime, settings: Settings | None = None
) -> AsyncIterator[Harness]:
    services = build_services(settings or Settings(data_dir=tmp_path), runtime)
    try:
        yield Harness(
            services.store,
            services.registry,
            services.sessions,
            services.engine,
            services.queue,
            services.controls,
            services.hub,
        )
    finally:
        await maintenance.shutdown(services.engine, grace=1)
        await services.store.aclose()


class GatedRuntime(Runtime):
    """Stateless; answers "answer" once its gate is set, counting its invocations."""

    name = "gated"
    model = "gated-1"
    stateless = True

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.calls += 1
        await self.gate.wait()
        yield TextDelta("answer")


class StatefulGatedRuntime(GatedRuntime):
    stateless = False


class NothingElsewhere:
    """The parts of `AgentHistory` (runtimes/base.py) for an agent no other client drives:
    nothing started elsewhere, nothing bound, nothing to look at again. A runtime in a test
    mixes it in and writes the rest."""

    async def agent_started_elsewhere(self, exists: Callable[[str], bool]) -> list[dict]:
        return []

    async def bind(self, session_id: str, agent_session_id: str) -> bool:
        return True

    async def agent_adopted(self, agent_session_id: str) -> None:
        return None

    async def agent_owner(self, agent_session_id: str) -> str | None:
        return None

    async def agent_look_again(self) -> None:
        return None


async def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


def hold_append(
    h: Harness, when: Callable[[list[Draft]], bool], meanwhile: Callable[[], Awaitable[Any]]
) -> None:
    """Replica `h`'s first append of drafts `when` picks waits for `meanwhile` (another
    replica's command, to its commit) before it goes to the database."""
    real_append = h.store.append
    held = False

    async def append(session_id: str, drafts: list[Draft]) -> list:
        nonlocal held
        if not held and when(drafts):
            held = True
            await meanwhile()
        return await real_append(session_id, drafts)

    h.store.append = append  # type: ignore[method-assign]


def has(event_type: str, **data: Any) -> Callable[[list[Draft]], bool]:
    def picks(drafts: list[Draft]) -> bool:
        return any(
            d.type == event_type and all(d.data.get(k) == v for k, v in data.items())
            for d in drafts
        )

    return picks


@contextmanager
def writes_held(settings: Settings) -> Iterator[None]:
    """Another connection holds the SQLite database's write lock: appends wait in the writer."""
    holder = sqlite3.connect(settings.database_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()
