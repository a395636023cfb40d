"""Layer: runtime handle registration and the per-session reusable cache (contract "Agent
registration after cancellation"), with a runtime whose construction and first call block on
barriers. Driven in-process so each race is placed exactly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from tether.runs.handles import HandleCache
from tether.runs.maintenance import reclaim
from tether.runtimes.base import Runtime, RuntimeEvent, TextDelta, TurnInput

from engine_harness import Harness, harness


async def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    """Wait for `condition`, failing clearly (not hanging) when it never holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


class BarrierHandle:
    def __init__(self, runtime: BarrierRuntime):
        self.runtime = runtime
        self.calls = 0
        self.interrupts = 0
        self.closed = False

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.calls += 1
        self.runtime.calls_started.set()
        if self.runtime.stubborn:
            give_up = time.monotonic() + 60  # a failed test's clean-up never waits forever
            while not self.runtime.release_stubborn.is_set() and time.monotonic() < give_up:
                # a runtime that ignores the interrupt
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)
            return
        await self.runtime.call_gate.wait()
        yield TextDelta("answer")

    def interrupt(self) -> None:
        self.interrupts += 1

    async def close(self) -> None:
        self.closed = True


class BarrierRuntime(Runtime):
    name = "barrier"
    model = "barrier-1"
    demo = False

    def __init__(self) -> None:
        self.construct_gate = asyncio.Event()
        self.call_gate = asyncio.Event()
        self.calls_started = asyncio.Event()
        self.release_stubborn = asyncio.Event()
        self.stubborn = False
        self.built: list[BarrierHandle] = []

    def accepts(self, mime: str) -> bool:
        return True

    async def open_handle(self, session_id: str) -> BarrierHandle:
        handle = BarrierHandle(self)
        self.built.append(handle)
        await self.construct_gate.wait()
        return handle

    async def summarize(self, messages: list, model: str | None) -> str:
        return "summary"

    async def aclose(self) -> None:
        return None


async def completed_run(h: Harness, runtime: BarrierRuntime, sid: str) -> None:
    runtime.construct_gate.set()
    runtime.call_gate.set()
    await h.engine.start(sid, "warm up")
    await h.wait_idle(sid)


def test_stop_during_construction_never_calls_never_caches_and_cleans_up(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = BarrierRuntime()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "hi")
            while not runtime.built:
                await asyncio.sleep(0.001)  # the worker is constructing its handle
            assert (await h.controls.cancel(stream_id=run["stream_id"]))["cancelled"]
            runtime.construct_gate.set()
            await h.wait_idle(sid)
            candidate = runtime.built[0]
            assert candidate.calls == 0 and candidate.interrupts == 0
            assert candidate.closed is True  # construction-cancellation cleanup
            assert h.engine.handles.borrow(sid) is None  # never published
            assert (await h.types(sid))[-1] == "run.finished"

    asyncio.run(main())


def test_rejected_cache_hit_leaves_the_borrowed_handle_alone(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = BarrierRuntime()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            await completed_run(h, runtime, sid)
            cached = h.engine.handles.borrow(sid)
            assert cached is runtime.built[0] and h.engine.handles.owner(sid) is None
            run = await h.engine.start(sid, "again")
            await h.controls.cancel(stream_id=run["stream_id"])  # before the worker registers
            await h.wait_idle(sid)
            assert cached.calls == 1 and cached.interrupts == 0 and not cached.closed
            assert h.engine.handles.borrow(sid) is cached
            assert len(runtime.built) == 1

    asyncio.run(main())


def test_stop_after_admission_before_invocation_retires_only_its_own_entry(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = BarrierRuntime()
        runtime.construct_gate.set()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "hi")
            while h.registry.phase(sid) != "running":
                await asyncio.sleep(0)  # admitted; now appending run.started
            assert h.engine.handles.owner(sid) == run["stream_id"]
            assert (await h.controls.cancel(stream_id=run["stream_id"]))["cancelled"]
            await h.wait_idle(sid)
            handle = runtime.built[0]
            assert handle.calls == 0  # invocation never started
            assert handle.interrupts == 0  # so no interrupt either
            assert handle.closed and h.engine.handles.borrow(sid) is None  # retired

    asyncio.run(main())


def test_stop_during_the_first_call_interrupts_the_admitted_handle(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = BarrierRuntime()
        runtime.construct_gate.set()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "hi")
            await runtime.calls_started.wait()  # blocked inside the first call
            assert (await h.controls.cancel(stream_id=run["stream_id"]))["cancelled"]
            await h.wait_idle(sid)
            handle = runtime.built[0]
            assert handle.calls == 1 and handle.interrupts == 1
            assert h.engine.handles.borrow(sid) is handle  # kept for reuse
            assert h.engine.handles.owner(sid) is None
            finished = (await h.store.read(sid))[-1]
            assert finished.data["state"] == "cancelled"

    asyncio.run(main())


def test_an_old_worker_never_clears_a_successors_handle_or_ownership(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = BarrierRuntime()
        runtime.construct_gate.set()
        runtime.stubborn = True
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            old = await h.engine.start(sid, "wedge")
            await runtime.calls_started.wait()
            await h.controls.cancel(stream_id=old["stream_id"])
            await until(lambda: not h.registry.for_session(sid).channel_open)
            old_handle = runtime.built[0]
            assert h.engine.handles.owner(sid) == old["stream_id"]  # still busy inside
            run = h.registry.for_session(sid)
            assert reclaim(h.engine, 1.0, now=run.cancelled_at + 1.0) == [run]
            runtime.stubborn = False
            new = await h.engine.start(sid, "successor")
            # The successor waits at the call gate, so it still owns its handle when looked
            # at (opened before, a fast successor could finish between two looks: a hang).
            await until(lambda: h.engine.handles.owner(sid) == new["stream_id"])
            new_handle = h.engine.handles.borrow(sid)
            assert new_handle is not old_handle  # never shares the wedged handle
            runtime.call_gate.set()
            runtime.release_stubborn.set()  # the old worker finally unwinds
            await h.wait_idle(sid)
            await asyncio.sleep(0.05)
            assert h.engine.handles.borrow(sid) is new_handle
            assert not new_handle.closed
            events = await h.store.read(sid)
            new_events = [e for e in events if e.stream_id == new["stream_id"]]
            assert new_events[-1].data["state"] == "completed"
            # a steer aimed at the old run can never reach the successor
            late = await h.controls.steer(old["stream_id"], "for the old run")
            assert late["accepted"] is False

    asyncio.run(main())


def test_cache_eviction_never_takes_an_active_workers_handle(tmp_path: Path) -> None:
    """Contract: "LRU eviction/close ... retains the existing active-worker policy". With room
    for one handle, admitting new runs evicts (and closes, outside the admission step) only
    handles no run owns; a running worker's handle stays, is never closed, and its turn ends
    normally with it."""

    async def main() -> None:
        runtime = BarrierRuntime()
        runtime.construct_gate.set()
        async with harness(tmp_path, runtime) as h:
            h.engine.handles = HandleCache(capacity=1)
            idle, busy, newer, later = [
                (await h.sessions.create(None))["session_id"] for _ in range(4)
            ]
            await completed_run(h, runtime, idle)
            [idle_handle] = runtime.built
            runtime.call_gate.clear()  # from here, calls wait until released
            runtime.calls_started.clear()
            await h.engine.start(busy, "long")
            await asyncio.wait_for(runtime.calls_started.wait(), 5)
            busy_handle = runtime.built[1]
            assert idle_handle.closed is True  # the least recent idle handle made room
            assert h.engine.handles.borrow(idle) is None
            await h.engine.start(newer, "also long")
            while len(runtime.built) < 3 or h.registry.phase(newer) != "running":
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # past the newer run's admission
            # Over capacity, but both handles belong to running workers: neither goes.
            assert h.engine.handles.borrow(busy) is busy_handle and not busy_handle.closed
            assert h.engine.handles.owner(busy) is not None
            runtime.call_gate.set()
            await h.wait_idle(busy)
            await h.wait_idle(newer)
            assert busy_handle.calls == 1 and busy_handle.closed is False
            view = await h.sessions.view(busy)
            assert view["messages"][-1]["state"] == "completed"
            await h.engine.start(later, "short")  # now idle, the older handles may go
            await h.wait_idle(later)
            assert busy_handle.closed is True and h.engine.handles.borrow(later) is not None

    asyncio.run(main())
