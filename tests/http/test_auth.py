"""Access control (docs/api.md §8, docs/security.md) against a real `tether serve` process: the
password, the session cookie, logout, the login rate limit, the Origin check and the CLI's
refusals."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from accounts_kit import OpenStream
from helpers import (
    ServerProcess,
    free_port,
    new_session,
    read_events,
    running_server,
    start_turn,
    wait_idle,
)

pytestmark = pytest.mark.slow

PW = "correct horse"
PW_ARGS = ("--password-env", "TETHER_TEST_PW")
PW_ENV = {"TETHER_TEST_PW": PW}
COOKIE = "tether_session"

# One request per API route family: every one of them answers 401 without a session.
PROTECTED = [
    ("GET", "/api/sessions", None),
    ("POST", "/api/sessions", {}),
    ("GET", "/api/session?session_id=abc", None),
    ("PATCH", "/api/session", {"session_id": "abc", "title": "x"}),
    ("DELETE", "/api/session?session_id=abc", None),
    ("GET", "/api/session/context?session_id=abc", None),
    ("POST", "/api/session/truncate", {"session_id": "abc", "keep_count": 0}),
    ("POST", "/api/session/branch", {"session_id": "abc", "row_id": "u_x", "index": 1}),
    ("POST", "/api/chat/regenerate", {"session_id": "abc"}),
    ("GET", "/api/session/status?session_id=abc", None),
    ("POST", "/api/chat/start", {"session_id": "abc", "message": "hi"}),
    ("POST", "/api/chat/cancel", {"session_id": "abc"}),
    ("POST", "/api/chat/steer", {"stream_id": "abc", "text": "hi"}),
    ("POST", "/api/chat/queue", {"session_id": "abc", "message": "hi"}),
    ("PATCH", "/api/chat/queue?queue_id=abc", {"text": "hi"}),
    ("DELETE", "/api/chat/queue?queue_id=abc", None),
    ("GET", "/api/sessions/abc/events", None),
    ("GET", "/api/sessions/abc/events?after=0", None),
    ("GET", "/api/events", None),
    ("GET", "/api/attachments/abc", None),
    ("POST", "/api/render", {"texts": ["**hi**"]}),
    ("GET", "/api/openapi.json", None),
    ("GET", "/api/docs", None),
    ("GET", "/api/no-such-route", None),
]


@pytest.fixture(scope="module")
def pw_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("auth") / "data"
    with running_server(data, *PW_ARGS, env=PW_ENV) as srv:
        yield srv


def login(client: httpx.Client, password: str = PW) -> httpx.Response:
    return client.post("/api/auth/login", json={"password": password})


@contextmanager
def logged_in(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        response = login(client)
        assert response.status_code == 200, response.text
        yield client


def set_cookie_headers(response: httpx.Response) -> list[str]:
    return response.headers.get_list("set-cookie")


def session_count(client: httpx.Client) -> int:
    return len(client.get("/api/sessions").json()["sessions"])


# -- every route needs the session ---------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
def test_every_api_route_needs_login(
    pw_server: ServerProcess, method: str, path: str, body: dict | None
) -> None:
    with pw_server.client() as client:
        response = client.request(method, path, json=body)
    assert response.status_code == 401, (path, response.text)
    assert response.json()["code"] == "unauthenticated"
    assert COOKIE not in response.headers.get("set-cookie", "")


def test_real_session_and_attachment_need_login(pw_server: ServerProcess) -> None:
    with logged_in(pw_server) as client:
        sid = new_session(client, "private")
        data = base64.b64encode(b"secret notes").decode()
        start_turn(
            client,
            sid,
            "read this",
            attachments=[{"name": "notes.txt", "mime": "text/plain", "data_base64": data}],
        )
        body = wait_idle(client, sid)
        url = body["messages"][0]["attachments"][0]["url"]
        served = client.get(url)
        assert served.status_code == 200 and served.content == b"secret notes"
        assert served.headers["content-type"] == "application/octet-stream"
        assert served.headers["content-disposition"].startswith("attachment")
        assert served.headers["x-content-type-options"] == "nosniff"
    with pw_server.client() as anonymous:
        for path in (url, f"/api/session?session_id={sid}", f"/api/sessions/{sid}/events"):
            response = anonymous.get(path)
            assert response.status_code == 401, path
            assert b"secret" not in response.content


def test_public_routes_need_no_login(pw_server: ServerProcess) -> None:
    with pw_server.client() as client:
        assert client.get("/api/health").status_code == 200
        page = client.get("/login")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert 'for="password">Password<' in page.text and ">Log in<" in page.text
        assert "<script>" not in page.text and "style=" not in page.text
        assert client.get("/static/css/app.css").status_code == 200
        assert client.get("/static/js/login.js").status_code == 200
        status = client.get("/api/auth/status").json()
        assert status == {
            "authenticated": False,
            "password_required": True,
            "mode": "password",
            "username": None,
        }


def test_pages_redirect_to_login(pw_server: ServerProcess) -> None:
    with pw_server.client() as client:
        root = client.get("/")
        assert root.status_code == 303 and root.headers["location"] == "/login"
        one = client.get("/s/x")
        assert one.status_code == 303 and one.headers["location"] == "/login?next=%2Fs%2Fx"
        assert "Tether" not in one.text


# -- login, the cookie, logout ------------------------------------------------------------


def test_wrong_password_is_refused_without_a_cookie(pw_server: ServerProcess) -> None:
    with pw_server.client() as client:
        response = login(client, "wrong horse")
        assert response.status_code == 401 and response.json()["code"] == "bad_credentials"
        assert not set_cookie_headers(response)
        assert client.get("/api/sessions").status_code == 401
        assert client.post("/api/auth/login", json={}).status_code == 400
        assert client.post("/api/auth/login", json={"password": 7}).status_code == 400


def test_login_sets_a_strict_http_only_cookie_and_opens_the_api(pw_server: ServerProcess) -> None:
    with pw_server.client() as client:
        response = login(client)
        assert response.status_code == 200 and response.json()["ok"] is True
        [cookie] = set_cookie_headers(response)
        attributes = [part.strip().lower() for part in cookie.split(";")]
        assert attributes[0].startswith(f"{COOKIE}=") and len(attributes[0]) > 40
        assert "httponly" in attributes and "samesite=strict" in attributes
        assert "path=/" in attributes and f"max-age={30 * 24 * 3600}" in attributes
        assert "secure" not in attributes  # plain http here: a Secure cookie would be dropped
        assert client.get("/api/auth/status").json() == {
            "authenticated": True,
            "password_required": True,
            "mode": "password",
            "username": None,
        }
        sid = new_session(client, "after login")
        assert client.get("/api/session", params={"session_id": sid}).status_code == 200
        assert client.get("/").status_code == 200
        assert client.get(f"/s/{sid}").status_code == 200
        frames = read_events(client, sid, after="0", until_seq=1)
        assert frames[0].event == "session.created"
        with client.stream("GET", "/api/events", timeout=10) as stream:
            assert stream.status_code == 200
            assert "text/event-stream" in stream.headers["content-type"]
        back = client.get("/login", params={"next": f"/s/{sid}"})
        assert back.status_code == 303 and back.headers["location"] == f"/s/{sid}"
        evil = client.get("/login", params={"next": "//evil.example/x"})
        assert evil.status_code == 303 and evil.headers["location"] == "/"


def test_logout_refuses_the_same_cookie_afterwards(pw_server: ServerProcess) -> None:
    with logged_in(pw_server) as client:
        value = client.cookies[COOKIE]
        response = client.post("/api/auth/logout")
        assert response.status_code == 200 and response.json()["ok"] is True
        assert any(
            h.startswith(f'{COOKIE}=""') or "max-age=0" in h.lower()
            for h in set_cookie_headers(response)
        )
    with pw_server.client(cookies={COOKIE: value}) as replay:
        assert replay.get("/api/sessions").status_code == 401
        assert replay.get("/api/auth/status").json()["authenticated"] is False
    with logged_in(pw_server) as again:  # a new login still works
        assert again.get("/api/sessions").status_code == 200


def test_logout_ends_the_open_streams_of_that_cookie(pw_server: ServerProcess) -> None:
    """A logout in one tab ends the event streams another tab of that browser holds open with
    the same cookie (docs/security.md, "What needs a login": the page then goes to the login
    page), at once, and leaves those of another login alone."""
    with logged_in(pw_server) as tab, logged_in(pw_server) as elsewhere:
        sid = new_session(tab, "open in a tab")
        streams = [OpenStream(tab, "/api/events"), OpenStream(tab, f"/api/sessions/{sid}/events")]
        kept = OpenStream(elsewhere, "/api/events")
        with pw_server.client(cookies={COOKIE: tab.cookies[COOKIE]}) as other_tab:
            assert other_tab.post("/api/auth/logout").json()["was_logged_in"] is True
        assert all(stream.ended.wait(5) for stream in streams)
        assert not kept.ended.wait(1)  # another login's stream goes on


def test_tampered_or_foreign_cookies_are_refused(pw_server: ServerProcess) -> None:
    with logged_in(pw_server) as client:
        value = client.cookies[COOKIE]
    payload, stamp, signature = value.split(".")
    forged_payload = base64.urlsafe_b64encode(json.dumps({"n": "mine"}).encode()).decode()
    # The signature's first character, not its last: base64's last character of a 32-byte
    # signature carries padding bits, and changing only those decodes to the same bytes.
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    tampered = [
        f"{payload}.{stamp}.{flipped}",
        f"{forged_payload.rstrip('=')}.{stamp}.{signature}",
        f"{payload}.{stamp}.",
        "garbage",
        "",
    ]
    for bad in tampered:
        with pw_server.client(cookies={COOKIE: bad}) as client:
            response = client.get("/api/sessions")
            assert response.status_code == 401, bad
            assert response.json()["code"] == "unauthenticated"


def test_logout_and_password_change_survive_a_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", *PW_ARGS, env=PW_ENV).start()
    try:
        with logged_in(server) as first, logged_in(server) as second:
            revoked, kept = first.cookies[COOKIE], second.cookies[COOKIE]
            assert first.post("/api/auth/logout").status_code == 200
        server.restart()
        with server.client(cookies={COOKIE: revoked}) as client:
            assert client.get("/api/sessions").status_code == 401
        with server.client(cookies={COOKIE: kept}) as client:
            assert client.get("/api/sessions").status_code == 200
        server.stop()
        server.env = {"TETHER_TEST_PW": "a new password"}
        server.start()
        with server.client(cookies={COOKIE: kept}) as client:
            assert client.get("/api/sessions").status_code == 401  # everyone logged out
            assert login(client).status_code == 401
            assert login(client, "a new password").status_code == 200
    finally:
        server.stop()


# -- rate limit ---------------------------------------------------------------------------


def test_failed_logins_are_rate_limited_and_success_resets(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "data", *PW_ARGS, env=PW_ENV) as server,
        server.client() as client,
    ):
        for _ in range(4):
            assert login(client, "nope").status_code == 401
        assert login(client).status_code == 200  # resets the count
        for _ in range(5):
            assert login(client, "nope").status_code == 401
        limited = login(client, "nope")
        assert limited.status_code == 429
        body = limited.json()
        assert body["code"] == "rate_limited" and isinstance(body["retry_after"], int)
        assert 1 <= body["retry_after"] <= 60
        assert limited.headers["retry-after"] == str(body["retry_after"])
        # While limited even the right password waits: guessing cannot go on.
        assert login(client).status_code == 429
        assert client.get("/api/health").status_code == 200


# -- CSRF: the Origin check ----------------------------------------------------------------


def _origin_checks(server: ServerProcess, client: httpx.Client) -> None:
    sid = new_session(client, "keep me")
    before = session_count(client)
    evil_origins = [
        "http://evil.example",
        "null",
        f"http://127.0.0.1:{server.port + 1}",
        f"https://127.0.0.1:{server.port}",
        f"http://localhost:{server.port}",
    ]
    for origin in evil_origins:
        headers = {"Origin": origin}
        for method, path, body in [
            ("POST", "/api/sessions", {"title": "evil"}),
            ("PATCH", "/api/session", {"session_id": sid, "title": "evil"}),
            ("DELETE", f"/api/session?session_id={sid}", None),
            ("POST", "/api/chat/start", {"session_id": sid, "message": "evil"}),
            ("POST", "/api/auth/logout", None),
        ]:
            response = client.request(method, path, json=body, headers=headers)
            assert response.status_code == 403, (origin, method, path)
            assert response.json()["code"] == "bad_origin"
    assert session_count(client) == before
    row = client.get("/api/session", params={"session_id": sid}).json()["session"]
    assert row["title"] == "keep me" and row["message_count"] == 0
    cross_site = client.post("/api/sessions", json={}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 403
    own = client.post("/api/sessions", json={}, headers={"Origin": server.base_url})
    assert own.status_code == 201
    assert client.post("/api/sessions", json={}).status_code == 201  # no Origin: curl, scripts
    assert session_count(client) == before + 2
    # A GET is not state-changing: a foreign Origin does not matter (CORS keeps it unread).
    assert client.get("/api/sessions", headers={"Origin": "http://evil.example"}).is_success


def test_origin_check_with_a_password(pw_server: ServerProcess) -> None:
    with logged_in(pw_server) as client:
        _origin_checks(pw_server, client)
        refused = client.post(
            "/api/auth/login", json={"password": PW}, headers={"Origin": "http://evil.example"}
        )
        assert refused.status_code == 403 and not set_cookie_headers(refused)


def test_origin_check_without_a_password(server: ServerProcess) -> None:
    with server.client() as client:
        assert client.get("/api/auth/status").json() == {
            "authenticated": True,
            "password_required": False,
            "mode": "password",
            "username": None,
        }
        _origin_checks(server, client)
        assert client.get("/").status_code == 200
        to_app = client.get("/login")
        assert to_app.status_code == 303 and to_app.headers["location"] == "/"
    assert not (server.data_dir / "secret_key").exists()


# -- what is kept on disk ------------------------------------------------------------------


def test_only_the_hash_is_kept(pw_server: ServerProcess) -> None:
    with logged_in(pw_server) as client:
        sid = new_session(client, "disk check")
        start_turn(client, sid, "hello")
        wait_idle(client, sid)
        client.post("/api/auth/logout")
    data = pw_server.data_dir
    for name in ("secret_key", "auth.json"):
        mode = stat.S_IMODE((data / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert len((data / "secret_key").read_text().strip()) >= 32
    state = json.loads((data / "auth.json").read_text())
    assert state["password_hash"].startswith("$argon2id$")
    secret = PW.encode()
    for path in data.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    assert PW not in pw_server.log()


# -- the command line ----------------------------------------------------------------------


def serve(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            str(free_port()),
            "--no-browser",
            *args,
        ],
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_cli_password_errors_exit_2_naming_the_source(tmp_path: Path) -> None:
    missing = serve(tmp_path, "--password-env", "TETHER_TEST_NO_SUCH_VAR")
    assert missing.returncode == 2 and "TETHER_TEST_NO_SUCH_VAR" in missing.stderr
    empty = serve(tmp_path, "--password-env", "TETHER_TEST_PW", env={"TETHER_TEST_PW": ""})
    assert empty.returncode == 2 and "TETHER_TEST_PW" in empty.stderr
    assert "empty" in empty.stderr
    no_file = tmp_path / "no-such-file"
    unreadable = serve(tmp_path, "--password-file", str(no_file))
    assert unreadable.returncode == 2 and str(no_file) in unreadable.stderr
    blank = tmp_path / "blank"
    blank.write_text("\nsecond line\n")
    blank_run = serve(tmp_path, "--password-file", str(blank))
    assert blank_run.returncode == 2 and str(blank) in blank_run.stderr
    both = serve(tmp_path, "--password-file", str(blank), "--password-env", "X")
    assert both.returncode == 2
    assert not (tmp_path / "data" / "secret_key").exists()


def test_password_file_reads_its_first_line(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret words\nnot this line\n")
    secret.chmod(0o600)
    with (
        running_server(tmp_path / "data", env={"TETHER_PASSWORD_FILE": str(secret)}) as server,
        server.client() as client,
    ):
        assert client.get("/api/sessions").status_code == 401
        assert login(client, "s3cret words\nnot this line").status_code == 401
        assert login(client, "s3cret words").status_code == 200
        assert client.get("/api/sessions").status_code == 200


def test_non_loopback_host_needs_a_password(tmp_path: Path) -> None:
    refused = serve(tmp_path, "--host", "0.0.0.0")
    assert refused.returncode == 2 and "without a password" in refused.stderr
    with (
        running_server(tmp_path / "data", "--host", "0.0.0.0", *PW_ARGS, env=PW_ENV) as server,
        server.client() as client,
    ):
        assert client.get("/api/sessions").status_code == 401
        assert login(client).status_code == 200
        assert client.get("/api/sessions").status_code == 200
