"""Accounts (docs/api.md §15, docs/security.md) against real `tether serve` processes: users
made with the real command line, sign-in with a user name, logout everywhere (open streams
included), admin routes, API tokens (no Origin needed, revocation at once), the login rate
limits per address and per user, and the trusted-header mode."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from accounts_kit import (
    PASSWORDS,
    OpenStream,
    add_user,
    bearer,
    new_token,
    sign_in,
    tether_users,
)
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

ACCOUNTS = ("--auth", "accounts")
SLOW_BEAT = ("--heartbeat-seconds", "5")  # so a stream that ends fast was ended, not polled
CROSS_SITE = {"Origin": "http://evil.example"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("accounts") / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    return data


@pytest.fixture(scope="module")
def accounts_server(data_dir: Path) -> Iterator[ServerProcess]:
    with running_server(data_dir, *ACCOUNTS, *SLOW_BEAT) as srv:
        yield srv


def test_the_first_admin_is_made_on_the_command_line_of_a_headless_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    listed = tether_users(data, "list")
    assert listed.returncode == 0 and listed.stdout.splitlines() == ["alice (admin)"]
    again = tether_users(data, "add", "ALICE", password="another-pass")
    assert again.returncode != 0 and "already a user called ALICE" in again.stderr
    short = tether_users(data, "add", "bob", password="short")
    assert short.returncode != 0 and "at least 8 characters" in short.stderr
    long = tether_users(data, "add", "bob", password="x" * 4097)  # a sign-in takes 4096 at most
    assert long.returncode != 0 and "at most 4096 characters" in long.stderr
    bad = tether_users(data, "add", "bob smith", password="long enough")
    assert bad.returncode != 0 and "user name is 1-64" in bad.stderr
    gone = tether_users(data, "remove", "nobody")
    assert gone.returncode != 0 and "There is no user nobody" in gone.stderr
    assert tether_users(data, "list").stdout.splitlines() == ["alice (admin)"]  # nothing changed
    add_user(data, "bob")
    assert tether_users(data, "remove", "bob").returncode == 0
    assert tether_users(data, "list").stdout.splitlines() == ["alice (admin)"]


def test_serve_refuses_a_password_flag_with_accounts_and_a_header_without_a_proxy(
    tmp_path: Path,
) -> None:
    for extra, message in (
        (["--auth", "accounts", "--password-env", "X"], "--password-env and --password-file"),
        (["--auth", "trusted-header"], "needs --trusted-proxy"),
    ):
        server = ServerProcess(tmp_path / "data", *extra)
        with pytest.raises(RuntimeError) as failed:
            server.start(timeout=20)
        assert message in str(failed.value)


def test_sign_in_names_the_person(accounts_server: ServerProcess) -> None:
    with accounts_server.client() as client:
        page = client.get("/login")
        assert page.status_code == 200 and 'id="username"' in page.text
        status = client.get("/api/auth/status").json()
        assert status == {
            "authenticated": False,
            "password_required": True,
            "mode": "accounts",
            "username": None,
        }
        assert client.get("/api/sessions").status_code == 401
        assert client.get("/").headers["location"] == "/login"
        for body in (
            {"username": "alice", "password": "wrong password"},
            {"username": "nobody", "password": PASSWORDS["alice"]},
        ):
            refused = client.post("/api/auth/login", json=body)
            assert refused.status_code == 401 and refused.json()["code"] == "bad_credentials"
            assert refused.json()["message"] == "That user name and password do not match."
        missing = client.post("/api/auth/login", json={"password": PASSWORDS["alice"]})
        assert missing.status_code == 400 and missing.json()["code"] == "invalid_request"
    with sign_in(accounts_server, "ALICE") as alice:  # names ignore case
        assert alice.get("/api/me").json() == {"username": "alice", "admin": True}
        assert alice.get("/api/auth/status").json()["username"] == "alice"
    with sign_in(accounts_server, "bob") as bob:
        assert bob.get("/api/me").json() == {"username": "bob", "admin": False}


def test_logout_ends_every_session_of_that_person_and_their_open_streams(
    accounts_server: ServerProcess,
) -> None:
    first, second = sign_in(accounts_server, "alice"), sign_in(accounts_server, "alice")
    bob = sign_in(accounts_server, "bob")
    try:
        sid = new_session(second, "alice's")
        old_cookie = second.cookies["tether_session"]
        sidebar = OpenStream(second, "/api/events")
        session = OpenStream(second, f"/api/sessions/{sid}/events?sidebar=1")
        bobs = OpenStream(bob, "/api/events")
        assert sidebar.status == session.status == bobs.status == 200
        time.sleep(0.3)
        logged_out = time.monotonic()
        assert first.post("/api/auth/logout").json() == {"ok": True, "was_logged_in": True}
        assert sidebar.ended.wait(3) and session.ended.wait(3)
        assert sidebar.ended_at - logged_out < 3 and session.ended_at - logged_out < 3
        for client in (first, second):
            assert client.get("/api/sessions").status_code == 401
        with httpx.Client(base_url=accounts_server.base_url) as replay:
            replay.cookies.set("tether_session", old_cookie)
            assert replay.get("/api/sessions").status_code == 401
        assert not bobs.ended.is_set()  # another person's stream goes on
        assert bob.get("/api/sessions").status_code == 200
        with sign_in(accounts_server, "alice") as again:  # and she can sign in again
            assert [s["session_id"] for s in again.get("/api/sessions").json()["sessions"]] == [sid]
    finally:
        for client in (first, second, bob):
            client.close()


def test_admins_manage_users_and_a_removed_users_sessions_stay_hidden(
    accounts_server: ServerProcess,
) -> None:
    with sign_in(accounts_server, "alice") as alice, sign_in(accounts_server, "bob") as bob:
        for method, path, body in (
            ("GET", "/api/users", None),
            ("POST", "/api/users", {"username": "mallory", "password": "12345678"}),
            ("DELETE", "/api/users/alice", None),
        ):
            refused = bob.request(method, path, json=body)
            assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        made = alice.post("/api/users", json={"username": "carol", "password": PASSWORDS["carol"]})
        assert made.status_code == 201 and made.json()["user"]["username"] == "carol"
        taken = alice.post("/api/users", json={"username": "Carol", "password": "whatever1"})
        assert taken.status_code == 409 and taken.json()["code"] == "user_exists"
        for body in (
            {"username": "no spaces", "password": "long enough"},
            {"username": "dave", "password": "short"},
            {"username": "dave", "password": "long enough", "admin": "yes"},
        ):
            bad = alice.post("/api/users", json=body)
            assert bad.status_code == 400 and bad.json()["code"] == "invalid_request", body
        names = [u["username"] for u in alice.get("/api/users").json()["users"]]
        assert names == ["alice", "bob", "carol"]
        carol = sign_in(accounts_server, "carol")
        carols = new_session(carol, "carol's notes")
        token = new_token(carol)["token"]
        stream = OpenStream(bearer(accounts_server, token), "/api/events")
        assert alice.delete("/api/users/carol").json() == {"ok": True}
        assert stream.ended.wait(3)
        assert carol.get("/api/sessions").status_code == 401
        assert bearer(accounts_server, token).get("/api/sessions").status_code == 401
        hidden = alice.get("/api/session", params={"session_id": carols})
        assert hidden.status_code == 404 and hidden.json()["code"] == "session_not_found"
        assert carols not in alice.get("/api/sessions").text
        missing = alice.delete("/api/users/carol")
        assert missing.status_code == 404 and missing.json()["code"] == "user_not_found"
        myself = alice.delete("/api/users/alice")
        assert myself.status_code == 400 and alice.get("/api/me").status_code == 200
        carol.close()


def test_a_forgotten_password_is_reset_on_the_command_line_and_the_person_keeps_their_sessions(
    tmp_path: Path,
) -> None:
    """Removing and adding a person again was the only way to give them a new password, and
    it took every session they had away (they belong to the removed user id). `tether users
    password` replaces it while the server runs: the old password and every earlier sign-in
    stop at once, the new password signs them in to the same sessions."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with running_server(data, *ACCOUNTS, *SLOW_BEAT) as srv, sign_in(srv, "bob") as bob:
        bobs = new_session(bob, "Bob's notes")
        stream = OpenStream(bob, "/api/events")
        short = tether_users(data, "password", "bob", password="short")
        assert short.returncode != 0 and "at least 8" in short.stderr
        long = tether_users(data, "password", "bob", password="x" * 4097)
        assert long.returncode != 0 and "at most 4096" in long.stderr
        nobody = tether_users(data, "password", "mallory", password="long enough")
        assert nobody.returncode != 0 and "no user mallory" in nobody.stderr
        assert bob.get("/api/sessions").status_code == 200  # refusals changed nothing

        done = tether_users(data, "password", "BOB", password="bob-new-pass-4")
        assert done.returncode == 0, done.stderr
        assert bob.get("/api/sessions").status_code == 401  # the sign-in made before ended
        assert stream.ended.wait(8)  # another process changed it: found at a heartbeat
        with httpx.Client(base_url=srv.base_url, timeout=10) as old:
            wrong = old.post("/api/auth/login", json={"username": "bob", "password": "bob-pass-22"})
            assert wrong.status_code == 401
        with sign_in(srv, "bob", "bob-new-pass-4") as again:
            listed = again.get("/api/sessions").json()["sessions"]
            assert [row["session_id"] for row in listed] == [bobs]
    listed_users = tether_users(data, "list")
    assert listed_users.stdout.splitlines() == ["alice (admin)", "bob"]


def test_tokens_act_for_their_user_need_no_origin_and_stop_at_once(
    accounts_server: ServerProcess, data_dir: Path
) -> None:
    with sign_in(accounts_server, "alice") as alice, sign_in(accounts_server, "bob") as bob:
        made = new_token(alice, "laptop")
        assert set(made) == {"token_id", "name", "token"} and made["name"] == "laptop"
        listed = alice.get("/api/tokens").json()["tokens"]
        assert [t["token_id"] for t in listed] == [made["token_id"]]
        assert made["token"] not in alice.get("/api/tokens").text  # shown once
        assert bob.get("/api/tokens").json() == {"tokens": []}
        db = sqlite3.connect(data_dir / "tether.db")
        try:
            stored = "\n".join(repr(r) for r in db.execute("SELECT * FROM api_tokens"))
        finally:
            db.close()
        assert made["token_id"] in stored and made["token"] not in stored  # hashed at rest

        with bearer(accounts_server, made["token"]) as script:
            assert script.get("/api/me").json()["username"] == "alice"
            created = script.post("/api/sessions", json={"title": "by token"}, headers=CROSS_SITE)
            assert created.status_code == 201  # a token needs no Origin
            sid = created.json()["session"]["session_id"]
            assert (
                sid in alice.get("/api/sessions").text and sid not in bob.get("/api/sessions").text
            )
            cookie_cross = alice.post("/api/sessions", json={}, headers=CROSS_SITE)
            assert cookie_cross.status_code == 403 and cookie_cross.json()["code"] == "bad_origin"
            stream = OpenStream(script, f"/api/sessions/{sid}/events")
            time.sleep(0.3)
            not_bobs = bob.delete(f"/api/tokens/{made['token_id']}")
            assert not_bobs.status_code == 404 and not_bobs.json()["code"] == "token_not_found"
            assert script.get("/api/me").status_code == 200 and not stream.ended.is_set()
            revoked_at = time.monotonic()
            assert alice.delete(f"/api/tokens/{made['token_id']}").json() == {"ok": True}
            assert script.get("/api/me").status_code == 401
            assert stream.ended.wait(3) and stream.ended_at - revoked_at < 3
        for header in (f"Bearer {made['token']}", "Bearer tth_nonsense", "bearer  tth_x"):
            refused = alice.get("/api/sessions", headers={"Authorization": header})
            assert refused.status_code == 401, header  # a Tether token never falls back
        for header in ("Basic YWxpY2U6eA==", "Bearer eyJhbGciOi.not.ours", "Bearer", "Token x"):
            # Not a Tether token (a proxy's credential): ignored, the cookie decides...
            assert alice.get("/api/sessions", headers={"Authorization": header}).status_code == 200
            # ...and it does not lift the Origin check from a cookie request.
            crossed = alice.post(
                "/api/sessions", json={}, headers={"Authorization": header, **CROSS_SITE}
            )
            assert crossed.status_code == 403, header


def test_login_failures_are_limited_per_address_and_per_user(tmp_path: Path) -> None:
    # A data directory of its own: the module's server holds `data_dir` (one process per
    # SQLite directory). Behind a trusted proxy, so each request can come from its own address.
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with (
        running_server(data, *ACCOUNTS, "--trusted-proxy", "127.0.0.1") as srv,
        srv.client() as client,
    ):

        def attempt(address: str, name: str, password: str) -> httpx.Response:
            return client.post(
                "/api/auth/login",
                json={"username": name, "password": password},
                headers={"X-Forwarded-For": address},
            )

        for i in range(5):
            assert attempt("10.0.0.1", f"guess{i}", "wrong-pass").status_code == 401
        limited = attempt("10.0.0.1", "alice", PASSWORDS["alice"])
        assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        assert attempt("10.0.0.2", "alice", PASSWORDS["alice"]).status_code == 200

        for i in range(10):  # one password guessed from many addresses
            assert attempt(f"10.1.0.{i}", "bob", "wrong-pass").status_code == 401
        per_user = attempt("10.2.0.1", "bob", PASSWORDS["bob"])
        assert per_user.status_code == 429 and per_user.json()["code"] == "rate_limited"
        assert attempt("10.2.0.1", "alice", PASSWORDS["alice"]).status_code == 200

        # Someone with an account of their own: signing in to it forgets that one attempt,
        # not the address's guesses at other names, else one account guesses without limit.
        for i in range(4):
            assert attempt("10.3.0.1", f"other{i}", "wrong-pass").status_code == 401
        for _ in range(3):  # their own sign-ins, as often as they like
            assert attempt("10.3.0.1", "alice", PASSWORDS["alice"]).status_code == 200
        assert attempt("10.3.0.1", "other4", "wrong-pass").status_code == 401
        sprayed = attempt("10.3.0.1", "other5", "wrong-pass")
        assert sprayed.status_code == 429 and sprayed.json()["code"] == "rate_limited"


def test_the_trusted_header_is_believed_only_from_the_proxy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    header = "X-Forwarded-User"
    proxy = ("--auth", "trusted-header", "--trusted-proxy")
    with running_server(data, *proxy, "127.0.0.1") as srv:
        with (
            srv.client(headers={header: "dora"}) as dora,
            srv.client(headers={header: "eve"}) as eve,
        ):
            assert dora.get("/api/me").json() == {"username": "dora", "admin": False}
            sid = new_session(dora, "dora's")
            hidden = eve.get("/api/session", params={"session_id": sid})
            assert hidden.status_code == 404 and hidden.json()["code"] == "session_not_found"
            assert sid not in eve.get("/api/sessions").text
            via_proxy = dora.get("/api/me", headers={"X-Forwarded-For": "203.0.113.7"})
            assert via_proxy.json()["username"] == "dora"  # the proxy's own address is what counts
            # oauth2-proxy can pass the provider's token along: not Tether's, ignored.
            passed = dora.get("/api/me", headers={"Authorization": "Bearer eyJhbGciOi.x.y"})
            assert passed.status_code == 200 and passed.json()["username"] == "dora"
        with srv.client() as nobody:
            assert nobody.get("/api/sessions").status_code == 401
            # No form can sign anyone in: the login page (where a page goes) says how
            went = nobody.get("/")
            assert went.status_code == 303 and went.headers["location"] == "/login"
            told = nobody.get("/login")
            assert told.status_code == 401 and "through the proxy" in told.text
            assert 'id="login-form"' not in told.text
            bad = nobody.get("/api/sessions", headers={header: "not a name"})
            assert bad.status_code == 401
    # The same data directory, with a proxy at another address: the header is ignored,
    # whatever X-Forwarded-For claims.
    with (
        running_server(data, *proxy, "10.0.0.0/8") as srv,
        srv.client(headers={header: "dora", "X-Forwarded-For": "10.0.0.9"}) as spoof,
    ):
        refused = spoof.get("/api/sessions")
        assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"


def test_the_account_routes_are_absent_in_the_single_user_modes(
    shared_server: ServerProcess,
) -> None:
    with shared_server.client() as client:
        for method, path in (
            ("GET", "/api/me"),
            ("GET", "/api/users"),
            ("POST", "/api/tokens"),
            ("GET", "/api/tokens"),
        ):
            response = client.request(method, path, json={"name": "x"})
            assert response.status_code == 404 and response.json()["code"] == "not_found"
        assert client.get("/api/auth/status").json()["mode"] == "password"


def test_a_rotated_session_continues_as_its_owners(tmp_path: Path) -> None:
    """Layer: rotation (runs/rotation.py) under ownership: the child session a compression
    rotation makes belongs to the parent's person, and to nobody else."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    rotating = ("--context-window", "256", "--compression-mode", "rotate")
    with running_server(data, *ACCOUNTS, *rotating, env={"TETHER_DEMO_DELAY": "0.002"}) as srv:
        bob, alice = sign_in(srv, "bob"), sign_in(srv, "alice")
        parent = new_session(bob, "Long talk")
        start_turn(bob, parent, "hello " * 150)  # the demo's usage crosses 80% of 256
        child = wait_until(
            lambda: session_body(bob, parent)["continuation_session_id"], what="a rotation"
        )
        wait_idle(bob, parent)
        assert bob.get("/api/session", params={"session_id": child}).status_code == 200
        assert child in bob.get("/api/sessions").text
        hidden = alice.get("/api/session", params={"session_id": child})
        assert hidden.status_code == 404 and hidden.json()["code"] == "session_not_found"
        assert alice.get("/api/sessions").json() == {"sessions": []}
        bob.close()
        alice.close()
