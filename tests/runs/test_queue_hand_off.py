"""The moment between a run's end and the automatic start of the message queued behind it
(docs/api.md §4): two real `tether serve` replicas on one PostgreSQL database, the fake
OpenAI-compatible server at the model boundary.

Layers: the queue's automatic start (`runs/engine.py` `start_next`) and the transcript
projection it reads (`TranscriptFold.held`). Contract invariant 1: what the user sees is what
the model gets. While a run holds the session nothing can hide a row (a branch switch, an
edit, a truncate are 409 `session_busy`), but once its `run.finished` is written another
replica sees the session idle, while the replica that ran it still hands over to the queued
message (here slowly: it summarizes for a rotation first). A branch switch there used to
send the queued message after a branch its sender never saw."""

from __future__ import annotations

from pathlib import Path

import pytest
from pg import database
from runs.branch_kit import contents, said, switch, two_branches

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import running_server, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow


def test_a_queued_message_waits_when_another_replica_switches_branch_as_its_run_ends(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """Layer: the queue's automatic start across replicas; contract invariant 1. Tab A shows
    branch 1 and queues "later" behind its running turn; the turn ends, crossing the rotation
    threshold, and while replica A summarizes, a tab on replica B switches to branch 2.
    "later" is not sent after branch 2 on its own: it stays queued and waits for the user,
    as after a Stop; "Send now" from the view now shown sends it against exactly that view."""
    model = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
    rotating = ("--compression-mode", "rotate", "--context-window", "1000")
    with (
        database() as url,
        running_server(tmp_path / "a", "--database-url", url, *model, *rotating) as a,
        running_server(tmp_path / "b", "--database-url", url, *model, *rotating) as b,
        a.client() as on_a,
        b.client() as on_b,
    ):
        sid, seen = two_branches(on_a, fake)
        fake.script(
            reply(barrier("answer"), text("A3"), usage={"prompt_tokens": 900}),
            reply(barrier("summary"), text("handoff")),
        )
        start_turn(on_a, sid, "three", after_seq=seen["last_seq"])
        assert fake.wait_reached("answer")
        queued = on_a.post("/api/chat/queue", json={"session_id": sid, "message": "later"})
        assert queued.status_code == 200 and queued.json()["started"] is None, queued.text
        queue_id = queued.json()["queue_id"]
        fake.release("answer")
        assert fake.wait_reached("summary", timeout=10)  # A's run ended; A is not done yet

        assert switch(on_b, sid, seen["messages"][2]["id"], 2).status_code == 200
        asked = fake.requests_count
        fake.release("summary")
        now = wait_idle(on_a, sid)
        assert fake.requests_count == asked  # "later" was not sent
        assert [q["queue_id"] for q in now["queued"]] == [queue_id]
        assert [c for r, c in contents(now) if r == "user"] == ["one", "two, edited"]

        fake.script(reply(text("L1")))
        sent = on_b.post(
            "/api/chat/queue/start", json={"queue_id": queue_id, "after_seq": now["last_seq"]}
        )
        assert sent.status_code == 200, sent.text
        body = wait_idle(on_b, sid)
        assert said(fake.requests[-1]["messages"]) == [*contents(now), ("user", "later")]
        assert body["queued"] == [] and contents(body)[-2:] == [
            ("user", "later"),
            ("assistant", "L1"),
        ]
        assert session_body(on_a, sid)["last_seq"] == body["last_seq"]
