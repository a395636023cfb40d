"""Several `tether serve` processes on one PostgreSQL database, and the one-process rule of
the embedded SQLite default (docs/api.md §1, docs/operations.md). Layer: the log and the
event stream; contract "run-journal sequence publication" across processes: a run started on
one replica is followed live on another, a second run is refused by any replica while one is
unfinished (admission in the database), and a follower that reconnects with Last-Event-ID
(to either replica) gets every event after its cursor, none missing, none twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from pg import database

from accounts_kit import PASSWORDS, sign_in, tether_users
from helpers import (
    SSEFrame,
    free_port,
    new_session,
    read_events,
    replicas,
    run_events,
    running_server,
    seqs,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow
DEMO = {"TETHER_DEMO_DELAY": "0.03"}


def test_a_run_started_on_one_replica_is_followed_on_another_without_gap_or_duplicate(
    tmp_path: Path,
) -> None:
    with (
        database() as url,
        running_server(tmp_path / "a", "--database-url", url, env=DEMO) as a,
        running_server(tmp_path / "b", env={**DEMO, "TETHER_DATABASE_URL": url}) as b,
        a.client() as on_a,
        b.client() as on_b,
    ):
        health = [on_a.get("/api/health").json(), on_b.get("/api/health").json()]
        assert [h["storage"] for h in health] == ["postgresql", "postgresql"]
        assert health[0]["replica_id"] != health[1]["replica_id"]

        sid = new_session(on_a, "across replicas")
        assert on_b.get("/api/session", params={"session_id": sid}).status_code == 200
        started = start_turn(on_a, sid, "count these words please")
        # Admission is the database's: B refuses a second run while A's is unfinished.
        busy = on_b.post("/api/chat/start", json={"session_id": sid, "message": "me too"})
        assert busy.status_code == 409, busy.text
        assert busy.json()["code"] == "session_busy"
        assert busy.json()["active_stream_id"] == started["stream_id"]
        # B follows live from the start, and drops the connection mid-run ...
        first = read_events(on_b, sid, after="0", until_seq=8, timeout=20)
        cursor = seqs(first)[-1]
        assert seqs(first) == list(range(1, cursor + 1))
        # ... and resumes with Last-Event-ID, on B and (to show any replica will do) on A.
        rest_b = read_events(
            on_b, sid, headers={"Last-Event-ID": str(cursor)}, stop_on="run.finished", timeout=60
        )
        rest_a = read_events(
            on_a, sid, headers={"Last-Event-ID": str(cursor)}, stop_on="run.finished", timeout=60
        )
        assert rest_b[-1].event == "run.finished"
        assert rest_b[-1].json["stream_id"] == started["stream_id"]
        assert seqs(rest_b) == seqs(rest_a)
        whole = seqs(first) + seqs(rest_b)
        assert whole == list(range(1, whole[-1] + 1))  # no gap, no duplicate
        logged = seqs(read_events(on_a, sid, after="0", until_seq=whole[-1]))
        assert logged == whole
        # The sidebar of B shows the session A wrote (the index lives in the database).
        listed = wait_until(
            lambda: [
                s for s in on_b.get("/api/sessions").json()["sessions"] if s["session_id"] == sid
            ],
            what="the session in B's list",
        )
        assert listed[0]["title"] == "across replicas"
        # Once A's run finished, B admits the next turn (and B runs it).
        again = start_turn(on_b, sid, "and now from B")
        done = read_events(on_a, sid, after=str(whole[-1]), stop_on="run.finished", timeout=60)
        assert done[-1].json["stream_id"] == again["stream_id"]


def test_stop_through_any_replica_reaches_the_run_and_counts_once(tmp_path: Path) -> None:
    """Layer: runs Stop across replicas (contract: exactly one `cancelled: true`, one
    `run.cancel_requested`, one `run.finished{cancelled}`): Stops sent at once through A (the
    owner) and B; then a run stopped only through B, whose owner hears it through the log."""
    with database() as url, replicas(tmp_path, url, DEMO, DEMO) as [(_, on_a), (_, on_b)]:
        sid = new_session(on_a)
        cursor = 0
        for stoppers in ([on_a, on_b, on_b, on_a], [on_b]):
            started = start_turn(on_a, sid, "/slow a long answer to stop")
            stream = started["stream_id"]
            read_events(on_b, sid, after=str(cursor), stop_on="reasoning.delta", timeout=30)
            body = {"stream_id": stream}
            with ThreadPoolExecutor(len(stoppers)) as pool:
                answers = list(
                    pool.map(lambda c, b=body: c.post("/api/chat/cancel", json=b).json(), stoppers)
                )
            assert [x["cancelled"] for x in answers].count(True) == 1, answers
            frames = run_events(on_b, sid, stream, timeout=30)
            cursor = seqs(frames)[-1]
            mine = [f for f in frames if f.json.get("stream_id") == stream]
            assert mine[-1].event == "run.finished"
            assert mine[-1].json["data"]["state"] == "cancelled"
            assert [f.event for f in mine].count("run.cancel_requested") == 1
            wait_until(
                lambda: (
                    on_a.get("/api/session/status", params={"session_id": sid}).json()["busy"]
                    is False
                ),
                timeout=20,
                what="A frees the session",
            )


def test_a_second_server_on_the_same_sqlite_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_server(data) as first, first.client() as client:
        health = client.get("/api/health").json()
        assert health["storage"] == "sqlite" and health["replica_id"].startswith("replica_")
        sid = new_session(client)
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "tether",
                "serve",
                "--data-dir",
                str(data),
                "--no-browser",
                "--port",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert str(data) in second.stderr
        assert "Another Tether server" in second.stderr
        assert f"process {first.proc.pid}" in second.stderr  # type: ignore[union-attr]
        # the first one never noticed
        assert client.get("/api/session", params={"session_id": sid}).status_code == 200
    with running_server(data) as again, again.client() as client:  # free once it stopped
        assert client.get("/api/session", params={"session_id": sid}).status_code == 200


def serve_fails(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--data-dir", str(tmp_path / "d"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TETHER_NO_BROWSER": "1"},
    )


def test_a_database_url_that_is_not_postgresql_or_cannot_be_reached_is_refused_clearly(
    tmp_path: Path,
) -> None:
    wrong = serve_fails(tmp_path, "--database-url", "mysql://root@127.0.0.1/x")
    assert wrong.returncode == 2 and "give a postgresql:// URL" in wrong.stderr
    with database() as url:
        missing = url.rsplit("/", 1)[0] + "/tether_no_such_database"
        away = serve_fails(tmp_path, "--database-url", missing, "--port", str(free_port()))
    assert away.returncode == 1
    assert "Cannot open the Tether database" in away.stderr
    assert "tether_no_such_database" in away.stderr


SLOW = {"TETHER_DEMO_DELAY": "0.1"}  # a `/slow` run streams a piece a second, for minutes


def interrupted_on(client: httpx.Client, sid: str, stream: str, after: int) -> SSEFrame:
    """The run.finished of `stream`, read through `client` (waits up to 30 s)."""
    frames = read_events(client, sid, after=str(after), stop_on="run.finished", timeout=30)
    mine = [f for f in frames if f.event == "run.finished"]
    assert mine, f"no run.finished within 30 s: {[f.event for f in frames][-5:]}"
    assert mine[-1].json["stream_id"] == stream
    return mine[-1]


def test_a_killed_replicas_run_is_interrupted_on_a_survivor_and_a_restart_interrupts_no_other(
    tmp_path: Path,
) -> None:
    """Layer: runs ownership across replicas (leases, docs/operations.md "Several replicas";
    contract invariant 4, maintenance, and "one unfinished run per session"): B restarting
    (its start-up recovery, its shutdown) leaves A's live run alone; `kill -9` of A, the
    run's owner, and B records the run `interrupted` (maintenance) within 30 s, after which
    the session admits a new turn that B runs to completion."""
    with database() as url, replicas(tmp_path, url, SLOW, SLOW) as [(a, on_a), (b, on_b)]:
        sid = new_session(on_a)
        stream = start_turn(on_a, sid, "/slow a long answer")["stream_id"]
        before = seqs(read_events(on_b, sid, after="0", stop_on="reasoning.delta", timeout=30))
        b.restart()  # shutdown and start-up recovery on B: A's run is A's
        after_restart = read_events(on_b, sid, after=str(before[-1]), until_seq=before[-1] + 3)
        assert [f.event for f in after_restart if f.event == "run.finished"] == []
        busy = on_b.post("/api/chat/start", json={"session_id": sid, "message": "me too"})
        assert busy.status_code == 409 and busy.json()["active_stream_id"] == stream
        cursor = seqs(after_restart)[-1]
        a.kill()
        killed = time.monotonic()
        finished = interrupted_on(on_b, sid, stream, cursor)
        took = time.monotonic() - killed
        print(f"kill -9 to interrupted on the survivor: {took:.1f} s")
        assert took < 30
        assert finished.json["data"]["state"] == "interrupted"
        assert finished.json["data"]["maintenance"] is True
        again = start_turn(on_b, sid, "and now on B")
        done = run_events(on_b, sid, again["stream_id"], timeout=120)
        assert done[-1].json["data"]["state"] == "completed"


def test_a_paused_owner_past_its_lease_never_writes_after_the_takeover(tmp_path: Path) -> None:
    """Layer: the log's fence (the run's epoch, bumped at takeover; contract: a late worker's
    output never lands): A is paused (SIGSTOP) past its lease mid-run, B takes the run over
    and records it interrupted; A resumed (SIGCONT) keeps streaming into a run that is no
    longer its own, and none of it reaches the log; A then runs a new turn normally."""
    with database() as url, replicas(tmp_path, url, SLOW, SLOW) as [(a, on_a), (_, on_b)]:
        sid = new_session(on_a)
        stream = start_turn(on_a, sid, "/slow a long answer")["stream_id"]
        first = read_events(on_b, sid, after="0", stop_on="reasoning.delta", timeout=30)
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        try:
            finished = interrupted_on(on_b, sid, stream, seqs(first)[-1])
            assert finished.json["data"]["state"] == "interrupted"
        finally:
            a.proc.send_signal(signal.SIGCONT)
        end = int(finished["id"])
        time.sleep(4)  # A streams on for a few pieces, and hears its lease is lost
        assert on_a.get("/api/health").status_code == 200
        wait_until(lambda: "lease expired" in a.log(), what="A stops its runs, lease lost")
        again = start_turn(on_a, sid, "A again")
        done = run_events(on_b, sid, again["stream_id"], timeout=120)
        assert done[-1].json["data"]["state"] == "completed"
        late = [f for f in done if int(f["id"] or 0) > end and f.json.get("stream_id") == stream]
        assert late == [], [f.event for f in late]
        whole = seqs(done)
        assert whole == list(range(1, whole[-1] + 1))


def test_accounts_owners_and_search_are_the_databases_on_every_replica(tmp_path: Path) -> None:
    """Layer: the log's accounts, owners and search index on PostgreSQL (docs/operations.md);
    invariant: each is written in the database, so a user added on the command line signs in
    through any replica, a session is its owner's on every replica, and a question asked
    through one replica is found through another and hidden from anyone else."""
    with database() as url:
        for name, admin in (("alice", True), ("bob", False)):
            args = ["add", name, *(["--admin"] if admin else []), "--database-url", url]
            done = tether_users(tmp_path / "a", *args, password=PASSWORDS[name])
            assert done.returncode == 0, done.stderr
        listed = tether_users(tmp_path / "b", "list", "--database-url", url)
        assert listed.stdout.splitlines() == ["alice (admin)", "bob"]
        accounts = ("--database-url", url, "--auth", "accounts")
        with (
            running_server(tmp_path / "a", *accounts, env=DEMO) as a,
            running_server(tmp_path / "b", *accounts, env=DEMO) as b,
            sign_in(a, "alice") as alice_a,
            sign_in(b, "ALICE") as alice_b,
            sign_in(b, "bob") as bob_b,
        ):
            sid = new_session(alice_a, "birds")
            start_turn(alice_a, sid, "where do ptarmigans winter")
            read_events(alice_a, sid, after="0", stop_on="run.finished", timeout=60)
            found = alice_b.get("/api/search", params={"q": "ptarmigans"}).json()["results"]
            # the question, and the demo's answer (which repeats it) once its run finished
            assert sorted((r["session_id"], r["role"]) for r in found) == [
                (sid, "assistant"),
                (sid, "user"),
            ]
            assert bob_b.get("/api/search", params={"q": "ptarmigans"}).json()["results"] == []
            hidden = bob_b.get("/api/session", params={"session_id": sid})
            assert hidden.status_code == 404
            assert alice_b.get("/api/session", params={"session_id": sid}).status_code == 200


def test_a_start_from_a_view_another_replica_changed_is_refused_through_either(
    tmp_path: Path,
) -> None:
    """Layer: runs admission across replicas (docs/api.md §4 `after_seq`); contract
    invariant 1. A tab on replica A shows branch 1; a tab on replica B switches to branch 2.
    A's message with the position of its view is 409 `transcript_changed` through A (whose
    fold reads the log's position in the database) and through B alike, and writes nothing;
    from the view now shown it goes, after branch 2."""
    with database() as url, replicas(tmp_path, url, DEMO, DEMO) as [(_, on_a), (_, on_b)]:
        sid = new_session(on_a)
        start_turn(on_a, sid, "one")
        wait_idle(on_a, sid)
        first = session_body(on_a, sid)["messages"][0]
        start_turn(on_a, sid, "one, edited", edit_of=first["id"])
        edited = wait_idle(on_a, sid)["messages"][0]
        back = {"session_id": sid, "row_id": edited["id"], "index": 1}
        seen = on_a.post("/api/session/branch", json=back).json()["session"]
        forth = {"session_id": sid, "row_id": seen["messages"][0]["id"], "index": 2}
        assert on_b.post("/api/session/branch", json=forth).status_code == 200
        now = session_body(on_b, sid)
        stale = {"session_id": sid, "message": "two", "after_seq": seen["last_seq"]}
        for client in (on_a, on_b):
            refused = client.post("/api/chat/start", json=stale)
            assert refused.status_code == 409, refused.text
            assert refused.json()["code"] == "transcript_changed"
        assert session_body(on_a, sid)["last_seq"] == now["last_seq"]
        start_turn(on_a, sid, "two", after_seq=now["last_seq"])
        body = wait_idle(on_b, sid)
        assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [
            "one, edited",
            "two",
        ]
