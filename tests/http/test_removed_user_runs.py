"""A removed person's runs stop (docs/api.md §15): `DELETE /api/users/{username}` and
`tether users remove NAME`, run while the server runs, end that person's streaming run as
their own Stop would: the model request is closed, the log holds one `run.cancel_requested`
and exactly one `run.finished` in state `cancelled`, and a message they queued stays queued
(it is not sent). Real `tether serve` processes, the fake model streaming slowly; on
PostgreSQL the run is another replica's, reached through the log as a Stop reaches it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pg import database

from accounts_kit import add_user, sign_in, tether_users
from fake_openai import FakeOpenAI, barrier, delay, reply, text
from helpers import (
    ServerProcess,
    new_session,
    running_server,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow
# The longest heartbeat, so that the look for removed owners (each heartbeat) is rare: a
# removal through the API is seen to stop the run itself by the log, which holds the Stop
# when the DELETE answers (it is not left to the next heartbeat).
SLOW_BEAT = "5"
# How long a test waits for the model request to close: a bound, not a margin (the slow
# answer streams for a minute, so a run that was not stopped still fails).
STOPPED_WITHIN = 15


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def slow_answer() -> object:
    """A minute of words, a fifth of a second apart: still streaming when the person goes."""
    steps: list[object] = []
    for i in range(300):
        steps += [text(f"word{i} "), delay(0.2)]
    return reply(*steps)


@contextmanager
def accounts_server(
    data: Path, fake: FakeOpenAI, heartbeat: str, *extra: str
) -> Iterator[ServerProcess]:
    model = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
    with running_server(
        data, "--auth", "accounts", *model, "--heartbeat-seconds", heartbeat, *extra
    ) as srv:
        yield srv


def bob_streaming(srv: ServerProcess, fake: FakeOpenAI) -> str:
    """Bob's session, its run streaming the slow answer, and a message queued behind it."""
    fake.script(slow_answer(), reply(text("the queued message's answer")))
    with sign_in(srv, "bob") as bob:
        sid = new_session(bob, "Bob's long question")
        start_turn(bob, sid, "Tell me everything")
        assert fake.wait_for_requests(1)
        queued = bob.post("/api/chat/queue", json={"session_id": sid, "message": "And then?"})
        assert queued.status_code == 200 and queued.json()["started"] is None, queued.text
    return sid


def logged_in_postgres(url: str, sid: str) -> list[tuple[str, dict]]:
    import psycopg

    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT type, data FROM events WHERE session_id=%s ORDER BY seq", (sid,)
        ).fetchall()
    return [(kind, json.loads(data) if isinstance(data, str) else data) for kind, data in rows]


def logged(data: Path, sid: str) -> list[tuple[str, dict]]:
    db = sqlite3.connect(data / "tether.db")
    try:
        rows = db.execute(
            "SELECT type, data FROM events WHERE session_id=? ORDER BY seq", (sid,)
        ).fetchall()
    finally:
        db.close()
    return [(kind, json.loads(data)) for kind, data in rows]


def stop_recorded(events: list[tuple[str, dict]]) -> bool:
    return any(kind == "run.cancel_requested" for kind, _ in events)


def assert_stopped_as_by_stop(events: list[tuple[str, dict]]) -> None:
    kinds = [kind for kind, _ in events]
    assert kinds.count("run.started") == 1, kinds  # the queued message was not sent
    assert kinds.count("run.cancel_requested") == 1, kinds
    finished = [data for kind, data in events if kind == "run.finished"]
    assert [f["state"] for f in finished] == ["cancelled"], finished
    assert "queue.added" in kinds and "queue.removed" not in kinds, kinds  # still queued


def test_removing_a_user_through_the_api_stops_their_run_at_once(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with accounts_server(data, fake, SLOW_BEAT) as srv, sign_in(srv, "alice") as alice:
        sid = bob_streaming(srv, fake)
        assert alice.delete("/api/users/bob").json() == {"ok": True}
        assert stop_recorded(logged(data, sid)), "the removal answered before its Stop"
        assert fake.wait_disconnects(1, timeout=STOPPED_WITHIN), "the model is still called"
        assert fake.requests_count == 1
    assert_stopped_as_by_stop(logged(data, sid))


def test_removing_a_user_on_the_command_line_stops_their_run_within_a_heartbeat(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """`tether users remove` writes the database itself, beside the running server: the
    server finds the run's owner gone at its next look, at most a heartbeat later."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with accounts_server(data, fake, "0.5") as srv:
        sid = bob_streaming(srv, fake)
        removed = tether_users(data, "remove", "bob")
        assert removed.returncode == 0, removed.stderr
        assert fake.wait_disconnects(1, timeout=STOPPED_WITHIN), "the model is still called"
        assert fake.requests_count == 1
    assert_stopped_as_by_stop(logged(data, sid))


@pytest.mark.parametrize("removal", ["api", "command line"])
def test_a_removed_users_run_on_another_replica_stops(
    tmp_path: Path, fake: FakeOpenAI, removal: str
) -> None:
    """Bob's run is replica B's. Removed through replica A, it gets the
    `run.cancel_requested` a Stop through A would record, and B, hearing it through the log,
    stops it at once; removed on the command line, B finds its owner gone
    at its next heartbeat."""
    with database() as url:
        add_user(tmp_path / "a", "alice", admin=True, database_url=url)
        add_user(tmp_path / "a", "bob", database_url=url)
        shared = ("--database-url", url)
        heartbeat = SLOW_BEAT if removal == "api" else "0.5"
        with (
            accounts_server(tmp_path / "a", fake, heartbeat, *shared) as a,
            accounts_server(tmp_path / "b", fake, heartbeat, *shared) as b,
            sign_in(a, "alice") as alice,
        ):
            sid = bob_streaming(b, fake)
            if removal == "api":
                assert alice.delete("/api/users/bob").json() == {"ok": True}
                recorded = stop_recorded(logged_in_postgres(url, sid))
                assert recorded, "the removal answered before its Stop"
            else:
                gone = tether_users(tmp_path / "c", "remove", "bob", "--database-url", url)
                assert gone.returncode == 0, gone.stderr
            stopped = fake.wait_disconnects(1, timeout=STOPPED_WITHIN)
            assert stopped, "the model is still being called"
            assert fake.requests_count == 1
        assert_stopped_as_by_stop(logged_in_postgres(url, sid))


def remove_bob(srv: ServerProcess, removal: str) -> None:
    if removal == "api":
        with sign_in(srv, "alice") as alice:
            assert alice.delete("/api/users/bob").json() == {"ok": True}
    else:
        gone = tether_users(srv.data_dir, "remove", "bob")
        assert gone.returncode == 0, gone.stderr


@pytest.mark.parametrize("removal", ["api", "command line"])
def test_another_persons_run_goes_on_when_a_user_is_removed(
    tmp_path: Path, fake: FakeOpenAI, removal: str
) -> None:
    """The removal's Stop acts as the removed person, so it reaches their runs only: Carol's
    run, streaming when Bob goes (held at a barrier in the model's answer until his run
    stopped), finishes completed, its model request never closed."""
    data = tmp_path / "data"
    for name in ("alice", "bob", "carol"):
        add_user(data, name, admin=name == "alice")
    carols = reply(text("Carol's first half, "), barrier("carol"), text("and her second."))
    fake.script(slow_answer(), carols)
    beat = SLOW_BEAT if removal == "api" else "0.5"
    with accounts_server(data, fake, beat) as srv, sign_in(srv, "carol") as carol:
        with sign_in(srv, "bob") as bob:
            start_turn(bob, new_session(bob, "Bob's long question"), "Tell me everything")
            assert fake.wait_for_requests(1)
        sid = new_session(carol, "Carol's question")
        start_turn(carol, sid, "A short one")
        assert fake.wait_reached("carol"), "Carol's run did not reach the model"
        remove_bob(srv, removal)
        assert fake.wait_disconnects(1, timeout=STOPPED_WITHIN), "Bob's run was not stopped"
        fake.release("carol")
        wait_idle(carol, sid)
        assert fake.disconnects == 1  # Bob's request only
    events = logged(data, sid)
    assert not stop_recorded(events), events
    assert [d["state"] for k, d in events if k == "run.finished"] == ["completed"], events


@pytest.mark.parametrize("removal", ["api", "command line"])
def test_a_removed_users_run_waiting_for_their_approval_stops(tmp_path: Path, removal: str) -> None:
    """A run that waits for its owner's answer to an approval prompt (the demo's `/approve`,
    which waits five minutes) is a running run: the removal stops it as a Stop would."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    beat = ("--heartbeat-seconds", SLOW_BEAT if removal == "api" else "0.5")
    with running_server(data, "--auth", "accounts", *beat) as srv:
        with sign_in(srv, "bob") as bob:
            sid = new_session(bob, "Bob's risky request")
            start_turn(bob, sid, "/approve")

        def logged_of(kind: str) -> list[dict]:
            return [d for k, d in logged(srv.data_dir, sid) if k == kind]

        wait_until(lambda: logged_of("approval.requested"), what="the approval prompt")
        remove_bob(srv, removal)
        ended = wait_until(
            lambda: logged_of("run.finished"), timeout=STOPPED_WITHIN, what="the run's end"
        )
    assert [d["state"] for d in ended] == ["cancelled"], ended
    assert [k for k, _ in logged(data, sid)].count("run.cancel_requested") == 1


def test_a_removed_users_run_that_ends_before_the_heartbeat_sends_no_queued_message(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """`tether users remove` while Bob's run is about to end: it completes before the
    server's next look for removed owners, and the message he queued behind it must not
    start as the next turn (docs/api.md §15: never sent), for no one may send it now. No
    event says a start was not made, so after the run's end the test waits a bound for the
    model request a start would make at once."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    fake.script(reply(text("Nearly "), barrier("bob"), text("done.")), reply(text("queued")))
    with accounts_server(data, fake, SLOW_BEAT) as srv:
        with sign_in(srv, "bob") as bob:
            sid = new_session(bob, "Bob's short question")
            start_turn(bob, sid, "Tell me briefly")
            assert fake.wait_reached("bob")
            queued = bob.post("/api/chat/queue", json={"session_id": sid, "message": "Then?"})
            assert queued.status_code == 200 and queued.json()["started"] is None, queued.text
        remove_bob(srv, "command line")
        fake.release("bob")
        wait_until(
            lambda: any(k == "run.finished" for k, _ in logged(data, sid)), what="the run's end"
        )
        assert not fake.wait_for_requests(2, timeout=3), "the queued message was sent"
    kinds = [kind for kind, _ in logged(data, sid)]
    assert kinds.count("run.started") == 1 and "queue.removed" not in kinds, kinds
