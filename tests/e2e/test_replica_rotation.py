"""A rotation on one replica and a deletion through another (docs/compression.md, rotate
mode; docs/operations.md "Several replicas"). Layer: runs rotation (runs/rotation.py) over
the log; contract: a deleted conversation leaves nothing behind. The finished run frees the
session in the database while its replica still asks the model for the handoff summary, so
another replica may delete the parent then: the rotation and the queue's next start find it
gone and stop there, quietly (they raised SessionNotFound, logged as a failed rotation and
as a worker task's exception nobody retrieved), and no child is left in anyone's list."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pg import database

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import new_session, running_server, start_turn, wait_until

pytestmark = pytest.mark.slow


def test_a_parent_deleted_through_another_replica_during_the_handoff_leaves_no_child(
    tmp_path: Path,
) -> None:
    with FakeOpenAI() as fake, database() as url:
        fake.context_length = 600
        args = ("--database-url", url, "--runtime", "openai", "--base-url", fake.base_url)
        args += ("--model", "fake-model", "--compression-mode", "rotate")
        crossing = reply(text("word " * 400), usage={"prompt_tokens": 20, "completion_tokens": 500})
        fake.script(crossing, reply(barrier("summary"), text("HANDOFF")))
        with (
            running_server(tmp_path / "a", *args) as a,
            running_server(tmp_path / "b", *args) as b,
            a.client() as on_a,
            b.client() as on_b,
        ):
            sid = new_session(on_a, "Secret plans")
            start_turn(on_a, sid, "one")
            assert fake.wait_reached("summary", 20)
            gone = on_b.delete("/api/session", params={"session_id": sid})
            assert gone.status_code == 200, gone.text
            fake.release("summary")
            wait_until(
                lambda: on_a.get("/api/health").json()["active_runs"] == 0,
                what="A's run unwinds, its rotation over",
            )
            time.sleep(1)  # the worker's last step (the queue's next start) is behind it
            for client in (on_a, on_b):
                listed = client.get("/api/sessions").json()["sessions"]
                assert listed == [], [(s["session_id"], s["title"]) for s in listed]
        # stopped: a worker task's exception nobody retrieved is logged by then at the latest
        assert "Traceback" not in a.log(), a.log()
