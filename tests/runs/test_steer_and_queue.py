"""Steering and the queue over real HTTP (docs/api.md §4). Layers: log (steer.accepted /
steer.leftover, queue.*), transcript (steer rows, `queued`), model context (consumed steers
are the user's words at that step; leftovers are not), run registry (the queue starts the
next turn only after a completed run). No typed word is lost."""

from __future__ import annotations

import time

import httpx
import pytest

from helpers import (
    ServerProcess,
    new_session,
    read_events,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)


def test_steer_reaches_the_running_agent_and_its_context(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow summarise")
        read_events(client, sid, after="0", stop_on="reasoning.delta")
        steer = client.post(
            "/api/chat/steer", json={"stream_id": run["stream_id"], "text": "mention the budget"}
        ).json()
        assert steer["accepted"] is True
        body = wait_idle(client, sid)
        assistant = body["messages"][-1]
        assert "mention the budget" in assistant["content"]
        steer_rows = [i for i in assistant["timeline"] if i["type"] == "steer"]
        assert steer_rows == [
            {
                "id": steer_rows[0]["id"],
                "type": "steer",
                "text": "mention the budget",
                "leftover": False,
            }
        ]
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        users = [m["content"] for m in context["context_messages"] if m["role"] == "user"]
        assert users == ["/slow summarise", "mention the budget"]


def test_steer_the_run_never_saw_comes_back_as_leftover(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow write")
        # after the demo's last step boundary: it is writing the answer now
        frames = read_events(client, sid, after="0", stop_on="text.delta", timeout=20)
        while True:
            frames = read_events(client, sid, after=frames[-1]["id"], stop_on="text.delta")
            body = session_body(client, sid)
            if (
                body["live"]
                and body["live"]["timeline"][-1]["type"] == "text"
                and len(body["live"]["timeline"]) > 4
            ):
                break
        assert client.post(
            "/api/chat/steer", json={"stream_id": run["stream_id"], "text": "too late"}
        ).json()["accepted"]
        body = wait_idle(client, sid)
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        leftover = [f.json["data"] for f in events if f.event == "steer.leftover"]
        assert len(leftover) == 1 and leftover[0]["text"] == "too late"
        types = [f.event for f in events]
        assert types.index("steer.leftover") < types.index("run.finished")
        assistant = body["messages"][-1]
        steer_rows = [i for i in assistant["timeline"] if i["type"] == "steer"]
        assert steer_rows[0]["leftover"] is True
        assert "offline demo runtime" in assistant["content"]  # still the answer
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        assert "too late" not in str(context["context_messages"])


def test_steer_for_a_finished_or_unknown_run_is_not_accepted(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "hi")
        wait_idle(client, sid)
        before = session_body(client, sid)["last_seq"]
        late = client.post(
            "/api/chat/steer", json={"stream_id": run["stream_id"], "text": "x"}
        ).json()
        assert late["accepted"] is False and late["reason"]
        assert (
            client.post("/api/chat/steer", json={"stream_id": "r_nope", "text": "x"}).json()[
                "accepted"
            ]
            is False
        )
        empty = client.post("/api/chat/steer", json={"stream_id": run["stream_id"], "text": "  "})
        assert empty.status_code == 400 and empty.json()["code"] == "invalid_request"
        assert session_body(client, sid)["last_seq"] == before


def test_queued_message_starts_when_the_run_completes(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "/slow first")
        queued = client.post(
            "/api/chat/queue", json={"session_id": sid, "message": "second"}
        ).json()
        assert queued["started"] is None
        body = session_body(client, sid)
        assert [q["text"] for q in body["queued"]] == ["second"]
        edited = client.patch(
            "/api/chat/queue",
            params={"queue_id": queued["queue_id"]},
            json={"text": "second, edited"},
        )
        assert edited.status_code == 200
        assert session_body(client, sid)["queued"][0]["text"] == "second, edited"
        for _ in range(200):
            body = wait_idle(client, sid)
            if len(body["messages"]) == 4:
                break
        assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [
            "/slow first",
            "second, edited",
        ]
        assert body["queued"] == []


def test_queue_survives_cancel_and_restart_and_can_be_removed(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow first")
        queue_id = client.post(
            "/api/chat/queue", json={"session_id": sid, "message": "later"}
        ).json()["queue_id"]
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        body = wait_idle(client, sid)
        assert body["messages"][-1]["state"] == "cancelled"
        assert [q["queue_id"] for q in body["queued"]] == [queue_id]  # stays queued
    demo_server.restart()
    with demo_server.client() as client:
        assert [q["text"] for q in session_body(client, sid)["queued"]] == ["later"]
        removed = client.delete("/api/chat/queue", params={"queue_id": queue_id})
        assert removed.status_code == 200
        assert session_body(client, sid)["queued"] == []
        again = client.delete("/api/chat/queue", params={"queue_id": queue_id})
        assert again.status_code == 404 and again.json()["code"] == "queue_item_not_found"


def test_queue_on_an_idle_session_starts_at_once(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        queued = client.post("/api/chat/queue", json={"session_id": sid, "message": "now"}).json()
        assert queued["started"]
        body = wait_idle(client, sid)
        assert body["messages"][0]["content"] == "now" and body["queued"] == []


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"message": ""}, 400),
        ({"message": 5}, 400),
        ({"session_id": "s_missing"}, 404),
    ],
)
def test_bad_queue_requests_change_nothing(
    demo_server: ServerProcess, body: dict, status: int
) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        before = session_body(client, sid)
        response = client.post("/api/chat/queue", json={"session_id": sid, "message": "x", **body})
        assert response.status_code == status
        assert session_body(client, sid) == before


def test_a_queued_message_waiting_after_a_stop_can_be_sent_now(
    demo_server: ServerProcess,
) -> None:
    """`POST /api/chat/queue/start`: after a Stop the queue waits; the user starts the item,
    which becomes the turn and leaves the queue. Refusals (busy, gone, malformed) change
    nothing."""
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow first")
        queue_id = client.post(
            "/api/chat/queue", json={"session_id": sid, "message": "later"}
        ).json()["queue_id"]
        busy = client.post("/api/chat/queue/start", json={"queue_id": queue_id})
        assert busy.status_code == 409 and busy.json()["code"] == "session_busy"
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        before = wait_idle(client, sid)
        assert [q["queue_id"] for q in before["queued"]] == [queue_id]
        for bad, status in (({"queue_id": 5}, 400), ({}, 400)):
            assert client.post("/api/chat/queue/start", json=bad).status_code == status
        assert session_body(client, sid) == before

        started = client.post("/api/chat/queue/start", json={"queue_id": queue_id})
        assert started.status_code == 200 and started.json()["stream_id"]
        body = wait_idle(client, sid)
        assert body["queued"] == []
        assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [
            "/slow first",
            "later",
        ]
        gone = client.post("/api/chat/queue/start", json={"queue_id": queue_id})
        assert gone.status_code == 404 and gone.json()["code"] == "queue_item_not_found"


def test_messages_queued_behind_a_stopped_run_wait_through_later_runs_until_sent(
    demo_server: ServerProcess,
) -> None:
    """After a Stop the queue waits for `queue/start` (docs/api.md §4): a Retry that
    completed sent what was queued behind the stopped run by itself, after the new answer
    on its new branch. What was queued behind the stopped run now waits through later runs;
    a message queued behind a later run goes when that run completes; starting one that
    waits lets the queue go on. Layers: the transcript fold (which items wait) and the run
    engine (`start_next` passes them by); keeps contract invariant 5 (which items wait is
    folded from the log's run endings, so a restart or another replica decides the same)."""

    def users(body: dict) -> list[str]:
        return [m["content"] for m in body["messages"] if m["role"] == "user"]

    def queue(client: httpx.Client, sid: str, text: str) -> str:
        answer = client.post("/api/chat/queue", json={"session_id": sid, "message": text})
        assert answer.status_code == 200, answer.text
        return answer.json()["queue_id"]

    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow first")
        waiting = queue(client, sid, "A")
        queue(client, sid, "C")
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        wait_idle(client, sid)

        retry = client.post("/api/chat/regenerate", json={"session_id": sid})
        assert retry.status_code == 200, retry.text
        queue(client, sid, "B")  # behind the retry: it goes when the retry completes
        body = wait_until(
            lambda: (b := wait_idle(client, sid)) and len(b["messages"]) == 4 and b,
            what="the retry and B answered, nothing else sent",
        )
        assert users(body) == ["/slow first", "B"]
        assert [q["text"] for q in body["queued"]] == ["A", "C"]
        time.sleep(0.5)  # B's completion started nothing either
        assert [q["text"] for q in session_body(client, sid)["queued"]] == ["A", "C"]

        started = client.post("/api/chat/queue/start", json={"queue_id": waiting})
        assert started.status_code == 200, started.text
        body = wait_until(lambda: (b := wait_idle(client, sid)) and len(b["messages"]) == 8 and b)
        assert users(body) == ["/slow first", "B", "A", "C"]  # the queue went on
        assert body["queued"] == []
