"""One warm sidecar hosts the agents of many sessions (issue 18.1). Layers: runtime (the
sidecar pool: agents by session in one process, eviction, retirement, a dead sidecar
replaced), run journal (a killed sidecar ends its runs `interrupted`), run registry
(approvals and questions answered per run, never across sessions). Invariant kept: one
session's Stop, hang or crash never ends or changes another session's run; every run on a
sidecar that dies ends `interrupted`, and the next turns work. The real hermes-agent,
offline against the fake model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.runtimes.base import Finished, RuntimeEvent, TextDelta, TurnInput
from tether.runtimes.hermes import HermesRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI, barrier, hang, reply, text, tool_call
from helpers import (
    ServerProcess,
    live_timeline,
    new_session,
    read_events,
    running_server,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def make_runtime(fake: FakeOpenAI, tmp_path: Path, agents: int = 16) -> HermesRuntime:
    return HermesRuntime(
        Settings(
            runtime="hermes",
            base_url=fake.base_url,
            model=fake.model,
            api_key_env="TETHER_TEST_HERMES_KEY",
            data_dir=tmp_path / "data",
            hermes_agents=agents,
        )
    )


def turn(session_id: str, text_: str, n: int = 1, history: list | None = None) -> TurnInput:
    return TurnInput(
        session_id,
        f"r_{session_id}_{n}",
        f"u_{session_id}_{n}",
        [*(history or []), {"role": "user", "content": text_}],
    )


async def collect(events: AsyncIterator[RuntimeEvent]) -> list[RuntimeEvent]:
    async with contextlib.aclosing(events) as stream:
        return [event async for event in stream]


def joined(events: list[RuntimeEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


class Consumer:
    """A turn consumed in the background, as the engine does; `seen` fills as it streams."""

    def __init__(self, events: AsyncIterator[RuntimeEvent]):
        self.seen: list[RuntimeEvent] = []
        self.task = asyncio.create_task(self._run(events))

    async def _run(self, events: AsyncIterator[RuntimeEvent]) -> None:
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                self.seen.append(event)

    async def wait_text(self, expected: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while expected not in joined(self.seen):
            assert time.monotonic() < deadline, f"no {expected!r} in {joined(self.seen)!r}"
            assert not self.task.done() or self.task.exception() is None
            await asyncio.sleep(0.02)


def test_two_sessions_share_one_sidecar_and_a_stop_leaves_the_other_running(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        reply(text("A starts "), hang()),
        reply(text("B starts "), barrier("b"), text("and B ends")),
        reply(text("A again")),
    )

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            a = await runtime.open_handle("s_a")
            b = await runtime.open_handle("s_b")
            first_a = Consumer(a.stream(turn("s_a", "go")))
            await first_a.wait_text("A starts ")
            first_b = Consumer(b.stream(turn("s_b", "go")))
            await first_b.wait_text("B starts ")
            assert a.channel is not None and b.channel is not None
            assert a.channel.process is b.channel.process  # one process, two agents
            assert a.channel.key != b.channel.key
            assert await asyncio.to_thread(fake.wait_reached, "b", 30)
            a.interrupt()  # Stop on A, as the engine does it...
            first_a.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first_a.task
            assert await asyncio.to_thread(fake.wait_disconnects, 1, 30)  # A's request closed
            fake.release("b")
            await asyncio.wait_for(first_b.task, 60)
            assert joined(first_b.seen) == "B starts and B ends"  # B never noticed
            assert fake.disconnects == 1
            again = await collect(a.stream(turn("s_a", "again", n=2)))
            assert joined(again) == "A again"
        finally:
            await runtime.aclose()

    asyncio.run(main())


def state_rows(home: Path, session_id: str) -> list[tuple]:
    with sqlite3.connect(home / "state.db") as db:
        return db.execute(
            "SELECT role, content FROM messages WHERE session_id = ? ORDER BY id", (session_id,)
        ).fetchall()


def test_idle_agents_beyond_the_bound_are_evicted_and_built_again(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        reply(text("one")), reply(text("two")), reply(text("three")), reply(text("one again"))
    )

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path, agents=2)
        try:
            handles = {}
            for n, sid in enumerate(("s_1", "s_2", "s_3")):
                handles[sid] = await runtime.open_handle(sid)
                events = await collect(handles[sid].stream(turn(sid, "hi")))
                assert joined(events) == ("one", "two", "three")[n]
            assert len(runtime.pool.agents) == 2
            first = handles["s_1"]
            assert not first.alive  # the least recently used idle agent was closed
            assert handles["s_2"].alive and handles["s_3"].alive
            history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "one"}]
            again = await collect(first.stream(turn("s_1", "again", 2, history)))
            assert joined(again) == "one again" and first.alive
            assert not handles["s_2"].alive  # now s_2 was the least recently used
            # Built again from the log (the history the turn carries) and state.db (the
            # same agent session, continued).
            assert [m.get("content") for m in fake.requests[-1]["messages"]][-3:] == [
                "hi",
                "one",
                "again",
            ]
            assert state_rows(hermes_env, "s_1") == [
                ("user", "hi"),
                ("assistant", "one"),
                ("user", "again"),
                ("assistant", "one again"),
            ]
        finally:
            await runtime.aclose()

    asyncio.run(main())


def test_a_sidecar_given_up_ends_only_after_the_other_sessions_turns(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    """An agent whose interrupted turn never ends is given up (`give_up`, after
    PREVIOUS_TURN_GRACE in `settle_previous`): its sidecar takes no new agent, a new one
    serves, and the old one is killed only once the other session's turn on it ended."""
    fake.script(
        reply(text("A hangs "), hang()),
        reply(text("B starts "), barrier("b"), text("and B ends")),
        reply(text("C on the new sidecar")),
        reply(text("A again")),
    )

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            a = await runtime.open_handle("s_a")
            b = await runtime.open_handle("s_b")
            first_a = Consumer(a.stream(turn("s_a", "go")))
            await first_a.wait_text("A hangs ")
            first_b = Consumer(b.stream(turn("s_b", "go")))
            await first_b.wait_text("B starts ")
            assert a.channel is not None and b.channel is not None
            old = a.channel.process
            a.give_up()
            c = await runtime.open_handle("s_c")
            assert joined(await collect(c.stream(turn("s_c", "hi")))) == "C on the new sidecar"
            assert c.channel is not None and c.channel.process is not old
            assert old.alive  # B still runs there
            fake.release("b")
            await asyncio.wait_for(first_b.task, 60)
            assert joined(first_b.seen) == "B starts and B ends"
            deadline = time.monotonic() + 30
            while old.alive:
                assert time.monotonic() < deadline, "the given-up sidecar was not ended"
                await asyncio.sleep(0.05)
            await asyncio.wait_for(first_a.task, 30)
            assert isinstance(first_a.seen[-1], Finished)
            assert joined(await collect(a.stream(turn("s_a", "again", n=2)))) == "A again"
            assert not b.alive  # its idle agent went with the old sidecar
        finally:
            await runtime.aclose()

    asyncio.run(main())


def test_a_new_sessions_agent_is_built_before_its_first_turn(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    """`POST /api/sessions` calls `prepare`: the agent (and its first system prompt) is built
    while the user types, and the first turn takes that very agent."""
    fake.script(reply(text("ready already")))

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            runtime.prepare("s_new")
            runtime.prepare("s_new")  # once per session
            deadline = time.monotonic() + 120
            while not runtime.pool.agents:
                assert time.monotonic() < deadline, "the agent was not built"
                await asyncio.sleep(0.05)
            (key,) = runtime.pool.agents
            handle = await runtime.open_handle("s_new")
            assert joined(await collect(handle.stream(turn("s_new", "hi")))) == "ready already"
            assert handle.channel is not None and handle.channel.key == key
            assert len(runtime.pool.agents) == 1
        finally:
            await runtime.aclose()

    asyncio.run(main())


def test_a_handle_closed_before_its_first_turn_closes_its_prepared_agent(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    """The handle takes the agent `prepare` built only when its first turn starts; closed
    before that (the engine's handle cache evicting it, a shutdown), it closes that agent
    too, which would otherwise stay open in the sidecar with no session to use it."""

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            runtime.prepare("s_new")
            handle = await runtime.open_handle("s_new")
            prepared = handle.prepared
            assert prepared is not None and not prepared.done()
            await handle.close()
            await asyncio.wait_for(asyncio.wait([prepared]), 120)
            await asyncio.sleep(0.2)  # the close scheduled once it was built
            assert prepared.result().channel is None
            assert runtime.pool.agents == {}
        finally:
            await runtime.aclose()

    asyncio.run(main())


# -- through the server ------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for folder in ("first", "second"):
        (root / folder).mkdir(parents=True)
        (root / folder / "note.txt").write_text("keep me unless allowed")
    return root


@pytest.fixture
def server(
    tmp_path: Path,
    hermes_flags: list[str],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ServerProcess]:
    monkeypatch.setenv("TETHER_HERMES_TOOLSETS", "terminal,clarify")
    with running_server(
        tmp_path / "data",
        *hermes_flags,
        "--workspace",
        str(workspace),
        "--cancel-reclaim-seconds",
        "5",
    ) as running:
        yield running


def sidecars(server: ServerProcess) -> list[int]:
    """The server's sidecar processes (its children running sidecar.py)."""
    assert server.proc is not None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == server.proc.pid and b"sidecar.py" in command:
            found.append(int(entry.name))
    return found


def finished(client: httpx.Client, sid: str) -> list[dict[str, Any]]:
    frames = read_events(client, sid, after="0", stop_on="heartbeat")
    return [f.json["data"] for f in frames if f.event == "run.finished"]


def streamed(client: httpx.Client, sid: str) -> str:
    frames = read_events(client, sid, after="0", stop_on="heartbeat")
    return "".join(f.json["data"]["text"] for f in frames if f.event == "text.delta")


def test_a_killed_sidecar_ends_every_run_interrupted_and_the_next_turns_work(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(text("first partial "), barrier("one"), hang()),
        reply(text("second partial "), barrier("two"), hang()),
    )
    with server.client() as client:
        one, two = new_session(client), new_session(client)
        start_turn(client, one, "go")
        assert fake.wait_reached("one", 90)
        start_turn(client, two, "go")
        assert fake.wait_reached("two", 90)
        for sid, partial in ((one, "first partial"), (two, "second partial")):
            # the fake has written it: wait until the log holds it, so the kill comes after
            wait_until(lambda sid=sid, p=partial: p in streamed(client, sid), 60, partial)
        running = wait_until(lambda: sidecars(server), 30, "the sidecar")
        assert len(running) == 1  # both sessions' agents in one process
        os.kill(running[0], signal.SIGKILL)
        for sid, partial in ((one, "first partial "), (two, "second partial ")):
            row = wait_idle(client, sid, timeout=60)["messages"][-1]
            assert row["state"] == "interrupted", row
            assert row["content"].startswith(partial.strip())
            assert [f["state"] for f in finished(client, sid)] == ["interrupted"]
        fake.default_reply = reply(text("fine again"))
        for sid in (one, two):
            start_turn(client, sid, "next")
            row = wait_idle(client, sid, timeout=90)["messages"][-1]
            assert (row["state"], row["content"]) == ("completed", "fine again")
        assert len(sidecars(server)) == 1 and sidecars(server) != running


def open_item(client: httpx.Client, sid: str, kind: str) -> dict[str, Any]:
    return wait_until(
        lambda: next((i for i in live_timeline(client, sid) if i["type"] == kind), None),
        90,
        f"the {kind} item of {sid}",
    )


def test_approvals_and_questions_of_two_sessions_in_one_sidecar_stay_apart(
    server: ServerProcess, fake: FakeOpenAI, workspace: Path
) -> None:
    """Both agents ask at once (their prompt ids are alike: each agent counts its own); each
    answer reaches its own agent only, and "allow for this session" stays in its session."""
    fake.default_reply = reply(text("All done."))
    with server.client() as client:
        first, second = new_session(client), new_session(client)
        fake.script(
            reply(tool_call("call_1", "terminal", {"command": "rm -r first"})),
            reply(text("ESCALATE")),  # Hermes' smart approval asks its model first
        )
        run_first = start_turn(client, first, "clear first")
        approval = open_item(client, first, "approval")
        fake.script(reply(tool_call("call_2", "clarify", {"question": "Which one?"})))
        run_second = start_turn(client, second, "ask me")
        question = open_item(client, second, "clarify")
        answer = client.post(
            "/api/chat/answer",
            json={
                "stream_id": run_second["stream_id"],
                "question_id": question["question_id"],
                "text": "the second one",
            },
        )
        assert answer.json()["accepted"] is True
        row = wait_idle(client, second, timeout=90)["messages"][-1]
        assert row["state"] == "completed"
        assert open_item(client, first, "approval")["choice"] is None  # still asking
        assert (workspace / "first").exists()
        tool_results = [
            m["content"] for r in fake.requests for m in r["messages"] if m["role"] == "tool"
        ]
        assert json.loads(tool_results[-1])["user_response"] == "the second one"
        allowed = client.post(
            "/api/chat/approve",
            json={
                "stream_id": run_first["stream_id"],
                "approval_id": approval["approval_id"],
                "choice": "session",
            },
        )
        assert allowed.json()["accepted"] is True
        row = wait_idle(client, first, timeout=90)["messages"][-1]
        assert row["state"] == "completed" and not (workspace / "first").exists()
        # `session` allowed recursive deletes in the first session only: the second asks.
        fake.script(
            reply(tool_call("call_3", "terminal", {"command": "rm -r second"})),
            reply(text("ESCALATE")),
        )
        run = start_turn(client, second, "clear second")
        item = open_item(client, second, "approval")
        denied = client.post(
            "/api/chat/approve",
            json={
                "stream_id": run["stream_id"],
                "approval_id": item["approval_id"],
                "choice": "deny",
            },
        )
        assert denied.json()["accepted"] is True
        wait_idle(client, second, timeout=90)
        assert (workspace / "second").exists()
