"""Layer: the log's ownership filter (log/ownership.py, docs/api.md §15) under the routes
added beside accounts: search, export and import (§12) and the server's defaults. Over real
HTTP against a real `tether serve --auth accounts`, as alice (an admin) and bob, with a
cookie and with a token. Invariant: another person's sessions are not there for you, in
what you find, what you download and what you import; an import's "imported before" and its
progress are per person; the server-wide defaults are an admin's to change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tether.log.sqlite_search import RANKED_MAX

from accounts_kit import add_user, bearer, new_token, sign_in
from chatgpt_kit import Conversation
from helpers import ServerProcess, new_session, running_server, start_turn, wait_idle

pytestmark = pytest.mark.slow


@dataclass
class People:
    server: ServerProcess
    alice: httpx.Client
    bob: httpx.Client  # a cookie
    bob_token: httpx.Client


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Iterator[People]:
    data = tmp_path_factory.mktemp("owned") / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with running_server(data, "--auth", "accounts") as srv:
        alice = sign_in(srv, "alice")
        bob = sign_in(srv, "bob")
        bob_token = bearer(srv, new_token(bob, "bob's script")["token"])
        yield People(srv, alice, bob, bob_token)
        for client in (alice, bob, bob_token):
            client.close()


def _ids(client: httpx.Client) -> set[str]:
    rows = client.get("/api/sessions").json()["sessions"]
    rows += client.get("/api/sessions", params={"archived": 1}).json()["sessions"]
    return {row["session_id"] for row in rows}


def _session_with(client: httpx.Client, title: str, words: str) -> str:
    sid = new_session(client, title)
    start_turn(client, sid, words)
    wait_idle(client, sid)
    return sid


def _import(client: httpx.Client, body: bytes, status: int, **params: str) -> dict:
    response = client.post("/api/sessions/import", content=body, params=params)
    assert response.status_code == status, response.text
    return response.json()


def test_search_finds_only_the_searchers_own_rows(people: People) -> None:
    hers = _session_with(people.alice, "hers", "marmalade quasar of alice")
    his = _session_with(people.bob, "his", "marmalade quasar of bob")
    for client, own in ((people.alice, hers), (people.bob, his), (people.bob_token, his)):
        response = client.get("/api/search", params={"q": "marmalade quasar"})
        assert response.status_code == 200, response.text
        found = response.json()["results"]
        assert found and {hit["session_id"] for hit in found} == {own}
    # words only she wrote: nothing at all for him, as for words nobody wrote
    for client in (people.bob, people.bob_token):
        for q in ("alice marmalade", "nobody wrote this"):
            response = client.get("/api/search", params={"q": q})
            assert response.status_code == 200 and response.json() == {"results": []}


def test_another_persons_many_matches_do_not_hide_the_searchers_own(people: People) -> None:
    """A query matching more rows than are ranked (docs/api.md §13) ranks the newest of the
    searcher's own rows: another person's newer matches, however many, take none of her
    results away."""
    hers = _session_with(people.alice, "hers", "periwinkle lantern of alice")
    conversation = Conversation("his many", 1_700_000_000)
    for n in range(RANKED_MAX + 5):
        conversation.add("user", f"periwinkle lantern number {n}")
    _import(people.bob, json.dumps([conversation.data]).encode(), 201)
    response = people.alice.get("/api/search", params={"q": "periwinkle lantern"}, timeout=60)
    assert response.status_code == 200, response.text
    assert {hit["session_id"] for hit in response.json()["results"]} == {hers}


def test_export_holds_only_the_callers_sessions(people: People) -> None:
    hers = _session_with(people.alice, "her export", "alice's ledger 4411")
    his = _session_with(people.bob, "his export", "bob's ledger 5522")
    for client in (people.bob, people.bob_token):
        everything = client.get("/api/export")
        assert everything.status_code == 200
        lines = [json.loads(line) for line in everything.text.splitlines()]
        assert his in {entry["session_id"] for entry in lines}
        assert {entry["session_id"] for entry in lines} <= _ids(people.bob)
        assert hers not in everything.text and "alice's ledger" not in everything.text
        for fmt in ("json", "markdown"):
            one = client.get(f"/api/sessions/{hers}/export", params={"format": fmt})
            assert one.status_code == 404 and one.json()["code"] == "session_not_found"
            assert "alice's ledger" not in one.text
    mine = people.alice.get("/api/export").text
    assert hers in mine and his not in mine and "bob's ledger" not in mine


def test_the_same_file_imported_by_two_people_makes_a_copy_for_each(people: People) -> None:
    source = _session_with(people.alice, "shared file", "a file both of them have 7788")
    file = people.alice.get(f"/api/sessions/{source}/export").content
    alice_before = _ids(people.alice)

    his = _import(people.bob, file, 201)
    assert his["created"] == 1 and his["existing"] == 0
    his_copy = his["sessions"][0]["session_id"]
    assert his_copy in _ids(people.bob) and _ids(people.alice) == alice_before
    looked = people.alice.get("/api/session", params={"session_id": his_copy})
    assert looked.status_code == 404 and looked.json()["code"] == "session_not_found"

    # hers is her own copy: neither refused as imported before nor answered with his row
    first = _import(people.alice, file, 201)
    assert first["created"] == 1 and first["existing"] == 0
    her_copy = first["sessions"][0]["session_id"]
    assert her_copy not in (his_copy, source) and her_copy in _ids(people.alice)
    assert her_copy not in _ids(people.bob)

    # and each one's second import is idempotent within their own sessions
    again = _import(people.alice, file, 200)
    assert [row["session_id"] for row in again["sessions"]] == [her_copy]
    for client in (people.bob, people.bob_token):
        his_again = _import(client, file, 200)
        assert [row["session_id"] for row in his_again["sessions"]] == [his_copy]
    assert _ids(people.alice) == alice_before | {her_copy}


def test_import_progress_is_per_person(people: People, tmp_path: Path) -> None:
    his_file = people.bob.get(
        f"/api/sessions/{_session_with(people.bob, 'his', 'his progress 1')}/export"
    ).content
    _import(people.bob, his_file, 201, import_id="same-import-id")
    missing = people.alice.get("/api/imports/same-import-id")
    assert missing.status_code == 404 and missing.json()["code"] == "import_not_found"

    # the same id for her is her job, and his stays his
    her_file = people.alice.get(
        f"/api/sessions/{_session_with(people.alice, 'hers', 'her progress 2')}/export"
    ).content
    _import(people.alice, her_file, 201, import_id="same-import-id")
    _import(people.alice, her_file, 200, import_id="same-import-id")
    hers = people.alice.get("/api/imports/same-import-id").json()
    assert hers["phase"] == "done" and (hers["created"], hers["existing"]) == (0, 1)
    for client in (people.bob, people.bob_token):
        his = client.get("/api/imports/same-import-id").json()
        assert his["phase"] == "done" and (his["created"], his["existing"]) == (1, 0)


def test_only_an_admin_changes_the_servers_defaults(people: People) -> None:
    before = people.alice.get("/api/settings").json()
    for client in (people.bob, people.bob_token):
        refused = client.patch(
            "/api/settings", json={"default_system_prompt": "bob's rules", "default_model": "x"}
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "forbidden" and refused.json()["message"]
        assert client.get("/api/settings").json() == before  # reading is everyone's
    assert people.alice.get("/api/settings").json() == before  # nothing saved

    changed = people.alice.patch("/api/settings", json={"default_system_prompt": "be brief"})
    assert changed.status_code == 200, changed.text
    seen = people.bob.get("/api/settings").json()
    assert seen == changed.json() and seen != before
    restored = people.alice.patch("/api/settings", json={"default_system_prompt": None})
    assert restored.status_code == 200


def test_behind_a_trusted_proxy_too_only_an_admin_changes_the_defaults(tmp_path: Path) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    header = "X-Forwarded-User"
    proxy = ("--auth", "trusted-header", "--trusted-proxy", "127.0.0.1")
    with (
        running_server(data, *proxy) as srv,
        srv.client(headers={header: "alice"}) as alice,
        srv.client(headers={header: "dora"}) as dora,  # made at her first request, no admin
    ):
        assert dora.get("/api/me").json() == {"username": "dora", "admin": False}
        before = dora.get("/api/settings").json()
        refused = dora.patch("/api/settings", json={"default_model": "dora-model"})
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        assert alice.get("/api/settings").json() == before
        saved = alice.patch("/api/settings", json={"default_model": "alice-model"})
        assert saved.status_code == 200 and saved.json()["default_model"] == "alice-model"
    # saved for everyone: it survives a restart and dora reads it
    with running_server(data, *proxy) as srv, srv.client(headers={header: "dora"}) as dora:
        assert dora.get("/api/settings").json()["default_model"] == "alice-model"
