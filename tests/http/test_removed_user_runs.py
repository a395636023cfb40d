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
from fake_openai import FakeOpenAI, delay, reply, text
from helpers import ServerProcess, new_session, running_server, start_turn

pytestmark = pytest.mark.slow
# The longest heartbeat: the first look for removed owners comes 5 s after the server
# starts, after a test through the API waits (2 s from the removal), so a run that ends in
# time was stopped by the removal itself.
SLOW_BEAT = "5"


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
        assert fake.wait_disconnects(1, timeout=2), "the model is still being called"
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
        assert fake.wait_disconnects(1, timeout=5), "the model is still being called"
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
            else:
                gone = tether_users(tmp_path / "c", "remove", "bob", "--database-url", url)
                assert gone.returncode == 0, gone.stderr
            within = 2 if removal == "api" else 3
            assert fake.wait_disconnects(1, timeout=within), "the model is still being called"
            assert fake.requests_count == 1
        assert_stopped_as_by_stop(logged_in_postgres(url, sid))
