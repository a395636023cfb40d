"""What the branch tests share: a branch switch, a turn answered by the fake model, a session
with two branches, and the shapes its transcripts are compared in."""

from __future__ import annotations

from typing import Any

import httpx

from fake_openai import FakeOpenAI, reply, text
from helpers import new_session, start_turn, wait_idle


def switch(client: httpx.Client, sid: str, row_id: str, index: int) -> httpx.Response:
    return client.post(
        "/api/session/branch", json={"session_id": sid, "row_id": row_id, "index": index}
    )


def answered(client: httpx.Client, fake: FakeOpenAI, sid: str, message: str, answer: str) -> dict:
    fake.script(reply(text(answer)))
    start_turn(client, sid, message)
    return wait_idle(client, sid)


def said(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "assistant")]


def contents(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"]]


def log_types(client: httpx.Client, sid: str) -> list[str]:
    response = client.get(f"/api/sessions/{sid}/export")
    assert response.status_code == 200, response.text
    return [e["type"] for e in response.json()["events"]]


def two_branches(client: httpx.Client, fake: FakeOpenAI) -> tuple[str, dict[str, Any]]:
    """A session whose second message was edited (branch 2: "two, edited" / "B2"), shown on
    branch 1 again: (its id, the body the stale tab folded)."""
    sid = new_session(client)
    answered(client, fake, sid, "one", "A1")
    two = answered(client, fake, sid, "two", "A2")["messages"][2]
    fake.script(reply(text("B2")))
    start_turn(client, sid, "two, edited", edit_of=two["id"])
    edited = wait_idle(client, sid)["messages"][2]
    shown = switch(client, sid, edited["id"], 1)
    assert shown.status_code == 200, shown.text
    return sid, shown.json()["session"]
