"""What a replica that does not run a session's run says of it (docs/api.md §3 `busy` and
`active_stream_id`, §4 409 `session_busy`; docs/operations.md "Several replicas"). Layer: the
sidebar projection and runs admission across replicas (contract invariant 9: `busy` counts a
run wherever it runs). Replica B learns of A's run only from the log: its rows, its status
and its stream's heartbeats say the session is busy, and it refuses to truncate or delete the
session under the run, as A would. Real `tether serve` processes on one real PostgreSQL
database; the model is the suite's fake OpenAI server, held at a barrier."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pg import database

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import new_session, read_events, running_server, start_turn, wait_idle, wait_until

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
        fake.script(reply(text("Half"), barrier("hold"), text(" done.")), reply(text("Next.")))
        with (
            running_server(tmp_path / "a", *args) as a,
            running_server(tmp_path / "b", *args) as b,
            a.client() as on_a,
            b.client() as on_b,
        ):
            sid = new_session(on_a, "Shared")
            stream = start_turn(on_a, sid, "Start here")["stream_id"]
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

            fake.release("hold")
            wait_idle(on_a, sid)
            wait_until(lambda: not listed(on_b, sid)["busy"], what="B's row says idle")
            assert listed(on_b, sid)["active_stream_id"] is None
            assert (
                on_b.get("/api/session/status", params={"session_id": sid}).json()["busy"] is False
            )
            cut = on_b.post("/api/session/truncate", json={"session_id": sid, "keep_count": 0})
            assert cut.status_code == 200, cut.text
            assert (
                on_b.get("/api/session", params={"session_id": sid}).json()["session"]["messages"]
                == []
            )
