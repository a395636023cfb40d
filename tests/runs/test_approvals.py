"""Approval prompts over real HTTP (`POST /api/chat/approve`, `approval.requested` /
`approval.resolved`). Layers: run registry (only a running run's open prompt takes an
answer, once), run journal (question and answer are durable events), visible transcript (an
`approval` timeline item with its outcome), model context (the tool result says what
happened). The demo runtime's `/approve` asks like Hermes Agent does for a flagged command."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from helpers import (
    ServerProcess,
    live_timeline,
    new_session,
    read_events,
    start_turn,
    wait_idle,
    wait_until,
)


def _pending(client: httpx.Client, sid: str) -> dict[str, Any]:
    """The live scene's approval item, once the agent has asked."""
    return wait_until(
        lambda: next((i for i in live_timeline(client, sid) if i["type"] == "approval"), None),
        what="the question",
    )


def _approve(
    client: httpx.Client, stream_id: str, choice: str, approval_id: str = "ap1"
) -> httpx.Response:
    return client.post(
        "/api/chat/approve",
        json={"stream_id": stream_id, "approval_id": approval_id, "choice": choice},
    )


@pytest.mark.parametrize(("choice", "allowed"), [("once", True), ("deny", False)])
def test_the_answer_reaches_the_agent_once_and_is_recorded(
    demo_server: ServerProcess, choice: str, allowed: bool
) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/approve")
        item = _pending(client, sid)
        assert item["command"] == "rm -rf ./demo-scratch" and item["choice"] is None
        assert "recursive delete" in item["description"]
        answer = _approve(client, run["stream_id"], choice)
        assert answer.status_code == 200 and answer.json()["accepted"] is True
        assert _approve(client, run["stream_id"], "once").json()["accepted"] is False  # once
        body = wait_idle(client, sid)
        row = body["messages"][-1]
        assert row["state"] == "completed"
        approval = next(i for i in row["timeline"] if i["type"] == "approval")
        assert (approval["choice"], approval["reason"]) == (choice, "user")
        tool = next(i for i in row["timeline"] if i["type"] == "tool")
        assert tool["is_error"] is (not allowed)
        events = [f.event for f in read_events(client, sid, after="0", stop_on="heartbeat")]
        assert events.count("approval.requested") == events.count("approval.resolved") == 1
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        tool_results = [m["content"] for m in context["context_messages"] if m["role"] == "tool"]
        assert ("would have been cleared" in tool_results[0]) is allowed


def test_answers_that_cannot_apply_change_nothing(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/approve")
        _pending(client, sid)
        bad = _approve(client, run["stream_id"], "always")
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
        assert _approve(client, run["stream_id"], "once", "ap9").json()["accepted"] is False
        assert _approve(client, "r_unknown", "once").json()["accepted"] is False
        assert _pending(client, sid)["choice"] is None  # still waiting for a real answer
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        body = wait_idle(client, sid)
        assert body["messages"][-1]["state"] == "cancelled"
        approval = next(i for i in body["messages"][-1]["timeline"] if i["type"] == "approval")
        assert approval["choice"] is None  # never answered: the page says so
        assert _approve(client, run["stream_id"], "once").json()["accepted"] is False
