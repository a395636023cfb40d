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
from pg import database
from statedb import write_state

from tether.events import SUMMARY_PREFIX
from tether.log import Draft
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


def hold(
    h: Harness, method: str, when: Callable[..., bool], meanwhile: Callable[[], Awaitable[Any]]
) -> asyncio.Event:
    """Replica `h`'s first call of its store's `method` whose arguments `when` picks waits
    for `meanwhile`: before it goes to the database (an append), or before its answer is
    returned (a read, which is then stale). The event returned is set once it waits."""
    real = getattr(h.store, method)
    holding = asyncio.Event()

    async def held(*args: Any) -> Any:
        if holding.is_set() or not when(*args):
            return await real(*args)
        holding.set()
        if method == "append":
            await meanwhile()
            return await real(*args)
        answer = await real(*args)
        await meanwhile()
        return answer

    setattr(h.store, method, held)
    return holding


def imports(session_id: str, drafts: list[Draft]) -> bool:
    return any(d.type == "agent.imported" for d in drafts)


async def until_logged(h: Harness, sid: str, event_type: str) -> None:
    for _ in range(2000):
        if event_type in await h.types(sid):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{event_type} never came")


@pytest.mark.parametrize("held_at", ["append", "check"])
def test_an_import_checked_before_another_replica_rotated_goes_into_the_continuation(
    tmp_path: Path, hermes_env: Path, hermes_python: Path, held_at: str
) -> None:
    """Two replicas on one PostgreSQL database. Replica A's turn rotates the session; while A
    summarizes (its run finished, so B sees the session idle), the CLI writes a turn and
    replica B's interval pass checks the session (not rotated) and reads the turn, and A's
    `session.rotated` commits before B's append goes (`append`), or already before B reads
    the log it imports after (`check`). The import was appended after `session.rotated`: the
    rotated parent's transcript changed, the turn was shown above the continuation and
    never given to its model. The database refuses it now (the seq its watermark was read
    at, and the session's `continued_in`), and B's next pass brings the turn into the
    continuation: shown once, in its context."""

    async def main(url: str) -> None:
        await cli_writes(
            hermes_python,
            hermes_env,
            [["create", "a1", "cli", {}], *cli_turn("cli one", "cli answer one")],
        )
        async with (
            replica(tmp_path / "a", url, full=True) as a,
            replica(tmp_path / "b", url, full=False) as b,
        ):
            await syncer(a).sync_moved()
            parent = await the_session(a)
            passes: list[asyncio.Task] = []

            async def rotated() -> None:
                await until_logged(b, parent, "session.rotated")

            if held_at == "append":
                held = hold(b, "append", imports, rotated)
            else:
                held = hold(b, "index_state", lambda sid: sid == parent and bool(passes), rotated)

            async def b_reads_a_cli_turn() -> None:
                await cli_writes(hermes_python, hermes_env, cli_turn("cli two", "cli answer two"))
                passes.append(asyncio.create_task(syncer(b).sync_moved()))
                await held.wait()

            assert isinstance(a.engine.runtime, Rotating)
            a.engine.runtime.meanwhile = b_reads_a_cli_turn
            await answered(a, parent, "one")
            await passes[0]
            child = (await b.sessions.row(parent))["continuation_session_id"]
            assert child is not None
            assert (await b.types(parent))[-1] == "session.rotated"  # nothing after it
            assert await shown(b, parent) == ["cli one", "cli answer one", "one", "answer"]
            await syncer(b).sync_moved()  # the next pass
            assert await shown(b, child) == ["cli two", "cli answer two"]
            assert await in_context(b, child) == [
                SUMMARY_PREFIX + "handoff",
                "cli two",
                "cli answer two",
            ]
            assert (await b.types(parent))[-1] == "session.rotated"

    with database() as url:
        asyncio.run(main(url))


def test_an_import_another_replica_made_first_is_refused_not_counted_twice(
    tmp_path: Path, hermes_env: Path, hermes_python: Path
) -> None:
    """Two replicas on one PostgreSQL database, both passing over the same session: B reads
    the CLI's turn from the session's watermark, A imports it, then B's append goes. The
    turn was imported twice: the transcript skips rows it holds already, but the sidebar
    counted its messages twice. B's import carries the seq its watermark was read at:
    refused, and its next pass finds nothing new."""

    async def main(url: str) -> None:
        await cli_writes(hermes_python, hermes_env, [["create", "a1", "cli", {}]])
        async with (
            replica(tmp_path / "a", url, full=False) as a,
            replica(tmp_path / "b", url, full=False) as b,
        ):
            await syncer(a).sync_moved()  # adopted, nothing to import yet
            sid = await the_session(a)
            await cli_writes(hermes_python, hermes_env, cli_turn("cli one", "cli answer one"))
            hold(b, "append", imports, syncer(a).sync_moved)
            await syncer(b).sync_moved()
            await syncer(b).sync_moved()
            assert await shown(b, sid) == ["cli one", "cli answer one"]
            assert await in_context(b, sid) == ["cli one", "cli answer one"]
            assert (await b.sessions.row(sid))["message_count"] == 2
            assert (await b.types(sid)).count("agent.imported") == 1

    with database() as url:
        asyncio.run(main(url))
