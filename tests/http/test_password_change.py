"""A person's own password change (`POST /api/me/password`, docs/api.md §15) against real
`tether serve --auth accounts` processes: the current password is checked and a wrong one
counts as a failed login, the new one meets the rules of `tether users add`, and success
ends every other sign-in of that person while this one and their API tokens go on."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pg import database

from accounts_kit import PASSWORDS, OpenStream, add_user, bearer, new_token, sign_in
from helpers import new_session, running_server

pytestmark = pytest.mark.slow

ACCOUNTS = ("--auth", "accounts", "--heartbeat-seconds", "5")
PATH = "/api/me/password"


def test_a_person_changes_their_password_and_their_other_sign_ins_end(tmp_path: Path) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with (
        running_server(data, *ACCOUNTS) as srv,
        sign_in(srv, "bob") as here,
        sign_in(srv, "bob") as elsewhere,
        sign_in(srv, "alice") as alice,
    ):
        sid = new_session(here, "Bob's notes")
        token = new_token(here)["token"]
        before = here.cookies["tether_session"]

        wrong = here.post(PATH, json={"current_password": "not-it-1", "new_password": "bob-new-1"})
        assert wrong.status_code == 403 and wrong.json()["code"] == "wrong_password"
        for weak in ("short", ""):
            refused = here.post(
                PATH, json={"current_password": PASSWORDS["bob"], "new_password": weak}
            )
            assert refused.status_code == 400 and refused.json()["code"] == "invalid_request"
            assert "at least 8 characters" in refused.json()["message"]
        same = here.post(
            PATH, json={"current_password": PASSWORDS["bob"], "new_password": PASSWORDS["bob"]}
        )
        assert same.status_code == 400 and same.json()["code"] == "invalid_request"
        assert elsewhere.get("/api/sessions").status_code == 200  # refusals changed nothing

        # opened last: the guard's own look comes a heartbeat (5 s) after, so an end within
        # 3 s is the change's doing
        other_stream = OpenStream(elsewhere, "/api/events")
        done = here.post(
            PATH, json={"current_password": PASSWORDS["bob"], "new_password": "bob-new-pass-1"}
        )
        assert done.status_code == 200 and done.json() == {"ok": True}
        assert here.cookies["tether_session"] != before  # this sign-in got a new cookie...
        listed = here.get("/api/sessions")
        assert listed.status_code == 200 and sid in listed.text  # ...and goes on
        refused = elsewhere.get("/api/sessions")  # the other sign-in of bob ended
        assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"
        assert other_stream.ended.wait(3)  # its open stream too, at once
        with httpx.Client(base_url=srv.base_url, timeout=10) as replay:
            replay.cookies.set("tether_session", before)
            assert replay.get("/api/sessions").status_code == 401
        with bearer(srv, token) as script:  # a token is a credential of its own
            assert script.get("/api/me").json()["username"] == "bob"
        assert alice.get("/api/sessions").status_code == 200  # another person's goes on
        with httpx.Client(base_url=srv.base_url, timeout=10) as old:
            stale = old.post("/api/auth/login", json={"username": "bob", "password": "bob-pass-22"})
            assert stale.status_code == 401
        with sign_in(srv, "bob", "bob-new-pass-1") as again:
            assert sid in again.get("/api/sessions").text


def test_wrong_current_passwords_are_limited_as_failed_logins(tmp_path: Path) -> None:
    """A stolen cookie cannot be used to guess its owner's password: each wrong current
    password is a failed login of that person, and the login's limit stops them both."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    with running_server(data, *ACCOUNTS) as srv, sign_in(srv, "alice") as alice:
        for i in range(5):
            wrong = alice.post(
                PATH, json={"current_password": f"guess-{i}-x", "new_password": "alice-new-1"}
            )
            assert wrong.status_code == 403, wrong.text
        limited = alice.post(
            PATH, json={"current_password": PASSWORDS["alice"], "new_password": "alice-new-1"}
        )
        assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        with httpx.Client(base_url=srv.base_url, timeout=10) as fresh:
            login = fresh.post(
                "/api/auth/login", json={"username": "alice", "password": PASSWORDS["alice"]}
            )
            assert login.status_code == 429  # the same count as the login's
        assert alice.get("/api/me").status_code == 200  # still signed in, password unchanged


def test_a_person_signed_in_by_their_proxy_has_no_password_to_change(tmp_path: Path) -> None:
    proxy = ("--auth", "trusted-header", "--trusted-proxy", "127.0.0.1")
    with (
        running_server(tmp_path / "data", *proxy) as srv,
        srv.client(headers={"X-Forwarded-User": "dora"}) as dora,
    ):
        body = {"current_password": "whatever-1", "new_password": "whatever-2"}
        refused = dora.post(PATH, json=body)
        assert refused.status_code == 409 and refused.json()["code"] == "no_password"


def test_the_route_is_absent_in_the_single_user_modes(tmp_path: Path) -> None:
    with running_server(tmp_path / "data") as srv, srv.client() as client:
        body = {"current_password": "whatever-1", "new_password": "whatever-2"}
        absent = client.post(PATH, json=body)
        assert absent.status_code == 404 and absent.json()["code"] == "not_found"


def test_a_page_of_another_site_cannot_change_it(tmp_path: Path) -> None:
    """The route changes state with the cookie: the Origin check refuses a cross-site
    request before anything is checked or counted, and the password stays."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    with running_server(data, *ACCOUNTS) as srv, sign_in(srv, "alice") as alice:
        body = {"current_password": PASSWORDS["alice"], "new_password": "taken-over-1"}
        forged = alice.post(PATH, json=body, headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403 and forged.json()["code"] == "bad_origin"
        cross = alice.post(PATH, json=body, headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403 and cross.json()["code"] == "bad_origin"
        assert alice.get("/api/me").status_code == 200  # still signed in
        with sign_in(srv, "alice") as again:  # the password did not change
            assert again.get("/api/me").json()["username"] == "alice"


def test_a_token_changes_the_password_only_with_the_current_one_and_keeps_working(
    tmp_path: Path,
) -> None:
    """A script's token is held to the current password as a browser is (a wrong one is a
    failed login); a change through it sets no cookie, ends every sign-in, and the token
    goes on (it is a credential of its own)."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    with running_server(data, *ACCOUNTS) as srv, sign_in(srv, "alice") as browser:
        token = new_token(browser)["token"]
        with bearer(srv, token) as script:
            body = {"current_password": "not-hers-1", "new_password": "alice-new-2"}
            wrong = script.post(PATH, json=body)
            assert wrong.status_code == 403 and wrong.json()["code"] == "wrong_password"
            assert browser.get("/api/me").status_code == 200  # a refusal ends nothing
            body["current_password"] = PASSWORDS["alice"]
            done = script.post(PATH, json=body)
            assert done.status_code == 200 and "set-cookie" not in done.headers
            assert browser.get("/api/me").status_code == 401
            assert script.get("/api/me").json()["username"] == "alice"
        with sign_in(srv, "alice", "alice-new-2") as again:
            assert again.get("/api/me").status_code == 200


def test_a_change_through_one_replica_ends_the_sign_ins_of_the_others(tmp_path: Path) -> None:
    """On a shared database the epoch is the database's: a cookie of another replica
    answers 401 at once, and its open event stream ends within a heartbeat; the cookie the
    change gave works on every replica."""
    with database() as url:
        add_user(tmp_path / "a", "alice", admin=True, database_url=url)
        shared = ("--auth", "accounts", "--heartbeat-seconds", "0.5", "--database-url", url)
        with (
            running_server(tmp_path / "a", *shared) as a,
            running_server(tmp_path / "b", *shared) as b,
            sign_in(a, "alice") as here,
            sign_in(b, "alice") as there,
        ):
            stream = OpenStream(there, "/api/events")
            body = {"current_password": PASSWORDS["alice"], "new_password": "alice-new-3"}
            assert here.post(PATH, json=body).status_code == 200
            assert there.get("/api/me").status_code == 401
            assert stream.ended.wait(10), "the other replica's stream goes on"
            with httpx.Client(base_url=b.base_url, timeout=10) as moved:
                moved.cookies.set("tether_session", here.cookies["tether_session"])
                assert moved.get("/api/me").json()["username"] == "alice"
