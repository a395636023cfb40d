"""Hermes' clarify tool asks the user through Tether (API: `clarify.requested`,
`POST /api/chat/answer`, `clarify.resolved`). Layers: runtime (the sidecar's clarify
callback blocks the agent until Tether answers), run registry (only a running run's open
question takes an answer, once), run journal (question and answer are durable events, and
a question open when the run ends is resolved `stopped`), visible transcript (the clarify
item), model context (the tool result carries the answer, or Hermes' own "nobody
answered" sentinel). End to end: `tether serve --runtime hermes` with the real
hermes-agent's clarify tool."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text, tool_call
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

QUESTION = {"question": "Which colour should the button be?", "choices": ["red", "blue"]}


@pytest.fixture
def clarify_seconds() -> str | None:
    return None


@pytest.fixture
def server(
    tmp_path: Path,
    hermes_flags: list[str],
    monkeypatch: pytest.MonkeyPatch,
    clarify_seconds: str | None,
) -> Iterator[ServerProcess]:
    monkeypatch.setenv("TETHER_HERMES_TOOLSETS", "terminal,clarify")
    if clarify_seconds is not None:
        monkeypatch.setenv("TETHER_HERMES_CLARIFY_SECONDS", clarify_seconds)
    with running_server(
        tmp_path / "data",
        *hermes_flags,
    ) as running:
        yield running


def asked(client: httpx.Client, sid: str) -> dict[str, Any]:
    return wait_until(
        lambda: next((i for i in live_timeline(client, sid) if i["type"] == "clarify"), None),
        90,
        "the agent's question",
    )


def answer(client: httpx.Client, stream_id: str, question_id: str, text_: str) -> httpx.Response:
    return client.post(
        "/api/chat/answer",
        json={"stream_id": stream_id, "question_id": question_id, "text": text_},
    )


def tool_result(fake: FakeOpenAI) -> str:
    """What the clarify tool told the model (the request after the question)."""
    for request in reversed(fake.requests):
        for message in request["messages"]:
            if message["role"] == "tool":
                return str(message["content"])
    raise AssertionError("no tool result reached the model")


def script(fake: FakeOpenAI, *after: Any) -> None:
    fake.script(
        reply(text("Let me ask."), tool_call("call_1", "clarify", QUESTION)),
        reply(text("Done as you said.")),
        *after,
    )


@pytest.mark.parametrize("given", ["blue", "green, with a border"])
def test_the_answer_reaches_the_agent_once_and_is_recorded(
    server: ServerProcess, fake: FakeOpenAI, given: str
) -> None:
    """A choice or free text: the tool result the model gets carries it."""
    script(fake)
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "make me a button")
        item = asked(client, sid)
        assert (item["question"], item["choices"]) == (QUESTION["question"], ["red", "blue"])
        assert item["text"] is None and item["reason"] is None
        blank = answer(client, run["stream_id"], item["question_id"], "  ")
        assert blank.status_code == 400 and blank.json()["code"] == "invalid_request"
        assert answer(client, run["stream_id"], "q9", given).json()["accepted"] is False
        assert asked(client, sid)["text"] is None  # still waiting for a real answer
        taken = answer(client, run["stream_id"], item["question_id"], given)
        assert taken.status_code == 200 and taken.json()["accepted"] is True
        again = answer(client, run["stream_id"], item["question_id"], "red")
        assert again.json()["accepted"] is False  # answered once
        row = wait_idle(client, sid, timeout=90)["messages"][-1]
        assert row["state"] == "completed" and row["content"].endswith("Done as you said.")
        card = next(i for i in row["timeline"] if i["type"] == "clarify")
        assert (card["text"], card["reason"]) == (given, "user")
        result = json.loads(tool_result(fake))
        assert result["user_response"] == given
        assert result["choices_offered"] == ["red", "blue"]
        events = [f.event for f in read_events(client, sid, after="0", stop_on="heartbeat")]
        assert events.count("clarify.requested") == events.count("clarify.resolved") == 1


@pytest.mark.parametrize("clarify_seconds", ["2"])
def test_nobody_answering_in_time_lets_the_agent_decide(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """The timeout answers the way Hermes' gateway does: its "did not respond" sentinel."""
    script(fake)
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "make me a button")
        asked(client, sid)
        row = wait_idle(client, sid, timeout=90)["messages"][-1]
        assert row["state"] == "completed"
        card = next(i for i in row["timeline"] if i["type"] == "clarify")
        assert (card["text"], card["reason"]) == ("", "timeout")
        result = json.loads(tool_result(fake))
        assert result["user_response"] == "[user did not respond within 0m]"


def test_stop_while_the_agent_asks_resolves_it_and_frees_the_agent(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    script(fake, reply(text("Next answer.")))
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "make me a button")
        item = asked(client, sid)
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        row = wait_idle(client, sid, timeout=90)["messages"][-1]
        assert row["state"] == "cancelled"
        card = next(i for i in row["timeline"] if i["type"] == "clarify")
        assert card["reason"] == "stopped"
        assert answer(client, run["stream_id"], item["question_id"], "blue").json() == {
            "accepted": False,
            "stream_id": run["stream_id"],
            "question_id": item["question_id"],
        }
        events = [f.event for f in read_events(client, sid, after="0", stop_on="heartbeat")]
        assert events.count("clarify.resolved") == 1  # durable: every tab and reload sees it
        start_turn(client, sid, "something else")  # the agent is not stuck on the question
        assert wait_idle(client, sid, timeout=90)["messages"][-1]["state"] == "completed"
