"""Agent sync's interval passes (runs/agent_sync.py). Layers: the log (`agent.imported`) and,
through it, the visible transcript and model context (contract invariant 1: the model sees
what the user sees). The runtime says a session's agent rows moved once; when a run still
occupies the session then, the pass must come later, though nothing moves again (the agent's
last write of a turn comes before the run ends: CI once waited 30 s for a CLI turn that a
pass had skipped as busy and never read)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.runs.agent_sync import RETRY_FIRST_SECONDS, AgentSync
from tether.runtimes.base import AgentHistory, AgentNews, Capabilities

from engine_harness import GatedRuntime, NothingElsewhere, harness, until

CLI_TURN = {
    "kind": "turn",
    "turn_id": "a_3",
    "rows": [
        {"row_id": 3, "role": "user", "content": "from the cli", "timestamp": 50.0, "images": 0},
        {"row_id": 4, "role": "assistant", "content": "answer to the cli", "timestamp": 51.0},
    ],
    "context": [
        {"role": "user", "content": "from the cli"},
        {"role": "assistant", "content": "answer to the cli"},
    ],
}


class SharedAgentRuntime(NothingElsewhere, GatedRuntime):
    """A runtime whose agent keeps its own history, written also by another client: the
    test says when that client wrote a turn (`cli_wrote`) and when the rows moved."""

    name = "shared-agent"
    capabilities = Capabilities(agent_sync=True)

    def __init__(self) -> None:
        super().__init__()
        self.moved: list[str] = []  # said once, by the next `agent_changed`
        self.cli_wrote = False
        self.reads: list[str] = []

    def agent_history(self) -> AgentHistory:
        return self

    async def agent_changed(self) -> list[str]:
        moved, self.moved = self.moved, []
        return moved

    async def agent_news(self, session_id: str, watermark: int, continued: Any = ()) -> AgentNews:
        self.reads.append(session_id)
        if not self.cli_wrote or watermark >= 4:
            return AgentNews(watermark)
        return AgentNews(4, [CLI_TURN])


async def two_intervals(
    tmp_path: Path, runtime: SharedAgentRuntime, between: Callable[[], None]
) -> tuple[list[str], list[str]]:
    """A session whose agent rows moved once (the CLI wrote a turn): its log after one
    interval's pass and after the next, `between` called in between."""
    async with harness(tmp_path, runtime) as h:
        syncer = AgentSync(h.sessions, runtime)
        sid = (await h.sessions.create(None))["session_id"]
        runtime.cli_wrote, runtime.moved = True, [sid]
        await syncer.sync_moved()
        first = await h.types(sid)
        between()
        await syncer.sync_moved()
        return first, await h.types(sid)


def test_rows_that_moved_during_a_run_are_read_by_a_later_pass(tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[str], dict[str, Any], list[str]]:
        runtime = SharedAgentRuntime()
        async with harness(tmp_path, runtime) as h:
            syncer = AgentSync(h.sessions, runtime)
            sid = (await h.sessions.create(None))["session_id"]
            await h.engine.start(sid, "from tether")
            await until(lambda: runtime.calls == 1)  # the run occupies the session
            runtime.cli_wrote, runtime.moved = True, [sid]
            await syncer.sync_moved()
            during = await h.types(sid)
            runtime.gate.set()
            await h.wait_idle(sid)
            await syncer.sync_moved()  # nothing moved since: the session is read anyway
            await syncer.sync_moved()
            reads = list(runtime.reads)
            fold = await h.sessions.folds.get(sid)
            return during, await h.types(sid), fold.transcript.view(), reads

    during, after, view, reads = asyncio.run(main())
    assert "agent.imported" not in during  # a run's rows are Tether's own: no pass then
    assert after.count("agent.imported") == 1
    assert [(m["role"], m["content"], m.get("origin")) for m in view["messages"]] == [
        ("user", "from tether", None),
        ("assistant", "answer", None),
        ("user", "from the cli", "agent"),
        ("assistant", "answer to the cli", "agent"),
    ]
    # before_start's pass, then one interval pass once the run ended; none after it.
    assert len(reads) == 2


def test_a_pass_the_agent_defers_is_taken_at_the_next_interval(tmp_path: Path) -> None:
    """The agent may still be writing a turn after Tether's run ended (an interrupted turn):
    it answers None, and the session waits for the next interval's pass."""

    class WritingRuntime(SharedAgentRuntime):
        def __init__(self) -> None:
            super().__init__()
            self.still_writing = True

        async def agent_news(
            self, session_id: str, watermark: int, continued: Any = ()
        ) -> AgentNews | None:
            if self.still_writing:
                self.reads.append(session_id)
                return None
            return await super().agent_news(session_id, watermark)

    runtime = WritingRuntime()

    def written() -> None:
        runtime.still_writing = False

    deferred, after = asyncio.run(two_intervals(tmp_path, runtime, written))
    assert deferred == ["session.created"]
    assert after == ["session.created", "agent.imported"]


class ChunkedRuntime(SharedAgentRuntime):
    """Its agent reads a bounded number of rows a pass: the CLI's turn comes in the second."""

    examined = 0  # how far it looked: kept by the runtime when it imports nothing

    async def agent_news(self, session_id: str, watermark: int, continued: Any = ()) -> AgentNews:
        self.reads.append(session_id)
        start = max(watermark, self.examined)
        if not self.cli_wrote or start >= 4:
            return AgentNews(start)
        if start < 2:  # the first chunk: rows of no turn yet, more to come
            self.examined = 2
            return AgentNews(2, [], more=True)
        return AgentNews(4, [CLI_TURN])


def test_a_bounded_pass_that_left_rows_is_continued_at_the_next_interval(tmp_path: Path) -> None:
    """A pass reads a bounded number of the agent's rows: when it says more remain, the
    session is read again at the next interval, though nothing moved since."""

    first, after = asyncio.run(two_intervals(tmp_path, ChunkedRuntime(), lambda: None))
    assert first == ["session.created"]
    assert after == ["session.created", "agent.imported"]


def test_a_session_whose_pass_fails_does_not_hold_up_the_others(tmp_path: Path) -> None:
    """One session's failing pass (a damaged row, a bug) is logged and retried later; the
    sessions after it are still read in the same interval."""

    class OneBrokenRuntime(SharedAgentRuntime):
        broken: str = ""

        async def agent_news(
            self, session_id: str, watermark: int, continued: Any = ()
        ) -> AgentNews:
            if session_id == self.broken:
                raise ValueError("a row this pass cannot read")
            return await super().agent_news(session_id, watermark)

    async def main() -> tuple[list[str], list[str], set[str]]:
        runtime = OneBrokenRuntime()
        async with harness(tmp_path, runtime) as h:
            syncer = AgentSync(h.sessions, runtime)
            sids = sorted([(await h.sessions.create(None))["session_id"] for _ in range(2)])
            runtime.broken = sids[0]  # sorted first: read before the other
            runtime.cli_wrote, runtime.moved = True, list(sids)
            await syncer.sync_moved()
            return await h.types(sids[0]), await h.types(sids[1]), set(syncer.unread)

    broken, other, unread = asyncio.run(main())
    assert broken == ["session.created"]
    assert other == ["session.created", "agent.imported"]
    assert len(unread) == 1  # the broken one waits for the next interval


def test_before_a_turn_every_row_the_agent_holds_is_imported(tmp_path: Path) -> None:
    """Invariant 1: the model gets what the user is shown. Before a turn, passes follow one
    another while the agent says rows remain, so the turn comes after all of them."""

    async def main() -> list[str]:
        runtime = ChunkedRuntime()
        runtime.gate.set()
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            runtime.cli_wrote = True
            await h.engine.start(sid, "from tether")
            await h.wait_idle(sid)
            return await h.types(sid)

    types = asyncio.run(main())
    assert types[:3] == ["session.created", "agent.imported", "turn.submitted"]


def test_a_failing_session_is_tried_again_later_and_later_and_then_read(tmp_path: Path) -> None:
    """A session whose interval pass keeps failing is tried again after RETRY_FIRST_SECONDS,
    then after twice as long each time (one warning a try, not one every interval); once it
    can be read, its rows are imported and it is tried at every interval again."""

    class HealingRuntime(SharedAgentRuntime):
        healed = False

        async def agent_news(
            self, session_id: str, watermark: int, continued: Any = ()
        ) -> AgentNews:
            if not self.healed:
                self.reads.append(session_id)
                raise ValueError("a row this pass cannot read")
            return await super().agent_news(session_id, watermark)  # notes the read too

    now = [1000.0]

    async def main() -> tuple[list[int], list[str], dict[str, tuple[int, float]]]:
        runtime = HealingRuntime()
        async with harness(tmp_path, runtime) as h:
            syncer = AgentSync(h.sessions, runtime, clock=lambda: now[0])
            sid = (await h.sessions.create(None))["session_id"]
            runtime.cli_wrote, runtime.moved = True, [sid]
            tries = []
            for step in (0, 1, RETRY_FIRST_SECONDS, 1, 2 * RETRY_FIRST_SECONDS, 1):
                now[0] += step
                await syncer.sync_moved()
                tries.append(len(runtime.reads))
            runtime.healed = True
            now[0] += 4 * RETRY_FIRST_SECONDS
            await syncer.sync_moved()
            tries.append(len(runtime.reads))
            return tries, await h.types(sid), dict(syncer.failing)

    tries, types, failing = asyncio.run(main())
    # tried at once, not 1 s later, again after 5 s, not 1 s later, again after 10 s, not 1 s
    # later; healed, read after 20 s
    assert tries == [1, 1, 2, 2, 3, 3, 4]
    assert types == ["session.created", "agent.imported"]
    assert failing == {}
