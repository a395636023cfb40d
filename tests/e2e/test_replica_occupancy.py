"""What a replica that does not run a session's run says of it (docs/api.md §3 `busy` and
`active_stream_id`, §4 409 `session_busy`; docs/operations.md "Several replicas"). Layer: the
sidebar projection and runs admission across replicas (contract invariant 9: `busy` counts a
run wherever it runs). Replica B learns of A's run only from the log: its rows, its status
and its stream's heartbeats say the session is busy, and it refuses to truncate or delete the
session under the run, as A would. Real `tether serve` processes on one real PostgreSQL
database; the model is the suite's fake OpenAI server, held at a barrier."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pg import database, private_server

from tether.events import Event
from tether.sessions.branching import edit_fork, regenerate_fork, switch_draft
from tether.sessions.folds import SessionFold

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import (
    ServerProcess,
    iter_sse,
    new_session,
    read_events,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow


def listed(client: httpx.Client, sid: str) -> dict:
    rows = client.get("/api/sessions").json()["sessions"]
    return next(row for row in rows if row["session_id"] == sid)


def refused_busy(response: httpx.Response, stream_id: str) -> bool:
    body = response.json()
    return response.status_code == 409 and body == {
        **body,
        "code": "session_busy",
        "active_stream_id": stream_id,
    }


def test_a_replica_shows_another_replicas_run_busy_and_refuses_to_change_it(
    tmp_path: Path,
) -> None:
    with FakeOpenAI() as fake, database() as url:
        args = ("--database-url", url, "--runtime", "openai", "--base-url", fake.base_url)
        args += ("--model", "fake-model", "--heartbeat-seconds", "1")
        fake.script(
            reply(text("First.")),
            reply(text("Second.")),  # the regenerated answer: a fork of two branches
            reply(text("Half"), barrier("hold"), text(" done.")),
        )
        with (
            running_server(tmp_path / "a", *args) as a,
            running_server(tmp_path / "b", *args) as b,
            a.client() as on_a,
            b.client() as on_b,
        ):
            sid = new_session(on_a, "Shared")
            start_turn(on_a, sid, "Start here")
            wait_idle(on_a, sid)
            again = on_a.post("/api/chat/regenerate", json={"session_id": sid})
            assert again.status_code == 200, again.text
            answer = wait_idle(on_a, sid)["messages"][-1]
            assert answer["branch"] == {"index": 2, "count": 2}
            stream = start_turn(on_a, sid, "Go on")["stream_id"]
            assert fake.wait_reached("hold", 10)
            wait_until(lambda: listed(on_b, sid)["busy"], what="B's row says busy")
            assert listed(on_b, sid)["active_stream_id"] == stream
            body = on_b.get("/api/session", params={"session_id": sid}).json()["session"]
            assert body["busy"] is True and body["active_stream_id"] == stream
            status = on_b.get("/api/session/status", params={"session_id": sid}).json()
            assert status["busy"] is True and status["phase"] == "running"
            beat = read_events(on_b, sid, stop_on="heartbeat", timeout=10)[-1].json
            assert beat["busy"] is True and beat["active_stream_id"] == stream

            cut = on_b.post("/api/session/truncate", json={"session_id": sid, "keep_count": 0})
            assert refused_busy(cut, stream), cut.text
            gone = on_b.delete("/api/session", params={"session_id": sid})
            assert refused_busy(gone, stream), gone.text
            switch = {"session_id": sid, "row_id": answer["id"], "index": 1}
            switched = on_b.post("/api/session/branch", json=switch)
            assert refused_busy(switched, stream), switched.text

            fake.release("hold")
            wait_idle(on_a, sid)
            wait_until(lambda: not listed(on_b, sid)["busy"], what="B's row says idle")
            assert listed(on_b, sid)["active_stream_id"] is None
            assert (
                on_b.get("/api/session/status", params={"session_id": sid}).json()["busy"] is False
            )
            switched = on_b.post("/api/session/branch", json=switch)
            assert switched.status_code == 200, switched.text
            cut = on_b.post("/api/session/truncate", json={"session_id": sid, "keep_count": 0})
            assert cut.status_code == 200, cut.text
            assert (
                on_b.get("/api/session", params={"session_id": sid}).json()["session"]["messages"]
                == []
            )


def test_heartbeats_go_on_while_the_database_is_away(tmp_path: Path) -> None:
    """Layer: the live stream (contract invariant 7: observation has a degraded path). A
    heartbeat says whether the session is busy, which on a shared log is read from the
    database; while the database is away each heartbeat falls back to this replica's own
    runs, at once, instead of ending the stream or going silent."""
    with (
        private_server(tmp_path) as db,
        running_server(tmp_path / "a", "--database-url", db.url) as a,
    ):
        with a.client() as on_a:
            sid = new_session(on_a, "Idle")
            with on_a.stream("GET", f"/api/sessions/{sid}/events", timeout=30) as response:
                frames = iter_sse(response)
                assert next(frames).event == "heartbeat"
                db.stop()
                began = time.monotonic()
                try:
                    beats = [next(frames) for _ in range(5)]  # 0.3 s apart (helpers.py)
                finally:
                    took = time.monotonic() - began
                    db.start()
        assert [f.event for f in beats] == ["heartbeat"] * 5
        assert took < 6  # none waits out the pool's 10 s for a connection
        assert {(f.json["busy"], f.json["active_stream_id"]) for f in beats} == {(False, None)}


def test_every_draft_that_changes_a_transcript_shown_asks_for_no_run(server: ServerProcess) -> None:
    """The database refuses an event with `needs_no_run` while another replica's run is
    unfinished (log/test_postgres_replicas.py): the truncate an edit or a regenerate starts
    with, and a branch switch, each ask for it, so a run admitted elsewhere between a
    replica's own check and its append still wins. Folded from a real session's events."""
    with server.client() as client:
        sid = new_session(client, "Forked")
        start_turn(client, sid, "hello")
        wait_idle(client, sid)
        assert client.post("/api/chat/regenerate", json={"session_id": sid}).status_code == 200
        shown = wait_idle(client, sid)["messages"]
        fold = SessionFold()
        for frame in read_events(
            client, sid, after="0", until_seq=session_body(client, sid)["last_seq"]
        ):
            envelope = frame.json
            fold.apply(
                Event(
                    envelope["session_id"],
                    envelope["seq"],
                    envelope["type"],
                    envelope["at"],
                    envelope["data"],
                    envelope.get("stream_id"),
                    envelope.get("turn_id"),
                )
            )
    user, answer = shown[-2], shown[-1]
    switched = switch_draft(fold, answer["id"], 1)
    assert switched is not None and switched.needs_no_run
    before_edit, _ = edit_fork(fold, user["id"], None)
    before_regenerate, _, _ = regenerate_fork(fold, answer["id"])
    assert before_edit and all(d.needs_no_run for d in before_edit)
    assert before_regenerate and all(d.needs_no_run for d in before_regenerate)
