"""Edit, regenerate and branches (docs/api.md §10) through the whole stack: the real server,
real HTTP and SSE, the fake OpenAI-compatible server at the model boundary.

Layers: log (`transcript.truncated` keeps the rows it hides, `branch.switched`), transcript
and model-context projections (invariant 1: what the page shows is what the model gets,
on every branch), sidebar row (invariant 4: switching is not activity), run admission
(409 `session_busy` / `session_rotated` before any write), replay (invariant 5)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest
from runs.branch_kit import answered, switch

from fake_openai import FakeOpenAI, hang, reply, text
from helpers import (
    ServerProcess,
    fold_frames,
    live_timeline,
    new_session,
    read_events,
    rotated_conversation,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow


def context_of(client: httpx.Client, sid: str) -> dict[str, Any]:
    response = client.get("/api/session/context", params={"session_id": sid})
    assert response.status_code == 200, response.text
    return response.json()


def contents(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"]]


def said(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A model request (or context) as (role, text) pairs."""
    return [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "assistant")]


def log_of(client: httpx.Client, sid: str) -> list[dict[str, Any]]:
    frames = read_events(client, sid, after="0", stop_on="heartbeat")
    return [f.json for f in frames if f.get("id")]


def test_edit_keeps_the_old_branch_and_the_model_follows_the_one_shown(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    with openai_server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "one", "A1")
        body = answered(client, fake, sid, "two", "A2")
        two = body["messages"][2]
        before = body

        fake.script(reply(text("B2")))
        start_turn(client, sid, "two, edited", edit_of=two["id"])
        body = wait_idle(client, sid)
        assert contents(body) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two, edited"),
            ("assistant", "B2"),
        ]
        edited = body["messages"][2]
        assert edited["branch"] == {"index": 2, "count": 2}
        assert "branch" not in body["messages"][0] and "branch" not in body["messages"][3]
        # The model got the new branch only: never the message it replaces, nor its answer.
        assert said(fake.requests[-1]["messages"]) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two, edited"),
        ]
        # An edit shrinks the visible transcript first: a truncate's generation and baseline.
        assert body["transcript_generation"] == before["transcript_generation"] + 1
        assert body["transcript_generation_baseline"] == 2
        assert body["message_count"] == 4

        # Switching back shows the old branch, whole, and is what the model gets next.
        response = switch(client, sid, edited["id"], 1)
        assert response.status_code == 200, response.text
        shown = response.json()["session"]
        assert contents(shown) == contents(before)
        assert shown["messages"][2]["branch"] == {"index": 1, "count": 2}
        assert shown["messages"][3] == {**before["messages"][3]}
        assert said(context_of(client, sid)["context_messages"]) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two"),
            ("assistant", "A2"),
        ]
        # Not activity (invariant 4): the time and the order stay; nothing is unread.
        assert shown["updated_at"] == body["updated_at"]
        assert shown["last_message_at"] == body["last_message_at"]
        assert shown["transcript_generation"] == body["transcript_generation"] + 1
        assert shown["transcript_generation_baseline"] == shown["message_count"] == 4
        assert shown["activity_count"] == 4

        body = answered(client, fake, sid, "three", "A3")
        assert said(fake.requests[-1]["messages"]) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two"),
            ("assistant", "A2"),
            ("user", "three"),
        ]
        # The other branch is still there, with its own answer.
        shown = switch(client, sid, body["messages"][2]["id"], 2).json()["session"]
        assert contents(shown) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two, edited"),
            ("assistant", "B2"),
        ]
        assert shown["message_count"] == 4
        # Switching to the branch already shown changes nothing, and writes nothing.
        last_seq = shown["last_seq"]
        again = switch(client, sid, shown["messages"][2]["id"], 2)
        assert again.status_code == 200 and again.json()["session"]["last_seq"] == last_seq


def test_regenerate_and_retry_after_stop_keep_every_answer(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    with openai_server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "one", "A1")
        answered(client, fake, sid, "two", "A2")

        # Regenerate the first answer: a new run for "one", beside A1 (which hides A2 too).
        body = session_body(client, sid)
        first = body["messages"][1]
        fake.script(reply(text("A1 again")))
        response = client.post(
            "/api/chat/regenerate", json={"session_id": sid, "row_id": first["id"]}
        )
        assert response.status_code == 200, response.text
        started = response.json()
        assert started["turn_id"] == first["turn_id"] and started["stream_id"] != first["id"]
        assert set(started) == {"session_id", "stream_id", "turn_id", "pending_started_at"}
        body = wait_idle(client, sid)
        assert contents(body) == [("user", "one"), ("assistant", "A1 again")]
        assert body["messages"][1]["branch"] == {"index": 2, "count": 2}
        assert said(fake.requests[-1]["messages"]) == [("user", "one")]
        assert body["message_count"] == 2

        # Retry after a Stop is a regenerate (default: the last answer).
        fake.script(reply(text("partial"), hang()))
        start_turn(client, sid, "three")
        wait_until(lambda: "partial" in str(live_timeline(client, sid)), what="partial output")
        client.post("/api/chat/cancel", json={"session_id": sid})
        body = wait_idle(client, sid)
        stopped = body["messages"][-1]
        assert stopped["state"] == "cancelled"
        fake.script(reply(text("A3")))
        response = client.post("/api/chat/regenerate", json={"session_id": sid})
        assert response.status_code == 200, response.text
        body = wait_idle(client, sid)
        assert contents(body)[-2:] == [("user", "three"), ("assistant", "A3")]
        assert body["messages"][-1]["branch"] == {"index": 2, "count": 2}
        assert said(fake.requests[-1]["messages"])[-1] == ("user", "three")
        assert "partial" not in str(fake.requests[-1]["messages"])

        # The stopped answer is kept, partial output and notice included.
        shown = switch(client, sid, body["messages"][-1]["id"], 1).json()["session"]
        assert shown["messages"][-1] == stopped | {"branch": {"index": 1, "count": 2}}
        # and its partial output is what the model gets next (invariant 1)
        assert "partial" in str(context_of(client, sid)["context_messages"])

        # The first fork still holds both answers to "one", each with what came after it.
        shown = switch(client, sid, shown["messages"][1]["id"], 1).json()["session"]
        assert contents(shown) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two"),
            ("assistant", "A2"),
        ]


def test_replay_from_every_cursor_a_second_tab_and_a_restart_agree(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Invariant 5: every cursor's replay folds to `GET /api/session`, branches included;
    a second tab that followed live sees what the first one switched; a restart keeps it."""
    with openai_server.client() as client, openai_server.client() as tab:
        sid = new_session(client)
        answered(client, fake, sid, "one", "A1")
        body = answered(client, fake, sid, "two", "A2")
        fake.script(reply(text("B2")))
        start_turn(client, sid, "two b", edit_of=body["messages"][2]["id"])
        wait_idle(client, sid)
        fake.script(reply(text("A1'")))
        first_answer = body["messages"][1]["id"]
        client.post("/api/chat/regenerate", json={"session_id": sid, "row_id": first_answer})
        body = wait_idle(client, sid)
        tab_start = body["last_seq"]
        # the second tab follows live from here while the first one switches twice
        shown = switch(client, sid, body["messages"][1]["id"], 1).json()["session"]
        shown = switch(client, sid, shown["messages"][2]["id"], 1).json()["session"]
        assert contents(shown) == [
            ("user", "one"),
            ("assistant", "A1"),
            ("user", "two"),
            ("assistant", "A2"),
        ]
        final = session_body(client, sid)
        context = context_of(client, sid)

        events = log_of(client, sid)
        assert [e["type"] for e in events].count("branch.switched") == 2
        frames = read_events(tab, sid, after="0", until_seq=final["last_seq"])
        whole = fold_frames(frames)
        keys = ("messages", "branches", "live", "queued")
        assert {k: whole[k] for k in keys} == {k: final[k] for k in keys}
        for cursor in range(0, final["last_seq"] + 1):
            later = read_events(tab, sid, after=str(cursor), until_seq=final["last_seq"])
            replay = fold_frames(
                [f for f in frames if f.get("id") and int(f["id"]) <= cursor] + later
            )
            assert {k: replay[k] for k in keys} == {k: final[k] for k in keys}, cursor
        # A tab that connected before the switches, from its own cursor.
        live = read_events(tab, sid, after=str(tab_start), until_seq=final["last_seq"])
        assert [f.event for f in live] == ["branch.switched", "branch.switched"]

    openai_server.restart()
    with openai_server.client() as client:
        after = session_body(client, sid)
        assert {k: after[k] for k in keys} == {k: final[k] for k in keys}
        assert after["transcript_generation"] == final["transcript_generation"]
        assert after["message_count"] == final["message_count"]
        assert context_of(client, sid) == context
        # after the restart the next turn still follows the branch shown
        answered(client, fake, sid, "three", "A3")
        assert said(fake.requests[-1]["messages"])[:4] == said(context["context_messages"])


def test_editing_regenerating_or_switching_while_a_run_is_active_is_refused(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    with openai_server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "one", "A1")
        body = answered(client, fake, sid, "two", "A2")
        fake.script(reply(text("B2")))
        start_turn(client, sid, "two b", edit_of=body["messages"][2]["id"])
        body = wait_idle(client, sid)
        fake.script(reply(text("slow"), hang()))
        run = start_turn(client, sid, "three")
        wait_until(lambda: session_body(client, sid)["live"], what="the run")
        before = log_of(client, sid)
        attempts = [
            ("/api/chat/start", {"message": "x", "edit_of": body["messages"][0]["id"]}),
            ("/api/chat/regenerate", {}),
            ("/api/chat/regenerate", {"row_id": body["messages"][1]["id"]}),
            ("/api/session/branch", {"row_id": body["messages"][2]["id"], "index": 1}),
        ]
        for path, extra in attempts:
            response = client.post(path, json={"session_id": sid, **extra})
            assert response.status_code == 409, (path, response.text)
            assert response.json()["code"] == "session_busy"
            assert response.json()["active_stream_id"] == run["stream_id"]
        after = log_of(client, sid)
        assert [e for e in after if e["seq"] <= before[-1]["seq"]] == before
        assert not [e for e in after if e["type"] in ("transcript.truncated", "branch.switched")][
            1:
        ]  # only the edit's own truncate
        client.post("/api/chat/cancel", json={"session_id": sid})
        wait_idle(client, sid)


def test_bad_requests_change_nothing(openai_server: ServerProcess, fake: FakeOpenAI) -> None:
    with openai_server.client() as client:
        sid = new_session(client)
        body = answered(client, fake, sid, "one", "A1")
        user, answer = body["messages"]
        before = log_of(client, sid)
        cases = [
            ("/api/chat/start", {"message": "x", "edit_of": "u_nope"}, 404, "row_not_found"),
            ("/api/chat/start", {"message": "x", "edit_of": answer["id"]}, 400, "invalid_request"),
            ("/api/chat/start", {"message": "x", "edit_of": "bad id!"}, 400, "invalid_request"),
            ("/api/chat/start", {"message": " ", "edit_of": user["id"]}, 400, "invalid_request"),
            (
                "/api/chat/start",
                {"message": "x", "keep_attachments": []},
                400,
                "invalid_request",
            ),
            (
                "/api/chat/start",
                {"message": "x", "edit_of": user["id"], "keep_attachments": ["a_nope"]},
                400,
                "invalid_request",
            ),
            ("/api/chat/regenerate", {"row_id": user["id"]}, 400, "invalid_request"),
            ("/api/chat/regenerate", {"row_id": "r_nope"}, 404, "row_not_found"),
            ("/api/chat/regenerate", {"row_id": 3}, 400, "invalid_request"),
            ("/api/session/branch", {"row_id": user["id"], "index": 1}, 400, "invalid_request"),
            ("/api/session/branch", {"row_id": "u_nope", "index": 1}, 404, "row_not_found"),
            ("/api/session/branch", {"row_id": user["id"], "index": 0}, 400, "invalid_request"),
            ("/api/session/branch", {"row_id": user["id"], "index": "1"}, 400, "invalid_request"),
            ("/api/session/branch", {"row_id": user["id"]}, 400, "invalid_request"),
        ]
        for path, extra, status, code in cases:
            response = client.post(path, json={"session_id": sid, **extra})
            assert response.status_code == status, (path, extra, response.text)
            assert response.json()["code"] == code and response.json()["message"]
        for path, extra in [
            ("/api/chat/regenerate", {}),
            ("/api/session/branch", {"row_id": user["id"], "index": 1}),
            ("/api/chat/start", {"message": "x", "keep_attachments": []}),
        ]:
            response = client.post(path, json={"session_id": "s_nope", **extra})
            assert response.status_code == 404 and response.json()["code"] == "session_not_found"
        # An index past the branches there are, once there are some.
        fake.script(reply(text("A1 again")))
        client.post("/api/chat/regenerate", json={"session_id": sid})
        body = wait_idle(client, sid)
        response = switch(client, sid, body["messages"][1]["id"], 3)
        assert response.status_code == 400 and "between 1 and 2" in response.json()["message"]
        assert len(log_of(client, sid)) == len(before) + 5  # truncate, turn, run, text, end
        # A new session has nothing to regenerate.
        empty = new_session(client)
        response = client.post("/api/chat/regenerate", json={"session_id": empty})
        assert response.status_code == 400 and response.json()["code"] == "invalid_request"
        assert len(log_of(client, empty)) == 1


def upload(name: str, mime: str, data: bytes) -> dict[str, str]:
    return {"name": name, "mime": mime, "data_base64": base64.b64encode(data).decode()}


def test_branches_keep_their_attachments(openai_server: ServerProcess, fake: FakeOpenAI) -> None:
    with openai_server.client() as client:
        sid = new_session(client)
        fake.script(reply(text("read it")))
        start_turn(
            client, sid, "see file", attachments=[upload("notes.txt", "text/plain", b"ZEBRA-42")]
        )
        body = wait_idle(client, sid)
        original = body["messages"][0]
        (attachment,) = original["attachments"]

        # An edit keeps the message's attachments unless told otherwise...
        fake.script(reply(text("read it again")))
        start_turn(client, sid, "see file, again", edit_of=original["id"])
        body = wait_idle(client, sid)
        kept = body["messages"][0]
        assert [a["id"] for a in kept["attachments"]] == [attachment["id"]]
        assert "ZEBRA-42" in str(fake.requests[-1]["messages"])
        assert client.get(kept["attachments"][0]["url"]).content == b"ZEBRA-42"

        # Kept and new attachments together fit the per-message limit (10), or nothing is written.
        last_seq = body["last_seq"]
        response = client.post(
            "/api/chat/start",
            json={
                "session_id": sid,
                "message": "too many",
                "edit_of": kept["id"],
                "attachments": [upload(f"f{i}.txt", "text/plain", b"x") for i in range(10)],
            },
        )
        assert response.status_code == 400 and "at most 10" in response.json()["message"]
        assert session_body(client, sid)["last_seq"] == last_seq

        # ...and drops them when asked, and takes new ones beside them.
        fake.script(reply(text("no file")))
        start_turn(
            client,
            sid,
            "now without it",
            edit_of=kept["id"],
            keep_attachments=[],
            attachments=[upload("other.txt", "text/plain", b"OKAPI-7")],
        )
        body = wait_idle(client, sid)
        assert [a["name"] for a in body["messages"][0]["attachments"]] == ["other.txt"]
        request = str(fake.requests[-1]["messages"])
        assert "OKAPI-7" in request and "ZEBRA-42" not in request
        assert body["messages"][0]["branch"] == {"index": 3, "count": 3}

        # Regenerating the first branch's answer sends its attachment again.
        shown = switch(client, sid, body["messages"][0]["id"], 1).json()["session"]
        assert shown["messages"][0]["attachments"] == original["attachments"]
        fake.script(reply(text("read it, regenerated")))
        client.post("/api/chat/regenerate", json={"session_id": sid})
        wait_idle(client, sid)
        request = str(fake.requests[-1]["messages"])
        assert "ZEBRA-42" in request and "OKAPI-7" not in request


def test_a_branch_before_a_compression_point_never_gets_its_summary(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """A compression's summary holds the rows of the branch it was made on: a branch that
    starts before that point (an edit of an earlier message, a regenerated answer) gets a
    context without it, and the branch it was made on gets it back when shown again."""
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
        answered(client, fake, sid, "one", "A1")
        long_answer = "word " * 400  # ~500 tokens: the next request passes 80% of 600
        fake.script(reply(text(long_answer), usage={"prompt_tokens": 20, "completion_tokens": 500}))
        start_turn(client, sid, "two")
        wait_idle(client, sid)
        fake.script(reply(text("SUMMARY-OF-ONE-AND-TWO")), reply(text("three answered")))
        start_turn(client, sid, "three")
        body = wait_idle(client, sid)
        compressed = context_of(client, sid)
        assert "SUMMARY-OF-ONE-AND-TWO" in str(compressed["context_messages"])
        assert compressed["compressed_at"]["turn_id"] == body["messages"][4]["turn_id"]

        # Edit "two": the branch starts before the compression point.
        fake.script(reply(text("two b answered")))
        start_turn(client, sid, "two b", edit_of=body["messages"][2]["id"])
        edited = wait_idle(client, sid)
        context = context_of(client, sid)
        assert "SUMMARY" not in str(context) and context["excluded"] == []
        assert said(context["context_messages"]) == said(edited["messages"])
        assert "SUMMARY" not in str(fake.requests[-1]["messages"])

        # Back on the branch the compression was made on, it applies again.
        switch(client, sid, edited["messages"][2]["id"], 1)
        assert context_of(client, sid) == compressed

        # Regenerating the answer of the compressed turn: that run's summary may hold its
        # own work, so the new answer starts without it (the runtime compresses anew).
        fake.script(reply(text("SECOND-SUMMARY")), reply(text("three again")))
        client.post("/api/chat/regenerate", json={"session_id": sid})
        wait_idle(client, sid)
        requests = [str(r["messages"]) for r in fake.requests[-2:]]
        assert not any("SUMMARY-OF-ONE-AND-TWO" in r for r in requests)
        context = context_of(client, sid)
        assert "SUMMARY-OF-ONE-AND-TWO" not in str(context)
        assert "SECOND-SUMMARY" in str(context["context_messages"])


def test_a_rotated_session_refuses_edit_regenerate_and_switch_before_any_write(
    tmp_path: Path,
) -> None:
    """Like truncate (tests/http/test_sessions_api.py): 409 `session_rotated` with the
    continuation, and nothing changes in the parent or the child."""
    with rotated_conversation(tmp_path / "data") as (client, parent, child):

        def observed() -> tuple:
            return (
                session_body(client, parent),
                log_of(client, parent),
                session_body(client, child),
                context_of(client, child),
            )

        before = observed()
        user, answer = before[0]["messages"]
        attempts = [
            ("/api/chat/start", {"message": "stale tab", "edit_of": user["id"]}),
            ("/api/chat/regenerate", {}),
            ("/api/chat/regenerate", {"row_id": answer["id"]}),
            ("/api/session/branch", {"row_id": user["id"], "index": 1}),
            ("/api/session/branch", {"row_id": "u_nope", "index": 9}),
            # docs/api.md §10: keep_attachments without edit_of is refused after the 409s
            ("/api/chat/start", {"message": "stale tab", "keep_attachments": []}),
        ]
        for path, extra in attempts:
            response = client.post(path, json={"session_id": parent, **extra})
            assert response.status_code == 409, (path, response.text)
            assert response.json()["code"] == "session_rotated"
            assert response.json()["continuation_session_id"] == child
        assert observed() == before


def test_a_regenerated_run_cut_by_a_crash_is_settled_on_its_branch(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Recovery settles a regenerated run like any other (its `turn.submitted` has a stream
    and no `run.finished`): interrupted, kept with its partial output on the new branch, the
    old answer kept beside it, and the session admits the next command."""
    with openai_server.client() as client:
        sid = new_session(client)
        body = answered(client, fake, sid, "one", "A1")
        old = body["messages"][1]
        fake.script(reply(text("half of a new"), hang()))
        client.post("/api/chat/regenerate", json={"session_id": sid})
        wait_until(lambda: "half" in str(live_timeline(client, sid)), what="partial output")
    openai_server.kill()
    openai_server.start()
    with openai_server.client() as client:
        body = wait_idle(client, sid)
        assert [m["role"] for m in body["messages"]] == ["user", "assistant"]
        cut = body["messages"][1]
        assert cut["state"] == "interrupted" and "half of a new" in cut["content"]
        assert cut["branch"] == {"index": 2, "count": 2}
        assert "half of a new" in str(context_of(client, sid)["context_messages"])
        shown = switch(client, sid, cut["id"], 1).json()["session"]
        assert shown["messages"][1] == old | {"branch": {"index": 1, "count": 2}}
        assert "half" not in str(context_of(client, sid)["context_messages"])
