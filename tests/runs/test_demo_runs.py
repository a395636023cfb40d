"""Layers: run registry, log, transcript, live scene and SSE, driven through the demo runtime
over real HTTP. Invariants 2 (the turn stays before its output), 3/5 (reattach and replay give
the same rows, each once), 9 (busy vs attachable) and 1 (the turn enters the model context)."""

from __future__ import annotations

import random
import threading
import time

from helpers import (
    ServerProcess,
    fold_frames,
    iter_sse,
    new_session,
    read_events,
    run_events,
    session_body,
    start_turn,
    wait_idle,
)


def test_demo_turn_end_to_end(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        assert client.get("/api/health").json()["runtime"] == "demo"
        sid = new_session(client)
        before = session_body(client, sid)["updated_at"]
        started = start_turn(client, sid, "Plan my week\nwith details")
        body = session_body(client, sid)  # the turn is durable and visible at once
        assert body["messages"][0]["content"] == "Plan my week\nwith details"
        assert body["title"] == "Plan my week"
        frames = run_events(client, sid, started["stream_id"])
        types = [f.event for f in frames]
        assert types[:3] == ["session.created", "turn.submitted", "run.started"]
        assert frames[2].json["data"]["runtime"] == "demo"
        assert {"reasoning.delta", "text.delta", "tool.started", "tool.completed"} <= set(types)
        finished = frames[-1].json["data"]
        assert finished["state"] == "completed"
        body = wait_idle(client, sid)
        assert fold_frames(frames)["messages"] == body["messages"]
        user, assistant = body["messages"]
        assert assistant["role"] == "assistant" and assistant["state"] == "completed"
        assert "offline demo runtime" in assistant["content"]
        kinds = [item["type"] for item in assistant["timeline"]]
        assert kinds == ["reasoning", "text", "tool", "tool", "reasoning", "text"]
        assert assistant["timeline"][1]["interim"] is True  # progress stays visible
        assert assistant["timeline"][-1]["interim"] is False
        assert body["updated_at"] > before and body["message_count"] == 2
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        roles = [m["role"] for m in context["context_messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant" and "tool" in roles
        assert context["excluded"] == []


def test_second_start_while_running_is_busy_then_admitted(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        first = start_turn(client, sid, "/slow first")
        busy = client.post("/api/chat/start", json={"session_id": sid, "message": "second"})
        assert busy.status_code == 409
        assert busy.json()["code"] == "session_busy"
        assert busy.json()["active_stream_id"] == first["stream_id"]
        status = client.get("/api/session/status", params={"session_id": sid}).json()
        assert status["busy"] is True and status["active_stream_id"] == first["stream_id"]
        assert status["phase"] in ("starting", "running")  # admitted, not cancelling
        health = client.get("/api/health").json()
        assert health["active_runs"] == 1 and health["attachable_runs"] == 1
        truncate = client.post("/api/session/truncate", json={"session_id": sid, "keep_count": 0})
        assert truncate.status_code == 409 and truncate.json()["code"] == "session_busy"
        client.post("/api/chat/cancel", json={"stream_id": first["stream_id"]})
        wait_idle(client, sid)
        start_turn(client, sid, "second")
        body = wait_idle(client, sid)
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant"]


def test_stop_keeps_partial_output_visible_and_in_context(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow tell me things")
        frames = read_events(client, sid, after="0", stop_on="tool.started")
        assert frames[-1].event == "tool.started"
        stop = client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()
        assert stop == {"ok": True, "cancelled": True, "stream_id": run["stream_id"]}
        body = wait_idle(client, sid)
        assistant = body["messages"][-1]
        assert assistant["state"] == "cancelled"
        kinds = [item["type"] for item in assistant["timeline"]]
        assert kinds[:3] == ["reasoning", "text", "tool"] and kinds[-1] == "notice"
        assert assistant["timeline"][-1]["kind"] == "cancelled"
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        text = str(context["context_messages"])
        assert "Let me look at your message" in text  # partial output reaches the model
        assert "tool_call_id" in text  # the unfinished tool call is answered, not dropped
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        finished = [f for f in events if f.event == "run.finished"]
        assert len(finished) == 1 and finished[0].json["data"]["state"] == "cancelled"
        assert [f.event for f in events].count("run.cancel_requested") == 1


def test_stop_after_completion_and_unknown_stop_change_nothing(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "quick")
        wait_idle(client, sid)
        last_seq = session_body(client, sid)["last_seq"]
        again = client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()
        assert again["cancelled"] is False
        assert (
            client.post("/api/chat/cancel", json={"session_id": sid}).json()["cancelled"] is False
        )
        assert client.post("/api/chat/cancel", json={"stream_id": "r_unknown"}).json() == {
            "ok": True,
            "cancelled": False,
            "stream_id": "r_unknown",
        }
        missing = client.post("/api/chat/cancel", json={})
        assert missing.status_code == 400 and missing.json()["code"] == "invalid_request"
        assert session_body(client, sid)["last_seq"] == last_seq
        assert session_body(client, sid)["messages"][-1]["state"] == "completed"


def test_two_concurrent_stops_cancel_once(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow please")
        read_events(client, sid, after="0", stop_on="reasoning.delta")
        results: list[dict] = []
        barrier = threading.Barrier(2)

        def stop() -> None:
            with demo_server.client() as own:
                barrier.wait()
                results.append(
                    own.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()
                )

        threads = [threading.Thread(target=stop) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r["cancelled"] for r in results) == [False, True]
        wait_idle(client, sid)
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        assert [f.event for f in events].count("run.finished") == 1
        assert [f.event for f in events].count("run.cancel_requested") == 1


def test_stop_racing_completion_ends_each_run_exactly_once(demo_server: ServerProcess) -> None:
    """Swept over delays: whoever wins, one run.finished, and its state agrees with Stop."""
    with demo_server.client() as client:
        sid = new_session(client)
        for delay_ms in [0, 1, 2, 5, 10, 20, 40, 80, 120, 160, 200, 260, 320, 400, 600]:
            run = start_turn(client, sid, f"race {delay_ms}")
            time.sleep(delay_ms / 1000)
            stop = client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()
            body = wait_idle(client, sid)
            row = body["messages"][-1]
            assert row["stream_id"] == run["stream_id"]
            assert row["state"] == ("cancelled" if stop["cancelled"] else "completed"), delay_ms
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        finished = [f.json["stream_id"] for f in events if f.event == "run.finished"]
        assert len(finished) == len(set(finished)) == 15
        body = session_body(client, sid)
        assert body["message_count"] == 30 == len(body["messages"])


def test_two_subscribers_receive_identical_sequences(demo_server: ServerProcess) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        results: list[list] = [[], []]

        def follow(out: list) -> None:
            with (
                demo_server.client() as own,
                own.stream("GET", f"/api/sessions/{sid}/events", params={"after": "0"}) as response,
            ):
                for frame in iter_sse(response):
                    if frame.get("id"):
                        out.append((frame["id"], frame.event, frame["data"]))
                    if frame.event == "run.finished":
                        return

        threads = [threading.Thread(target=follow, args=(out,)) for out in results]
        for t in threads:
            t.start()
        time.sleep(0.2)
        start_turn(client, sid, "hello both")
        for t in threads:
            t.join(20)
        assert results[0] == results[1] and len(results[0]) > 10


def test_sse_cut_at_random_frames_then_resumed_folds_the_same(demo_server: ServerProcess) -> None:
    """Reconnect with Last-Event-ID after random cuts: the client's projection equals that of
    a client that never disconnected (and the server's own)."""
    rng = random.Random(7)
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow a long answer please")
        received: list = []
        cursor = "0"
        done = False
        while not done:
            budget = rng.randint(1, 25)
            headers = {"Last-Event-ID": cursor}
            with client.stream("GET", f"/api/sessions/{sid}/events", headers=headers) as response:
                for frame in iter_sse(response):
                    if not frame.get("id"):
                        continue
                    assert int(frame["id"]) == int(cursor) + 1  # no gap, no repeat
                    received.append(frame)
                    cursor = frame["id"]
                    if frame.event == "run.finished":
                        done = True
                        break
                    budget -= 1
                    if budget == 0:
                        break  # drop the connection mid-stream
        reference = run_events(client, sid, run["stream_id"])
        assert fold_frames(received) == fold_frames(reference)
        assert fold_frames(received)["messages"] == wait_idle(client, sid)["messages"]


def test_reload_mid_run_shows_the_turn_before_its_live_output(demo_server: ServerProcess) -> None:
    """Invariant 2: a fresh GET during a run has the user turn, the pending fields and the live
    scene; the live timeline is a prefix of the settled one."""
    with demo_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/slow show me")
        read_events(client, sid, after="0", stop_on="tool.started")
        body = session_body(client, sid)
        assert body["messages"][-1]["role"] == "user"
        assert body["pending_user_message"] == "/slow show me"
        assert body["pending_started_at"] == run["pending_started_at"]
        assert body["live"]["stream_id"] == run["stream_id"]
        assert body["live"]["phase"] == "running" and body["active_stream_id"] == run["stream_id"]
        live_ids = [item["id"] for item in body["live"]["timeline"]]
        settled = wait_idle(client, sid)["messages"][-1]
        assert [item["id"] for item in settled["timeline"]][: len(live_ids)] == live_ids
