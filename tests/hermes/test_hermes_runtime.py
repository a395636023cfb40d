"""The Hermes runtime with the real hermes-agent in its sidecar, offline against the fake
OpenAI-compatible server: a plain turn, tool calls, Stop mid-stream, steer, compression."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hermes_venv import write_home

from tether.runtimes.base import (
    AgentSystemPrompt,
    CompressionCompleted,
    CompressionStarted,
    ProviderError,
    ReasoningDelta,
    RuntimeEvent,
    SteerInbox,
    TextDelta,
    ToolCompleted,
    ToolStarted,
    TurnInput,
    Usage,
)
from tether.runtimes.hermes import HermesRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI, barrier, hang, reasoning, reply, text, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def make_runtime(fake: FakeOpenAI, tmp_path: Path) -> HermesRuntime:
    return HermesRuntime(
        Settings(
            runtime="hermes",
            base_url=fake.base_url,
            model=fake.model,
            api_key_env="TETHER_TEST_HERMES_KEY",
            data_dir=tmp_path / "data",
        )
    )


def turn(
    session_id: str,
    text_: str,
    history: list[dict[str, Any]] | None = None,
    steer: SteerInbox | None = None,
    n: int = 1,
) -> TurnInput:
    return TurnInput(
        session_id,
        f"r_{session_id}_{n}",
        f"u_{session_id}_{n}",
        [*(history or []), {"role": "user", "content": text_}],
        steer=steer,
    )


async def collect(events: AsyncIterator[RuntimeEvent]) -> list[RuntimeEvent]:
    out = []
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            out.append(event)
    return out


def joined(events: list[RuntimeEvent], kind: type) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


def state_rows(home: Path, session_id: str) -> list[tuple]:
    with sqlite3.connect(home / "state.db") as db:
        return db.execute(
            "SELECT role, content, timestamp, active FROM messages "
            "WHERE session_id = ? ORDER BY id",
            (session_id,),
        ).fetchall()


def test_plain_turn_streams_reasoning_text_and_usage(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(reply(reasoning("Thinking it over. "), text("Hello "), text("from Hermes")))

    async def main() -> list[RuntimeEvent]:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_plain")
            history = [
                {"role": "user", "content": "earlier"},
                {"role": "assistant", "content": "earlier answer"},
            ]
            return await collect(handle.stream(turn("s_plain", "hi", history)))
        finally:
            await runtime.aclose()

    events = asyncio.run(main())
    assert joined(events, ReasoningDelta) == "Thinking it over. "
    assert joined(events, TextDelta) == "Hello from Hermes"
    assert any(isinstance(e, Usage) and e.prompt_tokens > 0 for e in events)
    request = fake.requests[0]
    assert request["stream"] is True and request["max_tokens"] == 256
    contents = [m.get("content") for m in request["messages"]]
    assert contents[-3:] == ["earlier", "earlier answer", "hi"]
    # The agent stored only the new turn (history dicts are not re-written), and its user row
    # carries the turn's persist_user_timestamp, which the private proof records.
    rows = state_rows(hermes_env, "s_plain")
    assert [r[:2] for r in rows] == [("user", "hi"), ("assistant", "Hello from Hermes")]
    proofs = (
        sqlite3.connect(hermes_env / "tether-proofs.sqlite")
        .execute("SELECT stream_id, agent_session_id, persist_user_timestamp FROM proofs")
        .fetchall()
    )
    assert proofs == [("r_s_plain_1", "s_plain", rows[0][2])]


def test_tool_calls_map_to_tool_events_and_the_loop_continues(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        reply(
            text("Let me run it."),
            tool_call("call_1", "terminal", {"command": "echo tether-tool-ok"}),
        ),
        reply(text("It printed tether-tool-ok.")),
    )

    async def main() -> list[RuntimeEvent]:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_tools")
            return await collect(handle.stream(turn("s_tools", "run echo")))
        finally:
            await runtime.aclose()

    events = asyncio.run(main())
    kinds = [type(e).__name__ for e in events if not isinstance(e, Usage)]
    started = next(e for e in events if isinstance(e, ToolStarted))
    completed = next(e for e in events if isinstance(e, ToolCompleted))
    assert (started.call_id, started.name) == ("call_1", "terminal")
    assert started.args == {"command": "echo tether-tool-ok"}
    assert completed.call_id == "call_1" and "tether-tool-ok" in completed.result
    assert not completed.is_error
    assert kinds.index("ToolStarted") < kinds.index("ToolCompleted")
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert texts[0] == "Let me run it." and "".join(texts).endswith("It printed tether-tool-ok.")
    assert not any(t.startswith("\n") for t in texts)  # the agent's break after tools dropped
    assert fake.requests[1]["messages"][-1]["role"] == "tool"


def test_stop_mid_stream_interrupts_the_agent_and_the_handle_stays_usable(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(reply(text("partial "), hang()), reply(text("second turn")))

    async def main() -> tuple[list[RuntimeEvent], list[RuntimeEvent]]:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_stop")
            seen: list[RuntimeEvent] = []
            got_text = asyncio.Event()

            async def consume() -> None:
                async with contextlib.aclosing(handle.stream(turn("s_stop", "go"))) as events:
                    async for event in events:
                        seen.append(event)
                        if isinstance(event, TextDelta):
                            got_text.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(got_text.wait(), 60)
            handle.interrupt()  # what the engine does on Stop...
            task.cancel()  # ...then it cancels the consuming task
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(fake.wait_disconnects, 1, 30)
            second = await collect(handle.stream(turn("s_stop", "again", n=2)))
            return seen, second
        finally:
            await runtime.aclose()

    first, second = asyncio.run(main())
    assert joined(first, TextDelta) == "partial "
    assert joined(second, TextDelta) == "second turn"


def test_cancelling_the_consumer_alone_stops_the_agent(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(reply(text("working "), hang()))

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_cancel")
            stream = handle.stream(turn("s_cancel", "go"))
            first = await anext(stream)
            if isinstance(first, AgentSystemPrompt):  # reported before the request is sent
                first = await anext(stream)
            assert isinstance(first, TextDelta | ReasoningDelta | Usage)
            await stream.aclose()  # no interrupt() call: the stream's cleanup sends it
            assert await asyncio.to_thread(fake.wait_disconnects, 1, 30)
        finally:
            await runtime.aclose()

    asyncio.run(main())


def test_steer_reaches_the_agent_after_a_tool_and_is_marked_delivered_there(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        reply(text("Checking."), tool_call("call_1", "terminal", {"command": "echo one"})),
        reply(text("Done, in French as asked.")),
    )
    inbox = SteerInbox()
    delivered: list[list[str]] = []
    inbox.on_drain = delivered.append
    inbox.put("st_1", "answer in French")

    async def main() -> list[RuntimeEvent]:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_steer")
            return await collect(handle.stream(turn("s_steer", "go", steer=inbox)))
        finally:
            await runtime.aclose()

    events = asyncio.run(main())
    assert delivered == [["st_1"]]
    assert inbox.close() == []  # nothing left over
    tool_message = fake.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "answer in French" in tool_message["content"]
    assert "Done, in French" in joined(events, TextDelta)


def test_steer_the_agent_never_took_comes_back_as_leftover(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(reply(text("Short answer"), barrier("final")))
    inbox = SteerInbox()
    delivered: list[list[str]] = []
    inbox.on_drain = delivered.append

    async def main() -> list[RuntimeEvent]:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_left")
            stream = handle.stream(turn("s_left", "go", steer=inbox))
            out = [await anext(stream)]
            inbox.put("st_late", "too late")
            await asyncio.sleep(0.5)  # the handle forwards it to agent.steer()
            fake.release("final")
            out += await collect(stream)
            return out
        finally:
            await runtime.aclose()

    events = asyncio.run(main())
    assert joined(events, TextDelta) == "Short answer"
    assert delivered == []
    assert inbox.close() == [("st_late", "too late")]


def test_provider_failure_becomes_a_provider_error(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    from fake_openai import error

    fake.script(*[error(401, "bad key", code="invalid_api_key")] * 4)

    async def main() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_err")
            await collect(handle.stream(turn("s_err", "hi")))
        finally:
            await runtime.aclose()

    with pytest.raises(ProviderError) as caught:
        asyncio.run(main())
    assert caught.value.code == "auth"


def test_the_package_never_imports_hermes_in_tethers_process() -> None:
    assert "run_agent" not in sys.modules and "hermes_state" not in sys.modules


def _long_history(n: int = 12) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n // 2):
        out += [
            {"role": "user", "content": f"question {i}: " + "words " * 200},
            {"role": "assistant", "content": f"answer {i}: " + "more words " * 200},
        ]
    return out


def _compression_turn(fake: FakeOpenAI, tmp_path: Path, session_id: str) -> list[RuntimeEvent]:
    """A turn whose first reply reports a prompt past the threshold, so Hermes compresses
    before its next request: the summary request is the fake's next (non-streaming) reply."""
    fake.script(
        reply(
            text("Looking."),
            tool_call("call_1", "terminal", {"command": "echo x"}),
            usage={"prompt_tokens": 100_000, "completion_tokens": 10},
        ),
        reply(text("SUMMARY: the user asked six questions about words.")),
        reply(text("Answer after compression.")),
    )

    async def main() -> list[RuntimeEvent]:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle(session_id)
            events = await collect(handle.stream(turn(session_id, "next", _long_history())))
            events.append(handle.agent_session_id)  # type: ignore[arg-type]
            return events
        finally:
            await runtime.aclose()

    return asyncio.run(main())


def test_in_place_compression_maps_to_compression_events(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    write_home(hermes_env, fake, in_place=True, compression=True)
    events = _compression_turn(fake, tmp_path, "s_cmp")
    agent_session = events.pop()
    started = [e for e in events if isinstance(e, CompressionStarted)]
    completed = [e for e in events if isinstance(e, CompressionCompleted)]
    assert len(started) == 1 and len(completed) == 1
    assert completed[0].pass_id == started[0].pass_id
    assert completed[0].boundary_turn_id == "u_s_cmp_1"
    assert "six questions" in completed[0].summary
    assert completed[0].tokens_after < completed[0].tokens_before
    assert joined(events, TextDelta).endswith("Answer after compression.")
    assert agent_session == "s_cmp"  # in place: the agent session id did not move


def test_rotating_compression_continues_in_a_child_agent_session(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    write_home(hermes_env, fake, in_place=False, compression=True)
    events = _compression_turn(fake, tmp_path, "s_rot")
    agent_session = events.pop()
    assert [
        type(e) for e in events if isinstance(e, CompressionStarted | CompressionCompleted)
    ] == [CompressionStarted, CompressionCompleted]
    assert agent_session != "s_rot"
    with sqlite3.connect(hermes_env / "state.db") as db:
        parent = db.execute("SELECT end_reason FROM sessions WHERE id = 's_rot'").fetchone()
        child = db.execute(
            "SELECT parent_session_id FROM sessions WHERE id = ?", (agent_session,)
        ).fetchone()
    assert parent == ("compression",) and child == ("s_rot",)
    from tether.runtimes.hermes.lineage import continuation_of

    assert continuation_of(hermes_env / "state.db", "s_rot") == agent_session
