"""Layers: log, run registry, transcript, model context, sidebar. After kill -9 or a shutdown
mid-run, the run ends exactly once as interrupted; its turn and streamed output stay visible
and enter the next model context (invariant 1); recovery never moves `updated_at`
(invariant 4); the session is admissible at once."""

from __future__ import annotations

import pytest

from helpers import (
    ServerProcess,
    new_session,
    read_events,
    session_body,
    start_turn,
    wait_idle,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_a_run_cut_by_the_process_ending_is_interrupted_and_kept(
    demo_server: ServerProcess, how: str
) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "/slow survive this")
        read_events(client, sid, after="0", stop_on="tool.started")
        before = session_body(client, sid)
    if how == "kill -9":
        demo_server.kill()
    else:
        assert demo_server.stop() == 0
    demo_server.start()
    with demo_server.client() as client:
        body = session_body(client, sid)
        assert body["busy"] is False and body["live"] is None
        assert body["updated_at"] == before["updated_at"]  # recovery is maintenance
        assert body["last_message_at"] == before["last_message_at"]
        # The partial answer is a visible row, but not activity: the count the unread stores
        # compare stays where a client that saw the running turn acknowledged it.
        assert (before["message_count"], before["activity_count"]) == (1, 1)
        assert (body["message_count"], body["activity_count"]) == (2, 1)
        listed = {r["session_id"]: r for r in client.get("/api/sessions").json()["sessions"]}
        assert (listed[sid]["message_count"], listed[sid]["activity_count"]) == (2, 1)
        user, assistant = body["messages"]
        assert user["content"] == "/slow survive this"
        assert assistant["state"] == "interrupted"
        assert assistant["timeline"][-1]["type"] == "notice"
        live_ids = [i["id"] for i in before["live"]["timeline"]]
        assert [i["id"] for i in assistant["timeline"]][: len(live_ids)] == live_ids
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        assert context["context_messages"][0] == {"role": "user", "content": "/slow survive this"}
        assert "Interrupted" in str(context["context_messages"][1:])
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        assert [f.event for f in events].count("run.finished") == 1
        start_turn(client, sid, "and now?")
        after = wait_idle(client, sid)
        assert after["messages"][-1]["state"] == "completed"
        assert (after["message_count"], after["activity_count"]) == (4, 3)  # real activity
        truncated = client.post(
            "/api/session/truncate", json={"session_id": sid, "keep_count": 3}
        ).json()["session"]
        # After a shrink the count restarts at the baseline the stores acknowledge.
        assert truncated["activity_count"] == truncated["message_count"] == 3
        assert truncated["transcript_generation_baseline"] == 3
        start_turn(client, sid, "once more")
        assert wait_idle(client, sid)["activity_count"] == 5
    demo_server.restart()  # a second restart finds nothing left to recover
    with demo_server.client() as client:
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        assert [f.event for f in events].count("run.finished") == 3
