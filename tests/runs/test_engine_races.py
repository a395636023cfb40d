"""Layer: run registry and worker lifecycle (contract "Agent registration after
cancellation" and invariant 9). These need control over the event loop's interleaving, so
they drive the engine in-process on a real SQLite log."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from tether.runs.leases import stop_own_runs
from tether.runs.maintenance import reclaim
from tether.runtimes.base import Runtime, RuntimeEvent, TextDelta, TurnInput

from engine_harness import harness, has, hold_append


class StubbornRuntime(Runtime):
    """Ignores cancellation on its first turn (a wedged agent); behaves on later turns."""

    name = "stubborn"
    model = "stubborn-1"
    demo = False

    def __init__(self) -> None:
        self.turns = 0
        self.late_yields = 0
        self.released = False  # lets the test end its event loop

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.turns += 1
        if self.turns > 1:
            yield TextDelta("fine")
            return
        yield TextDelta("working")
        while not self.released:
            with contextlib.suppress(asyncio.CancelledError):  # an interrupt it does not honour
                await asyncio.sleep(0.01)
            self.late_yields += 1
            yield TextDelta(" late")

    async def aclose(self) -> None:
        return None


class CountingRuntime(Runtime):
    name = "counting"
    model = "counting-1"
    demo = False

    def __init__(self) -> None:
        self.invocations = 0

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.invocations += 1
        yield TextDelta("answer")

    async def aclose(self) -> None:
        return None


def test_stop_before_invocation_means_the_runtime_is_never_called(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = CountingRuntime()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "hi", [], None)
            # No await between start's return and Stop's phase change: Stop wins the race
            # against the worker's preparation, as a Stop arriving during construction would.
            stop = await h.controls.cancel(stream_id=run["stream_id"])
            assert stop["cancelled"] is True
            await h.wait_idle(sid)
            assert runtime.invocations == 0
            types = await h.types(sid)
            assert types == [
                "session.created",
                "turn.submitted",
                "run.cancel_requested",
                "run.finished",
            ]
            finished = (await h.store.read(sid))[-1]
            assert finished.data["state"] == "cancelled"

    asyncio.run(main())


class StreamingRuntime(Runtime):
    """Streams a word every 10 ms until it is interrupted."""

    name = "streaming"
    model = "streaming-1"
    demo = False

    def __init__(self) -> None:
        """No settings: it streams the one word."""

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        while True:
            yield TextDelta("word ")
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        return None


def test_a_stop_is_recorded_before_the_run_ends_even_when_its_append_waits(
    tmp_path: Path,
) -> None:
    """Layer: runs controls and worker (invariant 9: a Stop is one durable
    `run.cancel_requested`, then the run's one `run.finished` in state `cancelled`). Stop
    closes the model request first and then records itself; when that record waits (on
    PostgreSQL, or with accounts, the ownership check reads the database first), the worker,
    stopped at once, must not write its `run.finished` ahead of it: the log then fenced the
    Stop's record out (StreamClosed, swallowed) and held a cancelled run that no Stop asked
    for. Found by CI on the removed-user test over two replicas."""

    async def main() -> None:
        async with harness(tmp_path, StreamingRuntime()) as h:
            # as a database round trip before the write
            hold_append(h, has("run.cancel_requested"), lambda: asyncio.sleep(0.2))
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "go", [], None)
            while "text.delta" not in await h.types(sid):
                await asyncio.sleep(0.01)
            assert (await h.controls.cancel(stream_id=run["stream_id"]))["cancelled"]
            await h.wait_idle(sid)
            types = await h.types(sid)
            assert types.count("run.cancel_requested") == 1, types
            assert types.index("run.cancel_requested") < types.index("run.finished"), types
            assert (await h.store.read(sid))[-1].data["state"] == "cancelled"

    asyncio.run(main())


def test_wedged_worker_is_busy_not_attachable_then_reclaimed_and_fenced(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = StubbornRuntime()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            first = await h.engine.start(sid, "go", [], None)
            while "text.delta" not in await h.types(sid):
                await asyncio.sleep(0.01)
            assert (await h.controls.cancel(stream_id=first["stream_id"]))["cancelled"]
            for _ in range(100):  # the client reaches a terminal state promptly
                if (await h.types(sid))[-1] == "run.finished":
                    break
                await asyncio.sleep(0.01)
            assert (await h.types(sid))[-1] == "run.finished"
            await asyncio.sleep(0.1)
            assert runtime.late_yields > 0  # the runtime ignored the interrupt
            assert h.registry.busy(sid) is True  # admission still sees the unwinding worker
            assert h.registry.attachable_stream(sid) is None  # a browser must not attach
            assert h.registry.phase(sid) == "cancelling"
            run = h.registry.for_session(sid)
            assert run is not None and run.channel_open is False
            window = 180.0
            assert reclaim(h.engine, window, now=run.cancelled_at + window - 1) == []
            assert reclaim(h.engine, window, now=run.cancelled_at + window) == [run]
            assert h.registry.busy(sid) is False
            second = await h.engine.start(sid, "again", [], None)
            await h.wait_idle(sid)
            await asyncio.sleep(0.1)  # the old runtime keeps yielding into the void
            events = await h.store.read(sid)
            old = [e for e in events if e.stream_id == first["stream_id"]]
            assert old[-1].type == "run.finished"
            assert all(e.data.get("text") != " late" or e.seq < old[-1].seq for e in old)
            new = [e for e in events if e.stream_id == second["stream_id"]]
            assert [e.type for e in new][-1] == "run.finished"
            assert all(e.data.get("text") != " late" for e in new)
            assert new[-1].data["state"] == "completed"
            runtime.released = True

    asyncio.run(main())


def test_age_alone_never_reclaims_a_run_that_owns_a_live_channel(tmp_path: Path) -> None:
    async def main() -> None:
        async with harness(tmp_path, CountingRuntime()) as h:
            from tether.runs.registry import CANCELLING, Run

            run = Run("s_x", "r_x", "u_x")
            h.registry.add(run)
            h.registry.move(run, CANCELLING)
            run.cancelled_at = time.time() - 10_000
            assert run.channel_open is True
            assert reclaim(h.engine, 60) == []
            assert h.registry.busy("s_x") is True
            run.channel_open = False
            assert reclaim(h.engine, 60) == [run]

    asyncio.run(main())


def test_reclaim_window_is_measured_from_the_cancel_not_the_start(tmp_path: Path) -> None:
    async def main() -> None:
        async with harness(tmp_path, CountingRuntime()) as h:
            from tether.runs.registry import CANCELLING, Run

            run = Run("s_y", "r_y", "u_y", started_at=time.time() - 10_000)
            h.registry.add(run)
            h.registry.move(run, CANCELLING)  # a long run cancelled just now
            run.channel_open = False
            assert run.cancelled_at is not None
            # 10,000 s after its start but just under the window after its cancel: kept.
            assert reclaim(h.engine, 60, now=run.cancelled_at + 59.9) == []
            assert h.registry.busy("s_y") is True
            # The window measured from the cancel has passed: freed (a reclaimer that never
            # fires fails here).
            assert reclaim(h.engine, 60, now=run.cancelled_at + 60) == [run]
            assert h.registry.busy("s_y") is False

    asyncio.run(main())


class UntilStoppedRuntime(Runtime):
    """Answers a little, then waits until it is stopped."""

    name = "until-stopped"
    model = "until-stopped-1"
    demo = False

    def __init__(self) -> None:
        pass

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        yield TextDelta("working")
        await asyncio.sleep(60)

    async def aclose(self) -> None:
        return None


def test_an_edit_racing_send_now_is_what_is_sent_or_is_refused(tmp_path: Path) -> None:
    """Layers: log (queue.updated, turn.submitted, queue.removed), transcript (`queued`).
    `queue/start` and an edit of the same queued message interleave on the event loop: the
    edit either lands first and is the text the turn carries, or finds the item gone (404
    `queue_item_not_found`). An edit that was accepted is never dropped (no typed word is
    lost), and the item leaves the queue in the turn's own append, once."""
    from tether.errors import QueueItemNotFound

    async def main() -> None:
        async with harness(tmp_path, UntilStoppedRuntime()) as h:
            sid = (await h.sessions.create(None))["session_id"]
            for attempt in range(3):
                first = await h.engine.start(sid, f"turn {attempt}", [], None)
                queued = await h.queue.add(sid, f"original {attempt}", [])
                await h.controls.cancel(stream_id=first["stream_id"])
                await h.wait_idle(sid)
                started, edited = await asyncio.gather(
                    h.queue.start(queued["queue_id"]),
                    h.queue.update(queued["queue_id"], f"edited {attempt}"),
                    return_exceptions=True,
                )
                assert isinstance(started, dict), started
                await h.controls.cancel(stream_id=started["stream_id"])
                await h.wait_idle(sid)
                events = await h.store.read(sid)
                sent = [e.data["text"] for e in events if e.type == "turn.submitted"][-1]
                if isinstance(edited, QueueItemNotFound):
                    assert sent == f"original {attempt}"
                else:
                    assert edited == {"ok": True, "queue_id": queued["queue_id"]}, edited
                    assert sent == f"edited {attempt}"
                taken = [e.seq for e in events if e.type == "queue.removed"]
                submitted = [e.seq for e in events if e.type == "turn.submitted"]
                assert len(taken) == attempt + 1 and taken[-1] == submitted[-1] + 1

    asyncio.run(main())


def test_a_stop_while_the_turn_is_recorded_is_recorded_after_the_turn(tmp_path: Path) -> None:
    """Layer: runs engine and controls (invariant 9: a Stop is one durable
    `run.cancel_requested` of an open run, then the run's one `run.finished` in state
    `cancelled`). A run is in the registry while its `turn.submitted` is being appended, so
    a Stop by session (the page's Stop before it has the stream) finds it. When that append
    waited (with accounts on PostgreSQL, the ownership check reads the database before the
    write), the Stop's record reached the log before the turn it stops, where the transcript
    fold ignores it (no scene yet): the log held a cancelled run no Stop was seen to ask for."""

    async def main() -> None:
        async with harness(tmp_path, StreamingRuntime()) as h:
            # as a database round trip before the write
            hold_append(h, has("turn.submitted"), lambda: asyncio.sleep(0.2))
            sid = (await h.sessions.create(None))["session_id"]
            start = asyncio.create_task(h.engine.start(sid, "go", [], None))
            while not h.registry.busy(sid):
                await asyncio.sleep(0.001)
            assert (await h.controls.cancel(session_id=sid))["cancelled"]
            await start
            await h.wait_idle(sid)
            types = await h.types(sid)
            assert types == [
                "session.created",
                "turn.submitted",
                "run.cancel_requested",
                "run.finished",
            ], types
            assert (await h.store.read(sid))[-1].data["state"] == "cancelled"

    asyncio.run(main())


class HoldingRuntime(Runtime):
    """Takes steers from the inbox as soon as they come and holds them until its agent takes
    them in at a step boundary, which never comes; closed (a Stop), it gives back what it
    holds, as the Hermes runtime does (runtimes/hermes/streaming.py `_Steers`)."""

    name = "holding"
    model = "holding-1"
    demo = False

    def __init__(self) -> None:
        self.held: list[tuple[str, str]] = []

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        inbox = turn.steer
        assert inbox is not None
        yield TextDelta("working")
        try:
            while True:
                ids: list[str] = []
                notify, inbox.on_drain = inbox.on_drain, ids.extend  # not delivered yet
                try:
                    texts = inbox.drain()
                finally:
                    inbox.on_drain = notify
                self.held += zip(ids, texts, strict=True)
                await asyncio.sleep(0.01)
        finally:
            for steer_id, text in self.held:  # never taken in: back to the inbox
                inbox.put(steer_id, text)

    async def aclose(self) -> None:
        return None


def test_a_steer_the_runtime_gives_back_as_it_is_stopped_comes_back_as_leftover(
    tmp_path: Path,
) -> None:
    """Layer: runs worker (the steer inbox; docs/api.md §4: what the agent never took in
    comes back as `steer.leftover`, no typed word is lost). A runtime that holds steers it
    forwarded to its agent gives them back when it is closed; on a Stop the worker, woken
    first, closed the inbox before the runtime's cleanup ran, and the given-back steer was
    dropped: no `steer.leftover`, so the page never put the text back in the composer."""

    async def main() -> None:
        runtime = HoldingRuntime()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "go", [], None)
            while "text.delta" not in await h.types(sid):
                await asyncio.sleep(0.01)
            assert (await h.controls.steer(run["stream_id"], "mention the budget"))["accepted"]
            while not runtime.held:
                await asyncio.sleep(0.01)
            assert (await h.controls.cancel(stream_id=run["stream_id"]))["cancelled"]
            await h.wait_idle(sid)
            events = await h.store.read(sid)
            leftovers = [e.data["text"] for e in events if e.type == "steer.leftover"]
            assert leftovers == ["mention the budget"], [e.type for e in events]
            assert events[-1].type == "run.finished" and events[-1].data["state"] == "cancelled"

    asyncio.run(main())


def test_a_run_stopped_for_a_lost_lease_ends_interrupted_by_maintenance_not_cancelled(
    tmp_path: Path,
) -> None:
    """Layer: runs leases and worker (invariant 4: maintenance never reads as the user's
    act; invariant 9: one `run.finished`). A replica that could not renew its lease (the
    database unreachable past LEASE_SECONDS, runs/leases.py) stops its runs; when no other
    replica took them over (one replica, the database back), the worker's end used to be
    `cancelled`: the page said "Stopped" for a Stop nobody made. It is `interrupted`, marked
    maintenance, with the reason in words, and no `run.cancel_requested`."""

    async def main() -> None:
        async with harness(tmp_path, StreamingRuntime()) as h:
            sid = (await h.sessions.create(None))["session_id"]
            await h.engine.start(sid, "go", [], None)
            while "text.delta" not in await h.types(sid):
                await asyncio.sleep(0.01)
            stop_own_runs(h.engine)
            await h.wait_idle(sid)
            events = await h.store.read(sid)
            assert "run.cancel_requested" not in [e.type for e in events]
            finished = events[-1]
            assert finished.type == "run.finished"
            assert finished.data["state"] == "interrupted", finished.data
            assert finished.data["maintenance"] is True
            assert "database" in finished.data["reason"]

    asyncio.run(main())
