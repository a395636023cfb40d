"""Layers: worker lifecycle registry and run journal (contract "Agent registration after
cancellation", invariant 9), against a real server subprocess.

A runtime that ignores interrupt: the demo's `/stubborn N` swallows the cancellation and keeps
producing output for N seconds, as an agent stuck in a tool would. What must hold:

- Stop ends the turn at once: one `run.finished {state: cancelled}`, the text shown before
  the Stop kept;
- while the worker has not let go, the session is busy but not attachable (phase
  `cancelling`, no `active_stream_id`), and a new turn gets 409 `session_busy`;
- after `--cancel-reclaim-seconds` the run is reclaimed and a successor is admitted;
- the old worker's late output never reaches the log: nothing of its stream follows its
  `run.finished`, and the successor's stream holds none of it.

It runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tether.cli import LET_GO_SECONDS
from tether.runs.maintenance import SHUTDOWN_GRACE_SECONDS

from faultkit import (
    assert_each_run_ends_once,
    assert_log_intact,
    live_text,
    whole_log,
)
from helpers import (
    ServerProcess,
    new_session,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow

RECLAIM_SECONDS = 3.0  # wide enough that a loaded machine still sees Stop end the turn first
STUBBORN_SECONDS = 8


def _status(client, session_id: str) -> dict:
    response = client.get("/api/session/status", params={"session_id": session_id})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_runtime_that_ignores_stop_is_reclaimed_and_fenced(
    tmp_path: Path, store_flags: list[str]
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        "--runtime",
        "demo",
        "--cancel-reclaim-seconds",
        str(RECLAIM_SECONDS),
        *store_flags,
    ).start()
    try:
        with server.client() as client:
            sid = new_session(client)
            other = new_session(client)
            first = start_turn(client, sid, f"/stubborn {STUBBORN_SECONDS}")
            wait_until(
                lambda: "still working" in live_text(client, sid),
                what="the stubborn turn's first output",
            )

            stopped_at = time.monotonic()
            response = client.post("/api/chat/cancel", json={"stream_id": first["stream_id"]})
            assert response.status_code == 200, response.text
            ended = wait_until(
                lambda: [
                    m for m in session_body(client, sid)["messages"] if m["role"] == "assistant"
                ],
                timeout=5,
                what="the cancelled turn's assistant row",
            )
            assert time.monotonic() - stopped_at < RECLAIM_SECONDS  # before any reclaim
            assert "still working" in ended[-1]["content"]  # what was shown is kept

            status = _status(client, sid)
            assert status == {
                **status,
                "busy": True,
                "active_stream_id": None,
                "phase": "cancelling",
            }
            refused = client.post("/api/chat/start", json={"session_id": sid, "message": "x"})
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "session_busy"
            start_turn(client, other, "elsewhere all is well")  # one wedged run blocks no other
            wait_idle(client, other)

            wait_until(
                lambda: not _status(client, sid)["busy"],
                timeout=RECLAIM_SECONDS + 5,
                what="the reclaim",
            )
            assert time.monotonic() - stopped_at >= RECLAIM_SECONDS
            second = start_turn(client, sid, "and now a normal turn")
            wait_idle(client, sid)
            time.sleep(1.0)  # the old worker is still producing into the void

            log = whole_log(client, sid)
            assert_log_intact(log)
            endings = assert_each_run_ends_once(log)
            assert endings[first["stream_id"]]["state"] == "cancelled"
            assert endings[second["stream_id"]]["state"] == "completed"
            first_end = next(
                e["seq"]
                for e in log
                if e["type"] == "run.finished" and e["envelope"]["stream_id"] == first["stream_id"]
            )
            late = [
                e
                for e in log
                if e["seq"] > first_end and "still working" in str(e["envelope"]["data"])
            ]
            assert late == []
            assert "still working" not in session_body(client, sid)["messages"][-1]["content"]
    finally:
        assert server.stop() == 0


def test_sigterm_exits_within_the_grace_though_a_runtime_ignores_cancellation(
    tmp_path: Path, store_flags: list[str]
) -> None:
    """Layers: shutdown (runs/maintenance.py) and the process (cli.py); contract invariant 9.
    SIGTERM while a worker swallows every cancellation (`/stubborn 40`): the run is recorded
    interrupted, then the process exits 0 within the shutdown's grace, not when the worker
    gives up 40 s later (systemd's TimeoutStopSec=30 would SIGKILL it first). After a
    restart the run shows interrupted, once."""
    server = ServerProcess(tmp_path / "data", "--runtime", "demo", *store_flags).start()
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "/stubborn 40")
        wait_until(
            lambda: "still working" in live_text(client, sid),
            what="the stubborn turn's first output",
        )
    asked = time.monotonic()
    assert server.stop(timeout=40) == 0
    took = time.monotonic() - asked
    assert took < SHUTDOWN_GRACE_SECONDS + LET_GO_SECONDS + 3, f"SIGTERM took {took:.1f} s to exit"
    server.start()
    try:
        with server.client() as client:
            log = whole_log(client, sid)
            assert_log_intact(log)
            endings = assert_each_run_ends_once(log)
            assert endings[run["stream_id"]]["state"] == "interrupted"
            assert session_body(client, sid)["messages"][-1]["state"] == "interrupted"
    finally:
        assert server.stop() == 0
