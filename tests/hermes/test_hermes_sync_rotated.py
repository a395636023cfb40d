"""Agent sync (runs/agent_sync.py) around a rotation, over the real parts: hermes-agent's own
`SessionDB` writes `state.db` as its CLI does, the Hermes runtime's ledger and view read it,
the engine rotates (`--compression-mode rotate`) and the log is SQLite or a real PostgreSQL
shared by two replicas. Layers: the log (`agent.imported`, `session.rotated`) and, through
it, the visible transcript and model context. Contract: a rotated parent's transcript never
changes after `session.rotated` (its continuation shows it and was summarized from it), what
is shown enters the model context (invariant 1), and nothing the agent wrote is lost: what
another client wrote into a rotated session's agent session comes into its continuation."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from statedb import write_state

from tether.events import SUMMARY_PREFIX
from tether.runs.agent_sync import AgentSync
from tether.runtimes.base import AgentHistory, Capabilities, RuntimeEvent, TurnInput, Usage
from tether.runtimes.hermes.runtime import HermesRuntime
from tether.settings import Settings

sys.path.insert(0, str(Path(__file__).parents[1] / "runs"))
from engine_harness import GatedRuntime, Harness, harness  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class Rotating(GatedRuntime):
    """The model of a turn: answers "answer"; with `full`, reports a context past 80% of the
    1,000-token window, so the turn rotates the session. The agent's history is the real
    Hermes runtime's view of `state.db` (its sidecar is never started: the CLI writes)."""

    capabilities = Capabilities(agent_sync=True)

    def __init__(self, hermes: HermesRuntime, full: bool) -> None:
        super().__init__()
        self.gate.set()
        self.hermes = hermes
        self.full = full
        self.meanwhile: Callable[[], Awaitable[Any]] | None = None

    def agent_history(self) -> AgentHistory:
        return self.hermes

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        async for event in super().stream(turn):
            yield event
        if self.full:
            yield Usage(prompt_tokens=850, completion_tokens=20)

    async def summarize(self, messages: list[dict[str, Any]], model: str | None) -> str:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:  # after the run finished, before the rotation is written
            await meanwhile()
        return "handoff"


def replica(data: Path, url: str | None, full: bool) -> AbstractAsyncContextManager[Harness]:
    settings = Settings(
        data_dir=data, database_url=url, context_window=1000, compression_mode="rotate"
    )
    return harness(data, Rotating(HermesRuntime(settings), full), settings)


def syncer(h: Harness) -> AgentSync:
    assert isinstance(h.engine.agent_sync, AgentSync)
    return h.engine.agent_sync


async def cli_writes(hermes_python: Path, home: Path, ops: list[list[Any]]) -> None:
    await asyncio.to_thread(write_state, hermes_python, home, ops)


def cli_turn(user: str, answer: str) -> list[list[Any]]:
    return [
        ["append", "a1", "user", user, {}],
        ["append", "a1", "assistant", answer, {}],
    ]


async def answered(h: Harness, sid: str, text: str) -> None:
    await h.engine.start(sid, text)
    await h.wait_idle(sid)


async def shown(h: Harness, sid: str) -> list[str]:
    return [str(m["content"]) for m in (await h.sessions.view(sid))["messages"]]


async def in_context(h: Harness, sid: str) -> list[str]:
    context = await h.sessions.context(sid, "gated")
    return [str(m["content"]) for m in context["context_messages"]]


async def the_session(h: Harness) -> str:
    [sid] = list(await h.store.index_states())
    return sid


def test_what_the_cli_writes_into_a_rotated_sessions_agent_comes_into_its_continuation(
    tmp_path: Path, hermes_env: Path, hermes_python: Path
) -> None:
    """One replica (SQLite). A session started in the CLI shows up in Tether; a turn there
    rotates it. The person goes on in the CLI (`hermes chat --resume`) in the same agent
    session: the Tether session it was is rotated, its log final, so its passes read
    nothing more and the turn was never shown anywhere, nor given to the model. It comes
    into the continuation, shown and in its context, and the parent's log stays final."""

    async def main() -> None:
        await cli_writes(
            hermes_python,
            hermes_env,
            [["create", "a1", "cli", {}], *cli_turn("cli one", "cli answer one")],
        )
        async with replica(tmp_path / "a", None, full=True) as a:
            await syncer(a).sync_moved()  # adopts the CLI's session, with its turn
            parent = await the_session(a)
            await answered(a, parent, "one")
            child = (await a.sessions.row(parent))["continuation_session_id"]
            assert child is not None
            final = await a.types(parent)
            assert final[-1] == "session.rotated"
            await cli_writes(hermes_python, hermes_env, cli_turn("cli two", "cli answer two"))
            await syncer(a).sync_moved()
            assert await a.types(parent) == final
            assert await shown(a, parent) == ["cli one", "cli answer one", "one", "answer"]
            assert await shown(a, child) == ["cli two", "cli answer two"]
            assert await in_context(a, child) == [
                SUMMARY_PREFIX + "handoff",
                "cli two",
                "cli answer two",
            ]
            await answered(a, child, "three")  # the continuation's own turns follow them
            assert (await shown(a, child))[-2:] == ["three", "answer"]

    asyncio.run(main())
