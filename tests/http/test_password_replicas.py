"""The single password across replicas (docs/operations.md: `--auth password` on several
replicas shares their data directory, whose `auth.json` holds the logged-out cookies).
Layer: http auth; no run-state layer. Two real `tether serve` processes on one PostgreSQL
database and one data directory: a logout through either replica holds on both at once,
and neither replica's save drops the other's logouts (each wrote its own list over the
file, and read it only at start)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pg import database

from accounts_kit import OpenStream
from helpers import ServerProcess, running_server

pytestmark = pytest.mark.slow

PW = "correct horse"
PW_ENV = {"TETHER_TEST_PW": PW}
COOKIE = "tether_session"


def signed_in(server: ServerProcess) -> str:
    with server.client() as client:
        answer = client.post("/api/auth/login", json={"password": PW})
        assert answer.status_code == 200, answer.text
        return client.cookies[COOKIE]


def status(server: ServerProcess, cookie: str) -> int:
    with server.client(cookies={COOKIE: cookie}) as client:
        return client.get("/api/sessions").status_code


def log_out(server: ServerProcess, cookie: str) -> None:
    with server.client(cookies={COOKIE: cookie}) as client:
        assert client.post("/api/auth/logout").json()["was_logged_in"] is True


def test_a_logout_through_one_replica_holds_on_every_replica(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    with database() as url:
        args = ("--password-env", "TETHER_TEST_PW", "--database-url", url)
        beat = ("--heartbeat-seconds", "0.5")
        with (
            running_server(data, *args, *beat, env=PW_ENV) as a,
            running_server(data, *args, *beat, env=PW_ENV) as b,
        ):
            first, second, kept = signed_in(a), signed_in(b), signed_in(a)
            assert {status(a, c) for c in (first, second, kept)} == {200}
            assert {status(b, c) for c in (first, second, kept)} == {200}
            with httpx.Client(base_url=b.base_url, cookies={COOKIE: first}) as tab:
                stream = OpenStream(tab, "/api/events")  # open on B with the cookie
                log_out(a, first)
                assert status(b, first) == 401  # at once, on the other replica
                assert stream.ended.wait(5), "B's stream of the logged-out cookie goes on"
            log_out(b, second)
            for server in (a, b):  # B's save kept A's logout, and A reads B's
                assert status(server, first) == 401
                assert status(server, second) == 401
                assert status(server, kept) == 200
