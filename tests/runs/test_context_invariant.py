"""Contract invariant 1 over the API: `GET /api/session/context` holds every visible user
turn (in order) unless it is listed in `excluded` with a reason — after a normal turn, a Stop,
a provider error, a restart and a compression."""

from __future__ import annotations

import pytest

from fake_openai import FakeOpenAI, barrier, error, hang, reply, text
from helpers import (
    ServerProcess,
    new_session,
    read_events,
    running_server,
    session_body,
    start_turn,
    wait_idle,
)


def assert_visible_turns_in_context(client, session_id: str) -> dict:  # noqa: ANN001
    body = session_body(client, session_id)
    context = client.get("/api/session/context", params={"session_id": session_id}).json()
    excluded = {e["turn_id"]: e["reason"] for e in context["excluded"]}
    assert all(reason for reason in excluded.values())
    sent = [m["content"] for m in context["context_messages"] if m["role"] == "user"]
    expected = [
        m["content"]
        for m in body["messages"]
        if m["role"] == "user" and m["turn_id"] not in excluded
    ]
    assert sent == expected
    current = [m for m in body["messages"] if m["role"] == "user"][-1]
    assert current["turn_id"] not in excluded  # the current turn is never left out
    return context


def test_after_a_normal_turn_and_a_stop(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "first")
        wait_idle(client, sid)
        assert_visible_turns_in_context(client, sid)
        run = start_turn(client, sid, "/slow second")
        read_events(client, sid, after="0", stop_on="tool.started")
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        wait_idle(client, sid)
        assert_visible_turns_in_context(client, sid)


@pytest.mark.slow
def test_after_a_restart_mid_run(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "/slow cut me off")
        read_events(client, sid, after="0", stop_on="reasoning.delta")
    demo_server.kill()
    demo_server.start()
    with demo_server.client() as client:
        assert_visible_turns_in_context(client, sid)


@pytest.mark.slow
def test_after_a_provider_error_and_a_compression(tmp_path, fake: FakeOpenAI) -> None:  # noqa: ANN001
    fake.context_length = 600
    with (
        running_server(
            tmp_path / "data",
            "--runtime",
            "openai",
            "--base-url",
            fake.base_url,
            "--model",
            "fake-model",
        ) as server,
        server.client() as client,
    ):
        sid = new_session(client)
        fake.script(error(500, "upstream exploded"))
        start_turn(client, sid, "one")
        assert wait_idle(client, sid)["messages"][-1]["state"] == "error"
        assert_visible_turns_in_context(client, sid)
        long_answer = "word " * 400  # ~500 tokens: the next request passes 80% of 600
        fake.script(reply(text(long_answer), usage={"prompt_tokens": 20, "completion_tokens": 500}))
        start_turn(client, sid, "two")
        wait_idle(client, sid)
        fake.script(
            reply(text("a short handoff summary")),  # the summary request
            reply(text("three answered")),
        )
        start_turn(client, sid, "three")
        body = wait_idle(client, sid)
        assert body["messages"][-1]["content"] == "three answered"
        context = assert_visible_turns_in_context(client, sid)
        assert context["compressions"] == 1
        assert context["context_messages"][0]["role"] == "system"
        assert "a short handoff summary" in context["context_messages"][0]["content"]
        assert [e for e in context["excluded"]]  # earlier turns: summarized, with a reason
        # the summary never shows in the visible transcript (invariant 6)
        assert "a short handoff summary" not in str(body["messages"])


@pytest.mark.slow
def test_a_hanging_stop_keeps_the_turn(tmp_path, fake: FakeOpenAI) -> None:  # noqa: ANN001
    with (
        running_server(
            tmp_path / "data",
            "--runtime",
            "openai",
            "--base-url",
            fake.base_url,
            "--model",
            "fake-model",
        ) as server,
        server.client() as client,
    ):
        sid = new_session(client)
        fake.script(reply(text("partial"), barrier("b"), hang()))
        run = start_turn(client, sid, "hang on")
        assert fake.wait_reached("b", 10)
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        wait_idle(client, sid)
        assert_visible_turns_in_context(client, sid)
