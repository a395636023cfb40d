"""Layers: run journal and worker lifecycle registry (contract invariant 8 names them).

A stateless runtime (`Runtime.stateless`, the OpenAI-compatible one) has no handle to build, so
its run is admitted with its turn and `run.started` is written in the turn's own commit: one
WAL fsync less before the model is asked, and the model is asked while that commit is in
flight (runs/invocation.py). What must still hold: nothing the model says is written before
the turn (invariant 2), it was asked what the log gives (invariant 1), and a Stop that lands
meanwhile interrupts the request, and the run ends cancelled, once; a runtime with
per-session state keeps the two commits and is asked only once the turn is written (its
handle may take long to build, and the turn shows as pending meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from tether.events import Event
from tether.runtimes.base import RuntimeEvent, TurnInput
from tether.sessions.folds import SessionFold
from tether.settings import Settings

from engine_harness import (
    GatedRuntime,
    Harness,
    StatefulGatedRuntime,
    harness,
    until,
    writes_held,
)


def commits_of(h: Harness, session_id: str) -> list[list[str]]:
    """The event types of each committed batch of `session_id`, as the hub publishes them."""
    batches: list[list[str]] = []

    def listen(events: list[Event]) -> None:
        mine = [e.type for e in events if e.session_id == session_id]
        if mine:
            batches.append(mine)

    h.hub.on_batch(listen)
    return batches


def run_turn(tmp_path: Path, runtime: GatedRuntime) -> list[list[str]]:
    async def main() -> list[list[str]]:
        runtime.gate.set()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            batches = commits_of(h, sid)
            await h.engine.start(sid, "hi")
            await h.wait_idle(sid)
            assert runtime.calls == 1
            assert (await h.types(sid))[-1] == "run.finished"
            return batches

    return asyncio.run(main())


def test_a_stateless_runtime_s_turn_and_run_started_are_one_commit(tmp_path: Path) -> None:
    batches = run_turn(tmp_path, GatedRuntime())
    opening = next(b for b in batches if "turn.submitted" in b)
    assert opening == ["turn.submitted", "run.started"]


def test_a_runtime_with_session_state_keeps_run_started_in_a_commit_of_its_own(
    tmp_path: Path,
) -> None:
    batches = run_turn(tmp_path, StatefulGatedRuntime())
    assert ["turn.submitted"] in batches and ["run.started"] in batches


def test_the_model_is_asked_while_the_turn_commits(tmp_path: Path) -> None:
    """Layer: runs (runs/invocation.py, the early request). The model's latency used to start
    only once the turn's commit was on disk; now the request goes out while it commits.
    Its output reaches the log only after the turn (invariant 2), and the model got the
    context the log gives once the turn is in it (invariant 1)."""

    async def main() -> None:
        runtime = ContextRuntime()
        runtime.gate.set()
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            with writes_held(settings):
                start = asyncio.create_task(h.engine.start(sid, "hi"))
                await until(lambda: runtime.calls == 1)
                await asyncio.sleep(0.05)  # its answer is in: none of it may be written
                assert not start.done()
                assert await h.types(sid) == ["session.created"]
            started = await start
            await h.wait_idle(sid)
            assert runtime.calls == 1
            types = [e.type for e in await h.store.read(sid)]
            assert types[1:3] == ["turn.submitted", "run.started"]
            assert types[-1] == "run.finished"
            context = (await h.sessions.folds.get(sid)).transcript.context()
            asked = context["context_messages"][:1]
            assert runtime.asked == [asked] == [[{"role": "user", "content": "hi"}]]
            view = await h.sessions.view(sid)
            assert [m["content"] for m in view["messages"]] == ["hi", "answer"]
            assert started["turn_id"] == view["messages"][0]["turn_id"]

    asyncio.run(main())


def test_a_stop_during_the_opening_commit_interrupts_the_early_request(tmp_path: Path) -> None:
    """The run is admitted, and the model asked, while the turn's commit waits in the writer;
    a Stop then interrupts that request like any Stop of an invoked run: the model's
    request is closed, nothing it said is written, and the run ends cancelled, once."""

    async def main() -> None:
        runtime = GatedRuntime()
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            with writes_held(settings):
                start = asyncio.create_task(h.engine.start(sid, "hi"))
                await until(lambda: runtime.calls == 1)  # asked, not answering (its gate)
                assert not start.done()  # admitted with its turn, which is not durable yet
                stop = asyncio.create_task(h.controls.cancel(session_id=sid))
                await until(lambda: h.registry.phase(sid) == "cancelling")
                assert not start.done()
            started = await start
            assert (await stop)["cancelled"] is True
            await h.wait_idle(sid)
            runtime.gate.set()  # a request that was closed says nothing more
            await asyncio.sleep(0.05)
            assert runtime.calls == 1
            events = await h.store.read(sid)
            ours = [e for e in events if e.stream_id == started["stream_id"]]
            assert [e.type for e in ours] == [
                "turn.submitted",
                "run.started",
                "run.cancel_requested",
                "run.finished",
            ]
            assert ours[-1].data["state"] == "cancelled"

    asyncio.run(main())


def test_a_runtime_with_session_state_is_asked_only_once_the_turn_is_written(
    tmp_path: Path,
) -> None:
    """Its handle may take long to build and it keeps what it is told: it is never asked
    for a turn the log does not hold yet, and a Stop during that commit means no request."""

    async def main() -> None:
        runtime = StatefulGatedRuntime()
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            with writes_held(settings):
                start = asyncio.create_task(h.engine.start(sid, "hi"))
                await until(lambda: h.registry.busy(sid))
                await asyncio.sleep(0.05)
                assert runtime.calls == 0
                stop = asyncio.create_task(h.controls.cancel(session_id=sid))
                await until(lambda: h.registry.phase(sid) == "cancelling")
            await start
            assert (await stop)["cancelled"] is True
            await h.wait_idle(sid)
            assert runtime.calls == 0

    asyncio.run(main())


class ContextRuntime(GatedRuntime):
    """Notes the messages of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[dict]] = []

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.asked.append(turn.messages)
        async for event in super().stream(turn):
            yield event


class ReadCountingRuntime(GatedRuntime):
    """Notes how many log reads had been made when the model was asked."""

    def __init__(self, reads: list[str]) -> None:
        super().__init__()
        self.reads = reads
        self.reads_when_asked: int | None = None

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.reads_when_asked = len(self.reads)
        async for event in super().stream(turn):
            yield event


def test_a_new_session_s_first_turn_reads_nothing_from_the_log_before_the_model(
    tmp_path: Path,
) -> None:
    """Layer: the server's session folds (sessions/folds.py), each the fold of its log. A
    session just created is cached from the events that created it, so its first turn's
    context needs no read of the log (a thread hop, about 0.5 ms of the first token); the
    context the model gets is still the whole log's, and a fold evicted since is read."""
    reads: list[str] = []
    runtime = ReadCountingRuntime(reads)

    async def main() -> None:
        runtime.gate.set()
        async with harness(tmp_path, runtime) as h:
            h.note_reads(reads)
            sid = (await h.sessions.create("first"))["session_id"]
            await h.engine.start(sid, "hi")
            await h.wait_idle(sid)
            assert runtime.reads_when_asked == 0
            cached = await h.sessions.folds.get(sid)
            from_log = SessionFold()
            for event in await h.store.read(sid):
                from_log.apply(event)
            assert cached.row == from_log.row
            assert cached.transcript.view() == from_log.transcript.view()

            h.sessions.folds.forget(sid)  # evicted: the next turn reads the log
            before = len(reads)
            await h.engine.start(sid, "again")
            await h.wait_idle(sid)
            assert runtime.reads_when_asked is not None and runtime.reads_when_asked > before

    asyncio.run(main())
