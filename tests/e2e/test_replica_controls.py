"""Steer, approval answers and the queue through a replica that does not run the stream
(docs/api.md §14, docs/operations.md "Several replicas"). Layer: runs controls across
replicas (runs/controls.py) over the log (contract invariant 8: the log is the only source;
a control sent through another replica is a durable event the owner hears through the log's
wake-up). Real `tether serve` processes on one real PostgreSQL database; the model is the
suite's fake OpenAI server, or the demo runtime's `/approve` prompt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from pg import database

from fake_openai import FakeOpenAI, barrier, reply, text, tool_call
from helpers import (
    live_timeline,
    new_session,
    read_events,
    replicas,
    run_events,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow
DEMO = {"TETHER_DEMO_DELAY": "0.03"}
SLOW = {"TETHER_DEMO_DELAY": "0.1"}  # a `/slow` run streams a piece a second, for minutes


def test_a_steer_through_another_replica_reaches_the_model_of_the_run(tmp_path: Path) -> None:
    """B does not run the stream: its `steer.accepted` is in the log when B answers, A hears
    it, and the model's next request carries it, delivered once."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with FakeOpenAI() as fake, database() as url:
        args = ("--database-url", url, "--runtime", "openai", "--base-url", fake.base_url)
        args += ("--model", "fake-model", "--workspace", str(workspace))
        fake.script(
            reply(
                text("Looking."),
                barrier("before-tool"),
                tool_call("call_1", "list_files", {"path": "."}),
            ),
            reply(text("Done, and budget noted.")),
        )
        with (
            running_server(tmp_path / "a", *args) as a,
            running_server(tmp_path / "b", *args) as b,
            a.client() as on_a,
            b.client() as on_b,
        ):
            sid = new_session(on_a)
            run = start_turn(on_a, sid, "Check the files")
            assert fake.wait_reached("before-tool", 10)
            steered = on_b.post(
                "/api/chat/steer", json={"stream_id": run["stream_id"], "text": "mind the budget"}
            ).json()
            assert steered["accepted"] is True, steered
            # A has published it (and so heard it) before the model takes its next step.
            read_events(on_a, sid, after="0", stop_on="steer.accepted", timeout=10)
            fake.release("before-tool")
            body = wait_idle(on_a, sid)
            assert body["messages"][-1]["state"] == "completed"
            second = fake.requests[1]["messages"]
            assert second[-1] == {"role": "user", "content": "mind the budget"}
            frames = run_events(on_b, sid, run["stream_id"], timeout=30)
            types = [f.event for f in frames]
            assert types.count("steer.accepted") == types.count("steer.delivered") == 1
            assert "steer.leftover" not in types
            delivered = next(f for f in frames if f.event == "steer.delivered")
            assert delivered.json["data"]["steer_ids"] == [steered["steer_id"]]
            # A run that is not running takes no steer, through any replica.
            late = on_b.post("/api/chat/steer", json={"stream_id": run["stream_id"], "text": "x"})
            assert late.json()["accepted"] is False


def _asked(client: httpx.Client, sid: str) -> None:
    wait_until(
        lambda: any(i["type"] == "approval" for i in live_timeline(client, sid)),
        timeout=20,
        what="the approval prompt",
    )


def _approve(client: httpx.Client, stream: str, choice: str) -> httpx.Response:
    body = {"stream_id": stream, "approval_id": "ap1", "choice": choice}
    return client.post("/api/chat/approve", json=body)


def _approval(client: httpx.Client, sid: str) -> dict:
    row = wait_idle(client, sid)["messages"][-1]
    assert row["state"] == "completed"
    return next(i for i in row["timeline"] if i["type"] == "approval")


def test_an_approval_answered_through_another_replica_resolves_on_the_owner_once(
    tmp_path: Path,
) -> None:
    """The prompt of A's run answered through B resolves on A (`approval.resolved` reason
    `user`); a choice the prompt does not offer is refused on B as on A, writing nothing;
    answers sent at once through B, C and A itself: exactly one is accepted, and one
    `approval.answered` is in the log (the counter row records one per prompt)."""
    with (
        database() as url,
        replicas(tmp_path, url, DEMO, DEMO, DEMO) as [(_, on_a), (_, on_b), (_, on_c)],
    ):
        sid = new_session(on_a)
        first = start_turn(on_a, sid, "/approve")["stream_id"]
        _asked(on_b, sid)
        offered = _approve(on_b, first, "always")  # the demo offers once and deny
        assert offered.status_code == 400 and offered.json()["code"] == "invalid_request"
        assert _approve(on_b, "r_unknown", "once").json()["accepted"] is False
        answer = _approve(on_b, first, "once")
        assert answer.status_code == 200 and answer.json()["accepted"] is True
        approval = _approval(on_a, sid)
        assert (approval["choice"], approval["reason"]) == ("once", "user")
        assert _approve(on_c, first, "deny").json()["accepted"] is False  # the run is over
        frames = run_events(on_c, sid, first, timeout=30)
        types = [f.event for f in frames]
        assert types.count("approval.answered") == types.count("approval.resolved") == 1
        tool = next(f for f in frames if f.event == "tool.completed")
        assert tool.json["data"]["is_error"] is False  # allowed: what the agent got

        second = start_turn(on_b, sid, "/approve")["stream_id"]  # B runs this one
        _asked(on_a, sid)
        answerers = [(on_a, "deny"), (on_b, "deny"), (on_c, "once"), (on_a, "once")]
        with ThreadPoolExecutor(len(answerers)) as pool:
            answers = list(
                pool.map(lambda pair: _approve(pair[0], second, pair[1]).json(), answerers)
            )
        accepted = [
            choice for (_, choice), x in zip(answerers, answers, strict=True) if x["accepted"]
        ]
        assert len(accepted) == 1, answers
        approval = _approval(on_c, sid)
        assert (approval["choice"], approval["reason"]) == (accepted[0], "user")
        frames = run_events(on_a, sid, second, timeout=30)
        mine = [f.event for f in frames if f.json.get("stream_id") == second]
        assert mine.count("approval.answered") == mine.count("approval.resolved") == 1


def test_a_message_queued_behind_a_killed_replicas_run_stays_queued_and_starts_elsewhere(
    tmp_path: Path,
) -> None:
    """`kill -9` of the replica running the session's run, with a message queued through
    another: the survivor records the run `interrupted` (within 30 s), the message is still
    queued (an interrupted run does not start the queue), and sent through a third replica
    it becomes a turn that completes."""
    with (
        database() as url,
        replicas(tmp_path, url, SLOW, SLOW, DEMO) as [(a, on_a), (_, on_b), (_, on_c)],
    ):
        sid = new_session(on_a)
        stream = start_turn(on_a, sid, "/slow a long answer")["stream_id"]
        queued = on_b.post("/api/chat/queue", json={"session_id": sid, "message": "after it"})
        assert queued.status_code == 200 and queued.json()["started"] is None, queued.text
        queue_id = queued.json()["queue_id"]
        read_events(on_b, sid, after="0", stop_on="reasoning.delta", timeout=30)
        a.kill()
        frames = read_events(on_b, sid, after="0", stop_on="run.finished", timeout=30)
        assert frames[-1].event == "run.finished", [f.event for f in frames][-5:]
        assert frames[-1].json["stream_id"] == stream
        assert frames[-1].json["data"]["state"] == "interrupted"
        body = session_body(on_c, sid)
        assert [q["queue_id"] for q in body["queued"]] == [queue_id]
        assert [q["text"] for q in body["queued"]] == ["after it"]
        started = on_c.post("/api/chat/queue/start", json={"queue_id": queue_id})
        assert started.status_code == 200, started.text
        done = run_events(on_b, sid, started.json()["stream_id"], timeout=60)
        assert done[-1].json["data"]["state"] == "completed"
        body = session_body(on_b, sid)
        assert body["queued"] == []
        assert [m["content"] for m in body["messages"] if m["role"] == "user"][-1] == "after it"


def test_a_replica_unwinding_a_stubborn_run_shows_and_stops_another_replicas_next_run(
    tmp_path: Path,
) -> None:
    """B's run ignores its Stop (its worker unwinds for 12 s) while its `run.finished`
    frees the session in the log, and A runs the next turn there. B shows A's run as the
    one to attach to (status and sidebar row), not its own leftover, and a Stop through B
    by `session_id` stops A's run (one `cancelled: true`). Layer: the run registry and the
    log's open run (sessions/service.py occupancy, runs/controls.py); contract invariant 9:
    `busy` stays true, `attachable_stream` is the run a browser can follow."""
    with database() as url, replicas(tmp_path, url, DEMO, SLOW) as [(_, on_a), (_, on_b)]:
        sid = new_session(on_b)
        first = start_turn(on_b, sid, "/stubborn 12")["stream_id"]
        read_events(on_b, sid, after="0", stop_on="reasoning.delta", timeout=30)
        assert on_b.post("/api/chat/cancel", json={"stream_id": first}).json()["cancelled"]

        def status(client: httpx.Client) -> dict:
            return client.get("/api/session/status", params={"session_id": sid}).json()

        wait_until(lambda: not status(on_a)["busy"], what="the log frees the session")
        second = start_turn(on_a, sid, "/slow a long answer")["stream_id"]
        seen = wait_until(
            lambda: (s := status(on_b))["active_stream_id"] == second and s,
            what="B offers A's run to attach to",
        )
        assert (seen["busy"], seen["phase"]) == (True, "running"), seen
        row = next(
            s for s in on_b.get("/api/sessions").json()["sessions"] if s["session_id"] == sid
        )
        assert (row["busy"], row["active_stream_id"]) == (True, second)
        stopped = on_b.post("/api/chat/cancel", json={"session_id": sid}).json()
        assert stopped == {"ok": True, "cancelled": True, "stream_id": second}
        frames = run_events(on_a, sid, second, timeout=30)
        assert frames[-1].json["data"]["state"] == "cancelled"
