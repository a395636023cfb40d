"""OpenID Connect sign-in (`--auth oidc`, docs/api.md §15, docs/security.md) end to end: a
real `tether serve` signs people in through a real provider on loopback
(tests/oidc_provider.py), over HTTP, as a browser would follow the redirects. Tether's side is
Authlib's client; nothing of it is replaced. A good sign-in creates the user at first sight
and lands on `next`; a wrong state, a wrong nonce, an expired token, a wrong audience, a
wrong issuer, a bad signature and a group that is not allowed are each refused with no
session, no user made, and (for the state) the code never redeemed."""

from __future__ import annotations

import html
import re
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from helpers import ServerProcess, free_port, new_session, running_server, wait_until
from oidc_provider import Provider, running_provider

pytestmark = pytest.mark.slow

CLIENT_ID, SECRET = "tether-test", "s3cret-for-tests"
ENV = {"TETHER_TEST_OIDC_SECRET": SECRET}


def _oidc_args(provider: Provider, *extra: str) -> tuple[str, ...]:
    return (
        "--auth",
        "oidc",
        "--oidc-issuer",
        provider.issuer,
        "--oidc-client-id",
        CLIENT_ID,
        "--oidc-client-secret-env",
        "TETHER_TEST_OIDC_SECRET",
        *extra,
    )


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with running_provider(CLIENT_ID, SECRET) as running:
        yield running


@pytest.fixture(scope="module")
def server(provider: Provider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("oidc") / "data"
    with running_server(data, *_oidc_args(provider), env=ENV) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _no_flaw(provider: Provider) -> None:
    provider.flaw = None
    provider.user = {"sub": "u-olga", "preferred_username": "olga"}


def _users(server: ServerProcess) -> list[str]:
    db = sqlite3.connect(Path(server.data_dir) / "tether.db")
    try:
        return [name for (name,) in db.execute("SELECT username FROM users ORDER BY rowid")]
    finally:
        db.close()


def sign_in(
    server: ServerProcess, *, next_path: str = "/", state: str | None = None, probe: bool = False
) -> tuple[httpx.Client, httpx.Response, str]:
    """Follow the sign-in as a browser would: Tether's login page, Tether's redirect to the
    provider, the provider's redirect back, the callback. `state` replaces the state the
    provider sends back; `probe` sends a HEAD to the callback first, as a link checker would.
    Returns the client, the callback's answer and the code."""
    client = httpx.Client(base_url=server.base_url, timeout=15)
    page = client.get("/login", params={"next": next_path})
    assert page.status_code == 303, page.text
    start = client.get(page.headers["location"])
    assert start.status_code == 302, start.text
    at_provider = httpx.get(start.headers["location"], timeout=15)
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["location"])
    query = {k: v[0] for k, v in parse_qs(back.query).items()}
    if state is not None:
        query["state"] = state
    if probe:
        probed = client.head(f"{back.path}?{urlencode(query)}")
        assert probed.status_code == 405 and probed.headers["allow"] == "GET", probed.headers
        assert "tether_session" not in client.cookies
    done = client.get(f"{back.path}?{urlencode(query)}")
    return client, done, query["code"]


def test_a_head_on_the_callback_does_not_spend_the_sign_in(server: ServerProcess) -> None:
    """The callback's code works once: a HEAD (a link checker, a prefetcher) answered as the
    GET would have signed that client in and left the person's own GET refused."""
    client, done, _ = sign_in(server, next_path="/s/abc", probe=True)
    assert onward(done) == "/s/abc", done.text
    assert client.get("/api/me").json()["username"] == "olga"
    client.close()


def onward(done: httpx.Response) -> str | None:
    """Where a signed-in callback's page goes on to (its refresh), or None: it answers a page
    rather than a redirect (tests/browser/test_login_oidc.py says why)."""
    found = re.search(r'http-equiv="refresh" content="0;url=([^"]*)"', done.text)
    if done.status_code != 200 or found is None:
        return None
    return html.unescape(found.group(1))


def test_a_good_sign_in_creates_the_user_and_lands_on_next(
    server: ServerProcess, provider: Provider
) -> None:
    client, done, _ = sign_in(server, next_path="/s/abc")
    assert onward(done) == "/s/abc", done.text
    assert done.headers["cache-control"] == "no-store"
    assert done.headers["referrer-policy"] == "no-referrer"  # the URL carries the code
    assert "tether_session" in client.cookies
    assert client.get("/api/me").json() == {"username": "olga", "admin": False}
    asked = provider.authorize_requests[-1]
    assert asked["code_challenge_method"] == "S256" and asked["code_challenge"]
    assert asked["nonce"] and asked["state"] and "openid" in asked["scope"].split()
    assert _users(server).count("olga") == 1
    again, done_again, _ = sign_in(server)
    assert onward(done_again) == "/"
    assert _users(server).count("olga") == 1  # the same person, not a second user
    # Ownership holds between people of the provider too.
    mine = new_session(client, "olga's")
    provider.user = {"sub": "u-pavel", "preferred_username": "pavel"}
    pavel, _, _ = sign_in(server)
    hidden = pavel.get("/api/session", params={"session_id": mine})
    assert hidden.status_code == 404 and hidden.json()["code"] == "session_not_found"
    password = pavel.post("/api/auth/login", json={"username": "olga", "password": "x"})
    assert password.status_code == 400  # no passwords in this mode
    for c in (client, again, pavel):
        c.close()


def test_a_person_is_their_subject_never_a_name_they_can_change(
    server: ServerProcess, provider: Provider
) -> None:
    provider.user = {"sub": "u-nina", "preferred_username": "nina"}
    nina, done, _ = sign_in(server)
    assert onward(done) == "/"
    mine = new_session(nina, "nina's")
    # Someone else at the provider takes the name "nina": not nina's account here.
    provider.user = {"sub": "u-impostor", "preferred_username": "nina"}
    impostor, refused, _ = sign_in(server)
    assert refused.status_code == 409 and refused.json()["code"] == "user_exists"
    assert "tether_session" not in impostor.cookies
    # Nina renames herself at the provider: still nina here, with her sessions.
    provider.user = {"sub": "u-nina", "preferred_username": "nina-renamed"}
    again, done, _ = sign_in(server)
    assert again.get("/api/me").json()["username"] == "nina"
    assert mine in again.get("/api/sessions").text
    assert _users(server).count("nina") == 1 and "nina-renamed" not in _users(server)
    for c in (nina, impostor, again):
        c.close()


def test_a_wrong_state_is_refused_before_the_code_is_redeemed(
    server: ServerProcess, provider: Provider
) -> None:
    provider.user = {"sub": "u-sam", "preferred_username": "sam"}
    client, done, code = sign_in(server, state="forged-state")
    assert done.status_code == 401 and done.json()["code"] == "bad_credentials"
    assert "tether_session" not in client.cookies
    assert code in provider.codes  # Tether never asked for a token with it
    assert client.get("/api/me").status_code == 401
    assert "sam" not in _users(server)
    client.close()


BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def test_a_browser_refused_or_cancelled_at_the_provider_gets_a_page_not_json(
    server: ServerProcess,
) -> None:
    """The callback is a browser's navigation: a person who cancels at the provider (it
    sends back `error=access_denied`) or whose sign-in does not verify saw a raw JSON body.
    A browser now gets a page saying so in words, with a way to try again, under the same
    status; a client that asks for JSON still gets the error object."""
    client = httpx.Client(base_url=server.base_url, timeout=15)
    start = client.get(client.get("/login").headers["location"])
    state = parse_qs(urlsplit(start.headers["location"]).query)["state"][0]
    cancelled = {"error": "access_denied", "error_description": "User said no", "state": state}
    page = client.get("/api/auth/oidc/callback", params=cancelled, headers=BROWSER)
    assert page.status_code == 401, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src" in page.headers["content-security-policy"]
    assert "The sign-in was cancelled at the provider." in page.text
    assert 'href="/login"' in page.text
    failed = {"error": "server_error", "error_description": "<b>Down</b>", "state": state}
    page = client.get("/api/auth/oidc/callback", params=failed, headers=BROWSER)
    assert page.status_code == 401, page.text
    assert "could not be verified" in page.text
    assert "<b>Down</b>" not in page.text and "&lt;b&gt;Down&lt;/b&gt;" in page.text
    assert "tether_session" not in client.cookies
    as_json = client.get("/api/auth/oidc/callback", params={"state": "forged"})
    assert as_json.status_code == 401 and as_json.json()["code"] == "bad_credentials"
    client.close()


def test_a_replayed_callback_signs_nobody_in(server: ServerProcess, provider: Provider) -> None:
    """The callback's URL replayed with the flow cookie it was sent with (a captured one):
    the provider refuses its code a second time, and nobody is signed in."""
    provider.user = {"sub": "u-rex", "preferred_username": "rex"}
    with httpx.Client(base_url=server.base_url, timeout=15) as client:
        start = client.get("/api/auth/oidc/login", params={"next": "/"})
        flow = client.cookies["tether_oidc"]
        back = urlsplit(httpx.get(start.headers["location"], timeout=15).headers["location"])
        callback = f"{back.path}?{back.query}"
        assert onward(client.get(callback)) == "/"
    with httpx.Client(
        base_url=server.base_url, timeout=15, cookies={"tether_oidc": flow}
    ) as replay:
        again = replay.get(callback)
        assert again.status_code == 401 and again.json()["code"] == "bad_credentials"
        assert "tether_session" not in replay.cookies
    assert provider.token_refusals[-1] == "code"


@pytest.mark.parametrize(
    ("flaw", "reason"),
    [
        ("wrong_nonce", "nonce"),
        ("no_nonce", "nonce"),
        ("expired", "expired"),
        ("wrong_audience", "aud"),
        ("audience_with_azp", "aud"),
        ("wrong_issuer", "iss"),
        ("bad_signature", "bad_signature"),
    ],
)
def test_an_id_token_that_does_not_verify_is_refused(
    server: ServerProcess, provider: Provider, flaw: str, reason: str
) -> None:
    name = f"user-{flaw.replace('_', '-')}"
    provider.user = {"sub": f"u-{flaw}", "preferred_username": name}
    provider.flaw = flaw
    client, done, code = sign_in(server)
    assert done.status_code == 401 and done.json()["code"] == "bad_credentials", done.text
    assert reason in done.json()["message"]  # refused for that reason, not another
    assert "tether_session" not in client.cookies
    assert code not in provider.codes  # it got as far as the token: the token is what failed
    assert name not in _users(server)
    client.close()


def test_only_allowed_groups_may_sign_in(provider: Provider, tmp_path: Path) -> None:
    args = _oidc_args(provider, "--oidc-allowed-group", "staff")
    with running_server(tmp_path / "data", *args, env=ENV) as srv:
        for groups in (["interns"], None):
            provider.user = {"sub": "u-ivy", "preferred_username": "ivy"}
            if groups is not None:
                provider.user["groups"] = groups
            client, done, _ = sign_in(srv)
            assert done.status_code == 403 and done.json()["code"] == "forbidden", done.text
            assert "tether_session" not in client.cookies
            client.close()
        assert "ivy" not in _users(srv)
        provider.user = {"sub": "u-ivy", "preferred_username": "ivy", "groups": ["staff"]}
        client, done, _ = sign_in(srv)
        assert onward(done) == "/" and client.get("/api/me").json()["username"] == "ivy"
        client.close()


def test_a_sign_in_lasts_oidc_session_hours_then_the_group_is_checked_again(
    provider: Provider, tmp_path: Path
) -> None:
    """Groups are checked at sign-in: a person the provider took out of the allowed group
    kept Tether for the cookie's 30 days. An OIDC sign-in lasts `--oidc-session-hours`; the
    page then goes back through the provider, which checks the groups anew."""
    args = _oidc_args(provider, "--oidc-allowed-group", "staff", "--oidc-session-hours", "0.001")
    with running_server(tmp_path / "data", *args, env=ENV) as srv:
        provider.user = {"sub": "u-ivy", "preferred_username": "ivy", "groups": ["staff"]}
        client, done, _ = sign_in(srv)
        assert onward(done) == "/"
        [cookie] = [c for c in done.headers.get_list("set-cookie") if "tether_session=" in c]
        assert "Max-Age=3;" in cookie or "Max-Age=4;" in cookie, cookie
        held = {"cookie": f"tether_session={client.cookies['tether_session']}"}
        me = srv.base_url + "/api/me"
        assert httpx.get(me, headers=held).status_code == 200
        # the browser drops it at its Max-Age; the server refuses it after that too
        wait_until(lambda: httpx.get(me, headers=held).status_code == 401, timeout=10)
        provider.user["groups"] = ["former-staff"]
        again, refused, _ = sign_in(srv)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        for c in (client, again):
            c.close()


def test_an_issuer_that_ends_with_a_slash_signs_people_in(
    provider: Provider, tmp_path: Path
) -> None:
    """Some providers' issuer ends with `/` (Auth0's does), and their ID tokens name it so:
    `--oidc-issuer` given as they write it must verify them. The discovery document is still
    found (`<issuer without the slash>/.well-known/openid-configuration`), and a token of
    another issuer is still refused."""
    provider.issuer_tail = "/"
    try:
        with running_server(tmp_path / "data", *_oidc_args(provider), env=ENV) as srv:
            provider.user = {"sub": "u-uma", "preferred_username": "uma"}
            client, done, _ = sign_in(srv)
            assert onward(done) == "/", done.text
            assert client.get("/api/me").json()["username"] == "uma"
            client.close()
            provider.flaw = "wrong_issuer"
            client, done, _ = sign_in(srv)
            assert done.status_code == 401 and "iss" in done.json()["message"], done.text
            client.close()
    finally:
        provider.issuer_tail = ""


def test_the_flow_cookie_is_secure_when_the_request_came_over_https(
    provider: Provider, tmp_path: Path
) -> None:
    """The `tether_oidc` cookie (the flow's state, nonce and PKCE verifier) is `Secure` when
    the request arrived over https, as a `--trusted-proxy`'s `X-Forwarded-Proto` says, like
    the session cookie (docs/security.md): a browser must never send it over plain http."""
    args = _oidc_args(provider, "--trusted-proxy", "127.0.0.1")
    with running_server(tmp_path / "data", *args, env=ENV) as srv, srv.client() as client:
        for proto, secure in (("https", True), ("http", False)):
            start = client.get(
                "/api/auth/oidc/login", params={"next": "/"}, headers={"X-Forwarded-Proto": proto}
            )
            assert start.status_code == 302, start.text
            assert start.headers["location"].startswith(provider.issuer)
            [cookie] = [c for c in start.headers.get_list("set-cookie") if "tether_oidc=" in c]
            attributes = [part.strip().lower() for part in cookie.split(";")]
            assert ("secure" in attributes) is secure, (proto, cookie)
            assert "httponly" in attributes and "samesite=lax" in attributes
            client.cookies.clear()


def test_a_provider_that_cannot_be_reached_answers_503_not_a_bug(
    provider: Provider, server: ServerProcess, tmp_path: Path
) -> None:
    """A provider that is down, that never answers, or whose token endpoint fails: the sign-in
    answers 503 `sign_in_unavailable` within the HTTP client's timeout (5 s), never 500
    `internal` (docs/api.md §2: 500 is a bug), and nobody is signed in."""
    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        for issuer in (
            f"http://127.0.0.1:{free_port()}",
            f"http://127.0.0.1:{silent.getsockname()[1]}",
        ):
            args = ("--auth", "oidc", "--oidc-issuer", issuer, "--oidc-client-id", CLIENT_ID)
            secret = ("--oidc-client-secret-env", "TETHER_TEST_OIDC_SECRET")
            with (
                running_server(tmp_path / issuer[-5:], *args, *secret, env=ENV) as srv,
                srv.client(timeout=30) as client,
            ):
                began = time.monotonic()
                answer = client.get("/api/auth/oidc/login", params={"next": "/"})
                assert answer.status_code == 503, answer.text
                assert answer.json()["code"] == "sign_in_unavailable"
                assert time.monotonic() - began < 15
    finally:
        silent.close()
    provider.flaw = "token_down"  # the provider fails between the redirect and the callback
    provider.user = {"sub": "u-tom", "preferred_username": "tom"}
    client, done, _ = sign_in(server)
    assert done.status_code == 503 and done.json()["code"] == "sign_in_unavailable", done.text
    assert "tether_session" not in client.cookies and "tom" not in _users(server)
    client.close()


def test_serve_refuses_oidc_without_its_settings(tmp_path: Path) -> None:
    for extra, message in (
        (["--auth", "oidc"], "needs --oidc-issuer, --oidc-client-id"),
        (
            [
                "--auth",
                "oidc",
                "--oidc-issuer",
                "http://127.0.0.1:9",
                "--oidc-client-id",
                "x",
                "--oidc-client-secret-env",
                "TETHER_TEST_NOT_SET",
            ],
            "TETHER_TEST_NOT_SET",
        ),
    ):
        server = ServerProcess(tmp_path / "data", *extra)
        with pytest.raises(RuntimeError) as failed:
            server.start(timeout=20)
        assert message in str(failed.value)
