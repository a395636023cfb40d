"""Layer: the log's ownership filter (log/ownership.py) as every route and stream shows it
(docs/api.md §15), over real HTTP against a real `tether serve --auth accounts`.

The walk reads the server's own OpenAPI document, so a route added later without an entry in
`ROUTES` fails `test_every_route_of_the_openapi_document_is_walked` until someone says how it
is called. Each route is called as bob, with a cookie and with a token, once with alice's ids
and once with ids nobody holds: both answers must be the same once the ids are swapped (so
alice's session, run, upload, queued message and token do not exist for him), none of
alice's secrets may appear, and afterwards nothing of alice's has changed: her sidebar, her
transcript, her log position, her live run (still waiting for her approval), her queue and
her tokens. Both event streams are followed as bob while alice works: he hears nothing of it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from pg import database

from accounts_kit import OpenStream, add_user, bearer, new_token, sign_in
from helpers import ServerProcess, iter_sse, new_session, running_server, start_turn, wait_idle

pytestmark = pytest.mark.slow

SECRET_TEXT = "alice's secret plan 7f3a"
SECRET_FILE = "alice-salary.txt"
QUEUED_TEXT = "alice's queued thought 91b2"


@dataclass
class Ids:
    session: str
    idle_session: str
    stream: str
    attachment: str
    queue: str
    token: str
    row: str  # her idle session's user row (edit_of)
    answer: str  # its answer, regenerated once: it carries `branch`
    import_: str  # the id she gave an import of hers
    approval: str = "ap1"


def _unknown(ids: Ids) -> Ids:
    def fresh(prefix: str) -> str:
        return f"{prefix}_{secrets.token_hex(12)}"

    return Ids(
        fresh("s"),
        fresh("s"),
        fresh("r"),
        fresh("a"),
        fresh("q"),
        fresh("tok"),
        fresh("row"),
        fresh("row"),
        fresh("imp"),
        "ap9",
    )


# (method, path template) -> how bob calls it: (path, params, json) from a set of ids.
Call = Callable[[Ids], tuple[str, dict | None, dict | None]]
ROUTES: dict[tuple[str, str], Call] = {
    ("GET", "/api/sessions"): lambda i: ("/api/sessions", {"q": "secret"}, None),
    ("POST", "/api/sessions"): lambda i: ("/api/sessions", None, {"title": "bob's own"}),
    ("GET", "/api/session"): lambda i: ("/api/session", {"session_id": i.session}, None),
    ("PATCH", "/api/session"): lambda i: (
        "/api/session",
        None,
        {"session_id": i.idle_session, "title": "taken by bob", "pinned": True},
    ),
    ("DELETE", "/api/session"): lambda i: ("/api/session", {"session_id": i.idle_session}, None),
    ("GET", "/api/session/context"): lambda i: (
        "/api/session/context",
        {"session_id": i.session},
        None,
    ),
    ("POST", "/api/session/truncate"): lambda i: (
        "/api/session/truncate",
        None,
        {"session_id": i.idle_session, "keep_count": 0},
    ),
    ("GET", "/api/session/status"): lambda i: (
        "/api/session/status",
        {"session_id": i.session},
        None,
    ),
    ("GET", "/api/models"): lambda i: ("/api/models", None, None),
    ("POST", "/api/chat/start"): lambda i: (
        "/api/chat/start",
        None,
        {"session_id": i.idle_session, "message": "bob was here"},
    ),
    ("POST", "/api/chat/steer"): lambda i: (
        "/api/chat/steer",
        None,
        {"stream_id": i.stream, "text": "bob steers"},
    ),
    ("POST", "/api/chat/approve"): lambda i: (
        "/api/chat/approve",
        None,
        {"stream_id": i.stream, "approval_id": i.approval, "choice": "deny"},
    ),
    ("POST", "/api/chat/answer"): lambda i: (
        "/api/chat/answer",
        None,
        {"stream_id": i.stream, "question_id": "q1", "text": "bob answers"},
    ),
    ("POST", "/api/chat/queue"): lambda i: (
        "/api/chat/queue",
        None,
        {"session_id": i.session, "message": "bob queues"},
    ),
    ("PATCH", "/api/chat/queue"): lambda i: (
        "/api/chat/queue",
        {"queue_id": i.queue},
        {"text": "bob edits"},
    ),
    ("DELETE", "/api/chat/queue"): lambda i: ("/api/chat/queue", {"queue_id": i.queue}, None),
    ("POST", "/api/chat/queue/start"): lambda i: (
        "/api/chat/queue/start",
        None,
        {"queue_id": i.queue},
    ),
    ("POST", "/api/chat/cancel"): lambda i: ("/api/chat/cancel", None, {"stream_id": i.stream}),
    ("GET", "/api/attachments/{attachment_id}"): lambda i: (
        f"/api/attachments/{i.attachment}",
        {"session_id": i.session},
        None,
    ),
    ("GET", "/api/sessions/{session_id}/events"): lambda i: (
        f"/api/sessions/{i.session}/events",
        {"after": "0"},
        None,
    ),
    ("GET", "/api/events"): lambda i: ("/api/events", None, None),  # followed below
    ("POST", "/api/render"): lambda i: ("/api/render", None, {"texts": [f"**{i.session}**"]}),
    ("GET", "/api/me"): lambda i: ("/api/me", None, None),
    # the caller's own password: a new one too short, refused before the current one is
    # checked (a wrong one would count as bob's failed logins)
    ("POST", "/api/me/password"): lambda i: (
        "/api/me/password",
        None,
        {"current_password": "not bob's", "new_password": "short"},
    ),
    ("GET", "/api/users"): lambda i: ("/api/users", None, None),
    ("POST", "/api/users"): lambda i: (
        "/api/users",
        None,
        {"username": "mallory", "password": "mallory-pass", "admin": True},
    ),
    ("DELETE", "/api/users/{username}"): lambda i: ("/api/users/alice", None, None),
    ("GET", "/api/tokens"): lambda i: ("/api/tokens", None, None),
    ("POST", "/api/tokens"): lambda i: ("/api/tokens", None, {"name": "bob's"}),
    ("DELETE", "/api/tokens/{token_id}"): lambda i: (f"/api/tokens/{i.token}", None, None),
    ("GET", "/api/search"): lambda i: ("/api/search", {"q": "secret plan"}, None),
    ("GET", "/api/settings"): lambda i: ("/api/settings", None, None),
    # server-wide: an admin's (403 `forbidden` for bob either way)
    ("PATCH", "/api/settings"): lambda i: (
        "/api/settings",
        None,
        {"default_system_prompt": "bob rules the server"},
    ),
    ("GET", "/api/sessions/{session_id}/export"): lambda i: (
        f"/api/sessions/{i.session}/export",
        None,
        None,
    ),
    ("GET", "/api/export"): lambda i: ("/api/export", None, None),
    # under the id of alice's import, a file refused: her progress must stay hers
    ("POST", "/api/sessions/import"): lambda i: (
        "/api/sessions/import",
        {"import_id": i.import_},
        {"format": "not-tether"},
    ),
    ("GET", "/api/imports/{import_id}"): lambda i: (f"/api/imports/{i.import_}", None, None),
    ("POST", "/api/chat/regenerate"): lambda i: (
        "/api/chat/regenerate",
        None,
        {"session_id": i.idle_session, "row_id": i.answer},
    ),
    ("POST", "/api/session/branch"): lambda i: (
        "/api/session/branch",
        None,
        {"session_id": i.idle_session, "row_id": i.answer, "index": 1},
    ),
}
# Routes about the caller's own sign-in, not about anyone's data (tests/http/test_accounts.py).
NOT_WALKED = {
    ("GET", "/api/health"),
    ("POST", "/api/auth/login"),
    ("POST", "/api/auth/logout"),
    ("GET", "/api/auth/status"),
}
# Also cancel by session, the other way to name a run.
# Also cancel by session, the other way to name a run; regenerate's default row (the last
# answer); and an edit of her message (edit_of on chat/start).
EXTRA: list[Call] = [
    lambda i: ("/api/chat/cancel", None, {"session_id": i.session}),
    lambda i: ("/api/chat/regenerate", None, {"session_id": i.idle_session}),
    lambda i: (
        "/api/chat/start",
        None,
        {"session_id": i.idle_session, "message": "bob's edit", "edit_of": i.row},
    ),
]


@dataclass
class World:
    server: ServerProcess
    alice: httpx.Client
    bob_cookie: httpx.Client
    bob_token: httpx.Client
    ids: Ids
    secrets: list[str]


def _snapshot(world: World) -> dict:
    alice, ids = world.alice, world.ids
    view = alice.get("/api/session", params={"session_id": ids.session}).json()["session"]
    idle = alice.get("/api/session", params={"session_id": ids.idle_session}).json()["session"]
    return {
        "sessions": alice.get("/api/sessions").json(),
        "view": view,
        "idle": idle,
        "status": alice.get("/api/session/status", params={"session_id": ids.session}).json(),
        "tokens": alice.get("/api/tokens").json(),
        "users": alice.get("/api/users").json(),
        "settings": alice.get("/api/settings").json(),
        "import": alice.get(f"/api/imports/{ids.import_}").json(),
        "export": [_unstamped(line) for line in alice.get("/api/export").text.splitlines()],
    }


def _unstamped(line: str) -> dict:
    entry = json.loads(line)
    entry.pop("exported_at")  # when it was asked for, not what it holds
    return entry


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """The walk runs on both backends: ownership is the store's, on each of them."""
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(database()) if request.param == "postgresql" else ""
        yield stack.enter_context(_world(tmp_path_factory, url))


@contextlib.contextmanager
def _world(tmp_path_factory: pytest.TempPathFactory, url: str) -> Iterator[World]:
    data = tmp_path_factory.mktemp("walk") / "data"
    add_user(data, "alice", admin=True, database_url=url)
    add_user(data, "bob", database_url=url)
    backend = ("--database-url", url) if url else ()
    with running_server(data, "--auth", "accounts", *backend) as srv:
        alice = sign_in(srv, "alice")
        sid = new_session(alice, "alice's plans")
        upload = {
            "name": SECRET_FILE,
            "mime": "text/plain",
            "data_base64": base64.b64encode(b"salary 2026").decode(),
        }
        start_turn(alice, sid, SECRET_TEXT, attachments=[upload])
        attachment = wait_idle(alice, sid)["messages"][0]["attachments"][0]["id"]
        stream = start_turn(alice, sid, "/approve")["stream_id"]  # waits for her answer
        deadline = time.monotonic() + 10
        while alice.get("/api/session/status", params={"session_id": sid}).json()["phase"] != (
            "running"
        ):
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # the approval prompt is open
        queued = alice.post("/api/chat/queue", json={"session_id": sid, "message": QUEUED_TEXT})
        assert queued.status_code == 200, queued.text
        idle = new_session(alice, "alice's idle")
        start_turn(alice, idle, "alice's idle words")
        row, answer = (m["id"] for m in wait_idle(alice, idle)["messages"])
        again = alice.post("/api/chat/regenerate", json={"session_id": idle, "row_id": answer})
        assert again.status_code == 200, again.text
        shown = wait_idle(alice, idle)["messages"]
        assert shown[1]["branch"] == {"index": 2, "count": 2}, shown
        import_id = f"imp_{secrets.token_hex(8)}"
        export = alice.get(f"/api/sessions/{idle}/export").content
        mine = alice.post("/api/sessions/import", content=export, params={"import_id": import_id})
        assert mine.status_code == 201, mine.text
        token = new_token(alice, "alice's laptop")
        queue = queued.json()["queue_id"]
        ids = Ids(sid, idle, stream, attachment, queue, token["token_id"], row, answer, import_id)
        bob_cookie = sign_in(srv, "bob")
        bob_token = bearer(srv, new_token(bob_cookie, "bob's script")["token"])
        hidden = [
            sid,
            idle,
            stream,
            attachment,
            ids.queue,
            ids.token,
            ids.row,
            ids.answer,
            ids.import_,
            token["token"],
            SECRET_TEXT,
            SECRET_FILE,
            QUEUED_TEXT,
            "alice's plans",
        ]
        yield World(srv, alice, bob_cookie, bob_token, ids, hidden)
        for client in (alice, bob_cookie, bob_token):
            client.close()


def _call(client: httpx.Client, method: str, call: Call, ids: Ids) -> httpx.Response:
    path, params, body = call(ids)
    if path.endswith("/events"):
        with client.stream(method, path, params=params, timeout=5) as response:
            if response.status_code != 200:
                response.read()
                return response
            # A stream that opened: read its first frames only (it does not end).
            text = ""
            for frame in iter_sse(response):
                text += repr(dict(frame))
                if frame.event == "heartbeat":
                    break
            return httpx.Response(200, text=text)
    return client.request(method, path, params=params, json=body)


def _masked(text: str, ids: Ids) -> str:
    names = ("session", "idle_session", "stream", "attachment", "queue", "token", "row")
    for name in (*names, "answer", "import_", "approval"):
        text = text.replace(getattr(ids, name), f"<{name}>")
    return text


def test_every_route_of_the_openapi_document_is_walked(world: World) -> None:
    document = world.bob_cookie.get("/api/openapi.json").json()
    routes = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    missing = routes - set(ROUTES) - NOT_WALKED
    assert not missing, f"say how another user calls these routes (ROUTES): {sorted(missing)}"
    assert set(ROUTES) <= routes  # no entry for a route that is gone


@pytest.mark.parametrize("credential", ["cookie", "token"])
def test_another_user_meets_nothing_of_alices_on_any_route(world: World, credential: str) -> None:
    bob = world.bob_cookie if credential == "cookie" else world.bob_token
    before = _snapshot(world)
    unknown = _unknown(world.ids)
    calls = [(key[0], call) for key, call in ROUTES.items()] + [("POST", c) for c in EXTRA]
    for method, call in calls:
        as_alices = _call(bob, method, call, world.ids)
        as_nobodys = _call(bob, method, call, unknown)
        where = f"{method} {call(world.ids)[0]}"
        assert as_alices.status_code == as_nobodys.status_code, (where, as_alices.text)
        if call(world.ids) != call(unknown):  # it names something of alice's
            mine = _masked(as_alices.text, world.ids)
            assert mine == _masked(as_nobodys.text, unknown), where
        sent = str(call(world.ids))
        for secret in world.secrets:
            if secret not in sent:  # what bob sent is echoed back ("no session s_...")
                assert secret not in as_alices.text, (where, secret)
    assert _snapshot(world) == before  # nothing of alice's changed


def test_another_users_streams_hear_nothing_of_alices_work(world: World) -> None:
    bobs_own = new_session(world.bob_cookie, "bob's")
    sidebar = OpenStream(world.bob_token, "/api/events")
    own_stream = OpenStream(world.bob_cookie, f"/api/sessions/{bobs_own}/events?sidebar=1")
    alices = OpenStream(world.alice, "/api/events")
    time.sleep(0.3)
    renamed = "renamed 5c1d"
    patched = world.alice.patch(
        "/api/session", json={"session_id": world.ids.idle_session, "title": renamed}
    )
    assert patched.status_code == 200
    extra = new_session(world.alice, "alice's third")
    assert world.alice.delete("/api/session", params={"session_id": extra}).status_code == 200
    start_turn(world.bob_cookie, bobs_own, "bob's own words")  # bob hears his own
    wait_idle(world.bob_cookie, bobs_own)
    time.sleep(1.0)
    heard = "\n".join(alices.raw)
    assert renamed in heard and extra in heard  # alice heard her work (so the check can see)
    for stream in (sidebar, own_stream):
        assert bobs_own in "\n".join(stream.raw) and "heartbeat" in stream.frames
        for frame in stream.raw:
            for secret in (*world.secrets, extra, renamed):
                assert secret not in frame
    titles = {r["title"] for r in world.bob_token.get("/api/sessions").json()["sessions"]}
    assert titles <= {"bob's", "bob's own"}


def test_alices_run_was_left_to_her(world: World) -> None:
    """After the walk her approval prompt is still hers to answer, her queued message still
    waits, and the run ends as she says."""
    answered = world.alice.post(
        "/api/chat/approve",
        json={"stream_id": world.ids.stream, "approval_id": "ap1", "choice": "deny"},
    )
    assert answered.json()["accepted"] is True
    body = wait_idle(world.alice, world.ids.session)
    deadline = time.monotonic() + 20
    while body["queued"] and time.monotonic() < deadline:  # the engine starts the queued
        time.sleep(0.05)  # message after the run has let go of the session: a moment idle
        body = wait_idle(world.alice, world.ids.session)
    texts = " ".join(str(m) for m in body["messages"])
    assert QUEUED_TEXT in texts and "bob" not in texts
