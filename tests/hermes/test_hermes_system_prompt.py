"""A session's system prompt under `tether serve --runtime hermes`: the model gets it inside
the system message (Hermes' own prompt, then Tether's, through
`AIAgent.ephemeral_system_prompt`), never as a user-role message, and Hermes does not store
it in `state.db`; clearing it takes effect at the next turn. Layer: the model context
(invariant 1): `GET /api/session/context` opens with that whole system message, Hermes' own
part included (`agent.system_prompt`, recorded when it changes)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_venv import write_home

from tether.projections.context import agent_system_message
from tether.runtimes.base import (
    AgentSystemPrompt,
    CompressionCompleted,
    RuntimeEvent,
    TextDelta,
    TurnInput,
)
from tether.runtimes.hermes import HermesRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import (
    ServerProcess,
    new_session,
    read_events,
    running_server,
    start_turn,
    wait_idle,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "You are the tether-sp-7 assistant: always answer in haiku."


@pytest.fixture
def hermes_server(
    tmp_path: Path,
    hermes_flags: list[str],
) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *hermes_flags,
    ) as server:
        yield server


def turn_request(fake: FakeOpenAI, message: str) -> dict[str, Any]:
    """The (last) model request of the turn whose user text is `message` (Hermes merges
    consecutive user-role messages into one)."""
    return next(
        r
        for r in reversed(fake.requests)
        if r.get("stream") and str(r["messages"][-1].get("content")).endswith(message)
    )


def user_texts(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in request["messages"] if m.get("role") == "user"]


def shown_system(client: Any, sid: str) -> dict[str, Any]:
    """The first message of the session's context view."""
    response = client.get("/api/session/context", params={"session_id": sid})
    assert response.status_code == 200, response.text
    return response.json()["context_messages"][0]


def test_the_system_prompt_goes_into_the_system_message_and_clearing_it_removes_it(
    hermes_server: ServerProcess, fake: FakeOpenAI, hermes_env: Path
) -> None:
    fake.script(reply(text("First answer.")), reply(text("Second answer.")))
    with hermes_server.client() as client:
        sid = new_session(client)
        patched = client.patch("/api/session", json={"session_id": sid, "system_prompt": PROMPT})
        assert patched.status_code == 200, patched.text
        start_turn(client, sid, "hello")
        wait_idle(client, sid, timeout=90)
        first = turn_request(fake, "hello")
        system = first["messages"][0]
        assert system["role"] == "system" and system["content"].endswith(PROMPT)
        assert len(system["content"]) > len(PROMPT)  # Hermes' own prompt comes first
        assert not any(PROMPT in t for t in user_texts(first))
        assert shown_system(client, sid) == system  # the whole message, as the model got it
        own = system["content"][: -len("\n\n" + PROMPT)]

        cleared = client.patch("/api/session", json={"session_id": sid, "system_prompt": None})
        assert cleared.status_code == 200, cleared.text
        # Shown at once as the next request will send it: Hermes' part alone.
        assert shown_system(client, sid) == {"role": "system", "content": own}
        start_turn(client, sid, "again")
        body = wait_idle(client, sid, timeout=60)
        assert body["messages"][-1]["content"] == "Second answer."
        second = turn_request(fake, "again")
        assert second["messages"][0] == {"role": "system", "content": own}
        assert PROMPT not in str(second["messages"])
        assert "hello" in user_texts(second)  # the history still reaches the agent
        assert shown_system(client, sid) == second["messages"][0]
        frames = read_events(client, sid, after="0", stop_on="heartbeat")
        recorded = [f.json for f in frames if f.event == "agent.system_prompt"]
        assert [r["data"]["text"] for r in recorded] == [own]  # once: it did not change
    with sqlite3.connect(hermes_env / "state.db") as db:
        stored = db.execute("SELECT system_prompt FROM sessions").fetchall()
        contents = db.execute("SELECT content FROM messages").fetchall()
    assert stored and not any(PROMPT in (row[0] or "") for row in stored)
    assert not any(PROMPT in (row[0] or "") for row in contents)


def _long_history(n: int = 12) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n // 2):
        out += [
            {"role": "user", "content": f"question {i}: " + "words " * 200},
            {"role": "assistant", "content": f"answer {i}: " + "more words " * 200},
        ]
    return out


def drive(data_dir: Path, fake: FakeOpenAI, *turns: TurnInput) -> list[list[RuntimeEvent]]:
    """The events of each turn, run one after the other on one HermesRuntime handle."""

    async def main() -> list[list[RuntimeEvent]]:
        runtime = HermesRuntime(
            Settings(
                runtime="hermes",
                base_url=fake.base_url,
                model=fake.model,
                api_key_env="TETHER_TEST_HERMES_KEY",
                data_dir=data_dir,
            )
        )
        try:
            handle = await runtime.open_handle(turns[0].session_id)
            out: list[list[RuntimeEvent]] = []
            for turn in turns:
                async with contextlib.aclosing(handle.stream(turn)) as events:
                    out.append([event async for event in events])
            return out
        finally:
            await runtime.aclose()

    return asyncio.run(main())


def reported_parts(events: list[RuntimeEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, AgentSystemPrompt)]


def test_hermes_compression_keeps_the_system_prompt_out_of_the_summary(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    """Hermes' own compression (a summary request of its own mid-turn) still works with a
    system prompt: the prompt is not among what it summarizes, and the request after the
    compression still carries it in the system message. The agent's part last reported
    composes, with the session's prompt, to exactly what that request sent (invariant 1:
    the view after a compression is what the model got)."""
    write_home(hermes_env, fake, in_place=True, compression=True)
    fake.script(
        reply(
            text("Looking."),
            tool_call("call_1", "terminal", {"command": "echo x"}),
            usage={"prompt_tokens": 100_000, "completion_tokens": 10},
        ),
        reply(text("SUMMARY: the user asked six questions about words.")),
        reply(text("Answer after compression.")),
    )
    messages = [{"role": "system", "content": PROMPT}, *_long_history()]
    messages.append({"role": "user", "content": "next"})
    turn = TurnInput("s_sp_cmp", "r_sp", "u_sp", messages, system_prompt=PROMPT)
    [events] = drive(tmp_path / "data", fake, turn)
    completed = [e for e in events if isinstance(e, CompressionCompleted)]
    assert len(completed) == 1 and "six questions" in completed[0].summary
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).endswith(
        "Answer after compression."
    )
    summary_request = next(r for r in fake.requests if not r.get("stream"))
    assert PROMPT not in str(summary_request["messages"])
    after = fake.requests[-1]
    assert after["messages"][0]["role"] == "system"
    assert after["messages"][0]["content"].endswith(PROMPT)
    assert not any(PROMPT in t for t in user_texts(after))
    parts = reported_parts(events)
    assert parts and agent_system_message(parts[-1], PROMPT) == after["messages"][0]["content"]


def test_a_part_the_log_does_not_hold_is_reported_again_at_the_next_turn(
    hermes_env: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    """A turn stopped right after the agent reported its part, or a run of another runtime
    since, leaves the log without it (`TurnInput.agent_system_prompt` None): the next
    turn reports it again, while a turn whose log holds it reports nothing."""
    fake.script(reply(text("One.")), reply(text("Two.")), reply(text("Three.")))

    def turn(n: int, held: str | None) -> TurnInput:
        messages = [{"role": "user", "content": f"question {n}"}]
        return TurnInput("s_sp_again", f"r{n}", f"u{n}", messages, agent_system_prompt=held)

    first, second = drive(tmp_path / "data", fake, turn(1, None), turn(2, None))
    [own] = reported_parts(first)
    assert own and reported_parts(second) == [own]
    [third] = drive(tmp_path / "data2", fake, turn(3, own))
    assert reported_parts(third) == []
