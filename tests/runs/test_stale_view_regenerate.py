"""Regenerate (and Retry, which is a regenerate) asked from a view of the transcript that
another tab changed meanwhile (docs/api.md §10, `after_seq`): the real server over HTTP,
real SQLite, the fake OpenAI-compatible server at the model boundary.

Layers: run admission (`runs/engine.py` `regenerate`, checked under the session's lock before
any write) and the transcript projection it reads (`TranscriptFold.hidden_at`, `grown_at`).
Contract invariant 1: what the user sees is what the model gets. Without a row, "the last
answer" is that of whatever branch is shown now: a tab still showing branch 1 regenerated
branch 2's answer, one the user never read, on a branch they were not looking at. With the
position its view was folded to, a regenerate is refused like a start (409
`transcript_changed`, nothing written) when rows of that view were hidden since, and without
a row also when a row was added since (the last answer may not be one the view had)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from runs.branch_kit import answered, contents, log_types, said, switch, two_branches

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, session_body, wait_idle

pytestmark = pytest.mark.slow


def regenerate(client: httpx.Client, sid: str, **extra: Any) -> httpx.Response:
    return client.post("/api/chat/regenerate", json={"session_id": sid, **extra})


def refused_as(response: httpx.Response, code: str) -> None:
    assert response.status_code == (404 if code.endswith("not_found") else 409), response.text
    assert response.json()["code"] == code


@pytest.mark.parametrize("named", [False, True], ids=["the_last_answer", "a_named_answer_shown"])
def test_a_regenerate_from_a_view_another_tab_changed_is_refused_before_any_write(
    openai_server: ServerProcess, fake: FakeOpenAI, named: bool
) -> None:
    """Layer: run admission; contract invariant 1. Tab A folded the session on branch 1
    [one, A1, two, A2]; tab B then showed branch 2 [one, A1, two edited, B2]. A's Retry or
    Regenerate with A's position, of "the last answer" (B2 now, never shown in A) or of A1
    (still shown, but the rows after it are not the ones A shows), is 409
    `transcript_changed`: no event, no model call. From the view now shown it goes, and the
    model gets exactly the rows of that view up to the answer regenerated."""
    with openai_server.client() as client:
        sid, seen = two_branches(client, fake)
        assert switch(client, sid, seen["messages"][2]["id"], 2).status_code == 200
        now = session_body(client, sid)
        assert contents(now)[2:] == [("user", "two, edited"), ("assistant", "B2")]
        types, asked = log_types(client, sid), fake.requests_count
        target = {"row_id": seen["messages"][1]["id"]} if named else {}

        refused = regenerate(client, sid, after_seq=seen["last_seq"], **target)
        refused_as(refused, "transcript_changed")
        assert "another tab" in refused.json()["message"]
        assert log_types(client, sid) == types and fake.requests_count == asked

        fake.script(reply(text("again")))
        sent = regenerate(client, sid, after_seq=now["last_seq"], **target)
        assert sent.status_code == 200, sent.text
        body = wait_idle(client, sid)
        asked_on = contents(now)[:1] if named else contents(now)[:3]
        assert said(fake.requests[-1]["messages"]) == asked_on
        assert contents(body) == [*asked_on, ("assistant", "again")]


def test_the_last_answer_must_be_one_the_view_had_a_named_one_only_still_shown(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: run admission; contract invariant 1. A rename and a pin since the view add no
    row: "the last answer" is still the one the view ended with, and its regenerate goes.
    A message answered through tab B since adds rows: "the last answer" would be B's, which
    the view never had, so that regenerate is 409 `transcript_changed`. Naming the answer
    the view shows goes: the model gets the view's rows before it, and B's exchange, which
    only followed it, is kept as the other branch."""
    with openai_server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "one", "A1")
        seen = session_body(client, sid)
        patched = client.patch(
            "/api/session", json={"session_id": sid, "title": "renamed", "pinned": True}
        )
        assert patched.status_code == 200, patched.text
        fake.script(reply(text("A1, again")))
        sent = regenerate(client, sid, after_seq=seen["last_seq"])
        assert sent.status_code == 200, sent.text
        seen = wait_idle(client, sid)
        assert contents(seen) == [("user", "one"), ("assistant", "A1, again")]

        answered(client, fake, sid, "from tab B", "B1")
        types, asked = log_types(client, sid), fake.requests_count
        refused_as(regenerate(client, sid, after_seq=seen["last_seq"]), "transcript_changed")
        assert log_types(client, sid) == types and fake.requests_count == asked

        fake.script(reply(text("A1, third")))
        named = regenerate(
            client, sid, row_id=seen["messages"][1]["id"], after_seq=seen["last_seq"]
        )
        assert named.status_code == 200, named.text
        body = wait_idle(client, sid)
        assert said(fake.requests[-1]["messages"]) == [("user", "one")]
        assert contents(body) == [("user", "one"), ("assistant", "A1, third")]
        kept = [row["content"] for row in body["branches"]["hidden"]]
        assert {"A1", "A1, again", "from tab B", "B1"} <= set(kept)


def test_without_a_position_with_a_bad_one_and_in_the_order_of_refusals(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: run admission and the API's input checks. A position of the wrong type is 400
    before any lookup; an unknown session is 404 before the position is looked at; a stale
    position is 409 `transcript_changed` before a row not shown is 404 `row_not_found`
    (docs/api.md §10's order); a position past the log is 409 too. Nothing is written. Without
    `after_seq` a regenerate is what it always was (API clients, the CLI): the last answer
    of the branch shown now."""
    with openai_server.client() as client:
        sid, seen = two_branches(client, fake)
        assert switch(client, sid, seen["messages"][2]["id"], 2).status_code == 200
        now = session_body(client, sid)
        last = now["last_seq"]
        for bad in ("3", -1, 1.5, True, [1]):
            response = regenerate(client, sid, after_seq=bad)
            assert response.status_code == 400, (bad, response.text)
            assert response.json()["code"] == "invalid_request"
        unknown = regenerate(client, "s_" + "0" * 12, after_seq=seen["last_seq"])
        refused_as(unknown, "session_not_found")
        hidden = seen["messages"][3]["id"]  # A2, hidden by the switch
        refused_as(
            regenerate(client, sid, row_id=hidden, after_seq=seen["last_seq"]), "transcript_changed"
        )
        refused_as(regenerate(client, sid, row_id=hidden, after_seq=last), "row_not_found")
        refused_as(regenerate(client, sid, after_seq=last + 1), "transcript_changed")
        assert session_body(client, sid)["last_seq"] == last

        fake.script(reply(text("B2, again")))
        sent = regenerate(client, sid)
        assert sent.status_code == 200, sent.text
        body = wait_idle(client, sid)
        assert contents(body) == [*contents(now)[:3], ("assistant", "B2, again")]
