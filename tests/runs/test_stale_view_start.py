"""A new message sent from a view of the transcript that another tab changed meanwhile
(docs/api.md §4, `after_seq`): the real server over HTTP, real SQLite, the fake
OpenAI-compatible server at the model boundary.

Layers: run admission (`runs/engine.py`, checked under the session's lock before any write)
and the transcript projection it reads (`TranscriptFold.hidden_at`). Contract invariant 1:
what the user sees is what the model gets. A page that still shows branch 1 while another tab
switched to branch 2 (or edited, regenerated or cut) sent its message after branch 2's tail:
the model answered a context the user never saw, under an answer they never read. With the
position its view was folded to, such a start is 409 `transcript_changed` and writes nothing;
what only appends after the view (an answer finishing, a rename, another message) does not
refuse it, and a start without the position is unchanged."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from runs.branch_kit import answered, contents, log_types, said, switch, two_branches

from fake_openai import FakeOpenAI, barrier, hang, reply, text
from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow


def _switch(client: httpx.Client, fake: FakeOpenAI, sid: str, seen: dict[str, Any]) -> None:
    assert switch(client, sid, seen["messages"][2]["id"], 2).status_code == 200


def _edit(client: httpx.Client, fake: FakeOpenAI, sid: str, seen: dict[str, Any]) -> None:
    fake.script(reply(text("C1")))
    start_turn(client, sid, "one, edited", edit_of=seen["messages"][0]["id"])
    wait_idle(client, sid)


def _regenerate(client: httpx.Client, fake: FakeOpenAI, sid: str, seen: dict[str, Any]) -> None:
    fake.script(reply(text("A2, again")))
    response = client.post("/api/chat/regenerate", json={"session_id": sid})
    assert response.status_code == 200, response.text
    wait_idle(client, sid)


def _truncate(client: httpx.Client, fake: FakeOpenAI, sid: str, seen: dict[str, Any]) -> None:
    response = client.post("/api/session/truncate", json={"session_id": sid, "keep_count": 2})
    assert response.status_code == 200, response.text


def _nothing_stored(server: ServerProcess) -> bool:
    """No attachment's bytes were kept."""
    stored = server.data_dir / "attachments"
    return not stored.exists() or not any(p.is_file() for p in stored.rglob("*"))


UPLOAD = {"name": "a.txt", "mime": "text/plain", "data_base64": base64.b64encode(b"x").decode()}


@pytest.mark.parametrize("elsewhere", [_switch, _edit, _regenerate, _truncate])
def test_a_start_from_a_view_another_tab_changed_is_refused_before_any_write(
    openai_server: ServerProcess,
    fake: FakeOpenAI,
    elsewhere: Callable[[httpx.Client, FakeOpenAI, str, dict[str, Any]], None],
) -> None:
    """Layer: run admission; contract invariant 1. Tab A folded the session at `seen`
    (branch 1); tab B then switched to branch 2, edited, regenerated or cut. A's message
    with A's position is 409 `transcript_changed`: no event, no attachment, no model call;
    sent again from the view now shown, it goes, and the model gets exactly that view."""
    with openai_server.client() as client:
        sid, seen = two_branches(client, fake)
        elsewhere(client, fake, sid, seen)
        now = session_body(client, sid)
        types, asked = log_types(client, sid), fake.requests_count
        message = {"session_id": sid, "message": "three", "attachments": [UPLOAD]}
        refused = client.post("/api/chat/start", json={**message, "after_seq": seen["last_seq"]})
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "transcript_changed"
        assert "another tab" in refused.json()["message"]
        assert log_types(client, sid) == types and fake.requests_count == asked
        assert session_body(client, sid)["last_seq"] == now["last_seq"]
        assert _nothing_stored(openai_server)

        fake.script(reply(text("A3")))
        start_turn(client, sid, "three", after_seq=now["last_seq"])
        body = wait_idle(client, sid)
        assert said(fake.requests[-1]["messages"]) == [*contents(now), ("user", "three")]
        assert contents(body)[-2:] == [("user", "three"), ("assistant", "A3")]


def test_what_only_appends_after_the_view_does_not_refuse_the_start(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: run admission; contract invariant 1's other side. Tab A folded the session
    while its own turn was still running; since then the turn finished, the session was
    renamed and pinned, a message was queued and removed, and another tab sent a message
    that was answered. None hid a row A saw, so A's start with its old position goes, after
    all of it (what A did not see yet is added to its view, never taken out of it)."""
    with openai_server.client() as client:
        sid = new_session(client)
        fake.script(reply(text("A1")))
        start_turn(client, sid, "one")
        seen = session_body(client, sid)  # its turn shown, its answer still to come
        wait_idle(client, sid)
        patched = client.patch(
            "/api/session", json={"session_id": sid, "title": "renamed", "pinned": True}
        )
        assert patched.status_code == 200, patched.text
        fake.script(reply(text("L1")))  # idle: a queued message starts at once
        queued = client.post("/api/chat/queue", json={"session_id": sid, "message": "later"})
        assert queued.status_code == 200 and queued.json()["started"], queued.text
        wait_idle(client, sid)
        answered(client, fake, sid, "from tab B", "B1")

        fake.script(reply(text("A2")))
        start_turn(client, sid, "two", after_seq=seen["last_seq"])
        body = wait_idle(client, sid)
        assert [c for r, c in contents(body) if r == "user"] == [
            "one",
            "later",
            "from tab B",
            "two",
        ]


def test_without_a_position_or_with_a_bad_one(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: run admission and the API's input checks. Without `after_seq` a start is what
    it always was (API clients, the CLI). A position past the session's log is no view of
    it: 409 `transcript_changed` too. A position of the wrong type is 400, before any
    lookup."""
    with openai_server.client() as client:
        sid, seen = two_branches(client, fake)
        _switch(client, fake, sid, seen)
        last = session_body(client, sid)["last_seq"]
        ahead = client.post(
            "/api/chat/start", json={"session_id": sid, "message": "x", "after_seq": last + 1}
        )
        assert ahead.status_code == 409 and ahead.json()["code"] == "transcript_changed"
        for bad in ("3", -1, 1.5, True):
            response = client.post(
                "/api/chat/start", json={"session_id": sid, "message": "x", "after_seq": bad}
            )
            assert response.status_code == 400, (bad, response.text)
            assert response.json()["code"] == "invalid_request"
        assert session_body(client, sid)["last_seq"] == last
        fake.script(reply(text("A3")))
        start_turn(client, sid, "three")
        assert contents(wait_idle(client, sid))[-2:] == [("user", "three"), ("assistant", "A3")]


def test_send_now_of_a_queued_message_checks_the_view_it_was_clicked_in(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: run admission for `POST /api/chat/queue/start`; contract invariant 1. After a
    Stop the queued message waits for "Send now"; it is sent against the view shown when it
    is clicked: from a view folded before another tab's switch it is 409
    `transcript_changed` and stays queued; from the view now shown it goes."""
    with openai_server.client() as client:
        sid, _ = two_branches(client, fake)
        fake.script(hang())
        stream = start_turn(client, sid, "three")["stream_id"]
        fake.wait_for_requests(fake.requests_count + 1)
        queued = client.post("/api/chat/queue", json={"session_id": sid, "message": "later"})
        assert queued.status_code == 200, queued.text
        queue_id = queued.json()["queue_id"]
        client.post("/api/chat/cancel", json={"stream_id": stream})
        seen = wait_idle(client, sid)
        assert [q["queue_id"] for q in seen["queued"]] == [queue_id]
        _switch(client, fake, sid, seen)
        now = session_body(client, sid)

        refused = client.post(
            "/api/chat/queue/start", json={"queue_id": queue_id, "after_seq": seen["last_seq"]}
        )
        assert refused.status_code == 409 and refused.json()["code"] == "transcript_changed"
        assert session_body(client, sid)["last_seq"] == now["last_seq"]
        assert [q["queue_id"] for q in session_body(client, sid)["queued"]] == [queue_id]

        fake.script(reply(text("A4")))
        sent = client.post(
            "/api/chat/queue/start", json={"queue_id": queue_id, "after_seq": now["last_seq"]}
        )
        assert sent.status_code == 200, sent.text
        body = wait_idle(client, sid)
        assert body["queued"] == [] and contents(body)[-2:] == [
            ("user", "later"),
            ("assistant", "A4"),
        ]
        assert said(fake.requests[-1]["messages"]) == [*contents(now), ("user", "later")]


def test_a_message_queued_into_an_idle_session_from_a_stale_view_is_refused(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: run admission for `POST /api/chat/queue {after_seq}`; contract invariant 1. A
    message queued while the session happens to be idle starts at once: from tab A's view,
    folded before tab B switched to branch 2, it is 409 `transcript_changed` and nothing is
    queued, stored, written or asked of the model; from the view now shown it starts there.
    While a run holds the session the position is not checked: the message waits behind the
    run and is sent against what is shown when it starts (its answer included)."""
    with openai_server.client() as client:
        sid, seen = two_branches(client, fake)
        _switch(client, fake, sid, seen)
        now = session_body(client, sid)
        types, asked = log_types(client, sid), fake.requests_count
        message = {"session_id": sid, "message": "three", "attachments": [UPLOAD]}
        refused = client.post("/api/chat/queue", json={**message, "after_seq": seen["last_seq"]})
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "transcript_changed"
        assert log_types(client, sid) == types and fake.requests_count == asked
        assert session_body(client, sid)["queued"] == [] and _nothing_stored(openai_server)

        fake.script(reply(text("A3")))
        again = {"session_id": sid, "message": "three", "after_seq": now["last_seq"]}
        sent = client.post("/api/chat/queue", json=again)
        assert sent.status_code == 200 and sent.json()["started"], sent.text
        body = wait_idle(client, sid)
        assert said(fake.requests[-1]["messages"]) == [*contents(now), ("user", "three")]

        fake.script(reply(barrier("four"), text("A4")), reply(text("L1")))
        start_turn(client, sid, "four", after_seq=body["last_seq"])
        assert fake.wait_reached("four")
        behind = {"session_id": sid, "message": "later", "after_seq": seen["last_seq"]}
        queued = client.post("/api/chat/queue", json=behind)
        assert queued.status_code == 200 and queued.json()["started"] is None, queued.text
        fake.release("four")
        fake.wait_for_requests(asked + 3)
        body = wait_idle(client, sid)
        assert contents(body)[-4:] == [
            ("user", "four"),
            ("assistant", "A4"),
            ("user", "later"),
            ("assistant", "L1"),
        ]
        assert said(fake.requests[-1]["messages"]) == contents(body)[:-1]
