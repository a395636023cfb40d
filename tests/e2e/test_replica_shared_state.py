"""Two `tether serve` replicas with data directories of their own on one PostgreSQL database,
behind no sticky sessions (docs/operations.md "Several replicas"). Layer (named as contract
invariant 8 asks): the log, the state that used to live in each process's memory or data
directory (log/pg_shared.py, log/pg_blobs.py). Invariant: what one replica wrote is what any
other answers: the cookie secret, the login failures, the attachment bytes (a logged
reference never dangles on any replica) and the settings panel's defaults."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pg import database

from accounts_kit import PASSWORDS, OpenStream, add_user, bearer, new_token, sign_in
from fake_openai import FakeOpenAI, delay, reply, text
from helpers import (
    ServerProcess,
    new_session,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow
NOTES = b"the ptarmigan winters on the tundra\n"


@dataclass
class Pair:
    a: ServerProcess
    b: ServerProcess
    fake: FakeOpenAI


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("replicas")
    with database() as url, FakeOpenAI() as fake:
        add_user(root / "a", "alice", admin=True, database_url=url)
        flags = ("--database-url", url, "--auth", "accounts", "--runtime", "openai")
        flags += ("--base-url", fake.base_url, "--model", "fake-model")
        with (
            running_server(root / "a", *flags) as a,
            running_server(root / "b", *flags) as b,
        ):
            yield Pair(a, b, fake)


def as_cookie_of(client: httpx.Client, server: ServerProcess) -> httpx.Client:
    """A client of `server` carrying the cookie another replica set in `client`."""
    return httpx.Client(base_url=server.base_url, timeout=10, cookies=client.cookies)


def test_a_cookie_signed_by_one_replica_is_accepted_by_another(pair: Pair) -> None:
    with sign_in(pair.a, "alice") as on_a, as_cookie_of(on_a, pair.b) as on_b:
        status = on_b.get("/api/auth/status").json()
        assert (status["authenticated"], status["username"]) == (True, "alice")
        sid = new_session(on_b, "made through B with A's cookie")
        assert on_a.get("/api/session", params={"session_id": sid}).status_code == 200
        # Neither replica keeps a secret of its own: the database holds the one they share.
        for server in (pair.a, pair.b):
            assert not (server.data_dir / "secret_key").exists()
        on_b.post("/api/auth/logout")  # a logout through B ends the session A signed
        assert on_a.get("/api/auth/status").json()["authenticated"] is False


def test_an_upload_through_one_replica_is_read_and_sent_to_the_model_through_another(
    pair: Pair,
) -> None:
    with sign_in(pair.a, "alice") as on_a, sign_in(pair.b, "alice") as on_b:
        sid = new_session(on_a, "notes")
        upload = {"name": "notes.txt", "mime": "text/plain"}
        upload["data_base64"] = base64.b64encode(NOTES).decode()
        start_turn(on_a, sid, "keep these notes", attachments=[upload])
        ref = wait_idle(on_a, sid)["messages"][0]["attachments"][0]
        cache = pair.b.data_dir / "attachments"
        assert not [p for p in cache.rglob("*") if p.is_file()]  # B holds no copy

        downloaded = on_b.get(ref["url"])
        assert downloaded.status_code == 200, downloaded.text
        assert downloaded.content == NOTES

        pair.fake.reset()
        start_turn(on_b, sid, "what do the notes say")  # the turn runs on B
        wait_idle(on_b, sid)
        assert pair.fake.wait_for_requests(1)
        sent = str(pair.fake.last_request["messages"])
        assert NOTES.decode().strip() in sent


def test_the_settings_saved_through_one_replica_are_what_another_answers(pair: Pair) -> None:
    with sign_in(pair.a, "alice") as on_a, sign_in(pair.b, "alice") as on_b:
        saved = on_a.patch("/api/settings", json={"default_model": "big-model"})
        assert saved.status_code == 200, saved.text
        seen = on_b.get("/api/settings").json()
        assert seen["default_model"] == "big-model"
        assert seen["saved"] == {"default_model": "big-model"}
        assert on_b.get("/api/models").json()["default"] == "big-model"

        pair.fake.reset()
        sid = new_session(on_b, "a turn on B with the default A saved")
        start_turn(on_b, sid, "hello")
        wait_idle(on_b, sid)
        assert pair.fake.wait_for_requests(1)
        assert pair.fake.last_request["model"] == "big-model"

        cleared = on_b.patch("/api/settings", json={"default_model": None})
        assert cleared.status_code == 200, cleared.text
        assert on_a.get("/api/settings").json()["saved"] == {}
        for server in (pair.a, pair.b):
            assert not (server.data_dir / "settings.json").exists()


def test_failed_logins_through_two_replicas_count_together(tmp_path: Path) -> None:
    with database() as url:
        add_user(tmp_path / "a", "alice", database_url=url)
        flags = ("--database-url", url, "--auth", "accounts")
        with (
            running_server(tmp_path / "a", *flags) as a,
            running_server(tmp_path / "b", *flags) as b,
            a.client() as on_a,
            b.client() as on_b,
        ):
            wrong = {"username": "alice", "password": "not the password"}
            # Five failures (the per-address limit), spread: three on A, two on B.
            for client in (on_a, on_b, on_a, on_b, on_a):
                assert client.post("/api/auth/login", json=wrong).status_code == 401
            for client in (on_b, on_a):  # B alone saw two: the limit is the database's
                refused = client.post(
                    "/api/auth/login", json={**wrong, "password": PASSWORDS["alice"]}
                )
                assert refused.status_code == 429, refused.text
                assert refused.json()["code"] == "rate_limited"
                assert 1 <= int(refused.headers["Retry-After"]) <= 60


def test_a_logout_through_one_replica_ends_streams_busy_with_a_run_on_another(
    tmp_path: Path,
) -> None:
    """Layer: the event streams' credential re-check (http/streams.py). Invariant: an open
    stream re-checks its credential at least every heartbeat interval, busy or idle, so a
    logout or a revoked token through another replica ends it while a run streams into it
    (the re-check used to wait for a quiet interval, which a streaming run never leaves)."""
    with database() as url, FakeOpenAI() as fake:
        fake.script(reply(*[step for _ in range(300) for step in (text("word "), delay(0.1))]))
        add_user(tmp_path / "a", "alice", admin=True, database_url=url)
        flags = ("--database-url", url, "--auth", "accounts", "--heartbeat-seconds", "1")
        flags += ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
        with (
            running_server(tmp_path / "a", *flags) as a,
            running_server(tmp_path / "b", *flags) as b,
            sign_in(a, "alice") as on_a,
            as_cookie_of(on_a, b) as on_b,
        ):
            token = new_token(on_a)
            sid = new_session(on_a, "a long answer")
            start_turn(on_a, sid, "tell me everything")
            by_token = bearer(a, token["token"])
            streams = [
                OpenStream(on_a, f"/api/sessions/{sid}/events?sidebar=1&after=0"),
                OpenStream(by_token, f"/api/sessions/{sid}/events?after=0"),
            ]
            wait_until(lambda: all("text.delta" in s.frames for s in streams), what="deltas")

            assert on_b.delete(f"/api/tokens/{token['token_id']}").status_code == 200
            assert on_b.post("/api/auth/logout").json()["was_logged_in"] is True
            ended = time.monotonic()
            for stream in streams:
                assert stream.ended.wait(5), "the stream went on after the credential ended"
                assert stream.ended_at - ended < 3
            with sign_in(b, "alice") as again:  # the run was streaming all along
                assert session_body(again, sid)["busy"] is True
            by_token.close()
