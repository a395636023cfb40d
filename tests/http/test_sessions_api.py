"""Layer: HTTP sessions API (docs/api.md §3) over real HTTP against a real server process, and the
sidebar layer's invariant 4: maintenance and reads never move `updated_at` or list order."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tether.events import SUMMARY_PREFIX

from helpers import (
    ServerProcess,
    read_events,
    rotated_conversation,
    session_body,
)


def create(client: httpx.Client, title: str | None = None) -> dict:
    body = {} if title is None else {"title": title}
    response = client.post("/api/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["session"]


def test_create_get_patch_list_delete_round_trip(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        row = create(client, "Groceries")
        sid = row["session_id"]
        assert row["title"] == "Groceries" and row["message_count"] == 0
        assert row["busy"] is False and row["active_stream_id"] is None
        body = client.get("/api/session", params={"session_id": sid}).json()["session"]
        assert body["messages"] == [] and body["live"] is None and body["last_seq"] == 1
        assert body["pending_user_message"] is None and body["pending_attachments"] == []
        patched = client.patch(
            "/api/session", json={"session_id": sid, "title": "  Food  ", "pinned": True}
        ).json()["session"]
        assert patched["title"] == "Food" and patched["pinned"] is True
        listed = client.get("/api/sessions").json()["sessions"]
        assert listed[0]["session_id"] == sid  # pinned first
        client.patch("/api/session", json={"session_id": sid, "archived": True})
        assert sid not in [r["session_id"] for r in client.get("/api/sessions").json()["sessions"]]
        archived = client.get("/api/sessions", params={"archived": 1}).json()["sessions"]
        assert [r["session_id"] for r in archived] == [sid]
        assert client.delete("/api/session", params={"session_id": sid}).json() == {"ok": True}
        gone = client.get("/api/session", params={"session_id": sid})
        assert gone.status_code == 404 and gone.json()["code"] == "session_not_found"


def test_untitled_session_is_called_new_chat(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        assert create(client)["title"] == "New chat"
        assert client.post("/api/sessions").status_code == 201  # no body at all


def test_search_matches_titles_case_insensitively(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = create(client, "Quarterly PLANNING notes")["session_id"]
        create(client, "Something else")
        found = client.get("/api/sessions", params={"q": "planning"}).json()["sessions"]
        assert [r["session_id"] for r in found] == [sid]
        assert client.get("/api/sessions", params={"q": "zzzz-nothing"}).json()["sessions"] == []


def test_patch_with_no_change_appends_nothing(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = create(client, "Same")["session_id"]
        client.patch("/api/session", json={"session_id": sid, "title": "Same"})
        status = client.get("/api/session/status", params={"session_id": sid}).json()
        assert status == {"busy": False, "active_stream_id": None, "phase": "idle", "last_seq": 1}


def test_truncate_without_messages_to_drop_changes_nothing(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = create(client)["session_id"]
        row = client.post("/api/session/truncate", json={"session_id": sid, "keep_count": 0})
        assert row.status_code == 200
        assert row.json()["session"]["transcript_generation"] == 0


BAD_REQUESTS = [
    (
        "post",
        "/api/sessions",
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        400,
        "invalid_request",
    ),
    ("post", "/api/sessions", {"json": {"title": 12}}, 400, "invalid_request"),
    ("post", "/api/sessions", {"json": {"title": "   "}}, 400, "invalid_request"),
    ("post", "/api/sessions", {"json": {"title": "x" * 201}}, 400, "invalid_request"),
    ("post", "/api/sessions", {"json": ["a", "list"]}, 400, "invalid_request"),
    ("get", "/api/session", {"params": {"session_id": "bad id!"}}, 400, "invalid_request"),
    ("get", "/api/session", {"params": {"session_id": "x" * 65}}, 400, "invalid_request"),
    ("get", "/api/session", {}, 400, "invalid_request"),
    ("get", "/api/session", {"params": {"session_id": "unknown"}}, 404, "session_not_found"),
    (
        "get",
        "/api/session/context",
        {"params": {"session_id": "unknown"}},
        404,
        "session_not_found",
    ),
    ("get", "/api/session/status", {"params": {"session_id": "unknown"}}, 404, "session_not_found"),
    ("get", "/api/sessions/unknown/events", {}, 404, "session_not_found"),
    ("get", "/api/sessions/bad$id/events", {}, 400, "invalid_request"),
    (
        "patch",
        "/api/session",
        {"json": {"session_id": "unknown", "title": "x"}},
        404,
        "session_not_found",
    ),
    ("patch", "/api/session", {"json": {"session_id": "{sid}"}}, 400, "invalid_request"),
    (
        "patch",
        "/api/session",
        {"json": {"session_id": "{sid}", "pinned": "yes"}},
        400,
        "invalid_request",
    ),
    (
        "patch",
        "/api/session",
        {"json": {"session_id": "{sid}", "title": " \n\t"}},
        400,
        "invalid_request",
    ),
    ("patch", "/api/session", {"json": {"session_id": 5, "title": "x"}}, 400, "invalid_request"),
    ("delete", "/api/session", {"params": {"session_id": "unknown"}}, 404, "session_not_found"),
    (
        "post",
        "/api/session/truncate",
        {"json": {"session_id": "{sid}", "keep_count": -1}},
        400,
        "invalid_request",
    ),
    (
        "post",
        "/api/session/truncate",
        {"json": {"session_id": "{sid}", "keep_count": 10**12}},
        400,
        "invalid_request",
    ),
    (
        "post",
        "/api/session/truncate",
        {"json": {"session_id": "{sid}", "keep_count": 5}},
        400,
        "invalid_request",
    ),
    (
        "post",
        "/api/session/truncate",
        {"json": {"session_id": "{sid}", "keep_count": "1"}},
        400,
        "invalid_request",
    ),
    (
        "post",
        "/api/session/truncate",
        {"json": {"session_id": "unknown", "keep_count": 0}},
        404,
        "session_not_found",
    ),
    ("get", "/api/no-such-route", {}, 404, "not_found"),
    ("put", "/api/session", {}, 405, "method_not_allowed"),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "code"), BAD_REQUESTS)
def test_bad_input_gets_a_clear_error_and_changes_nothing(
    shared_server: ServerProcess, method: str, path: str, kwargs: dict, status: int, code: str
) -> None:
    with shared_server.client() as client:
        sid = create(client, "Target")["session_id"]
        before_list = client.get("/api/sessions").json()
        before = client.get("/api/session", params={"session_id": sid}).json()
        if "json" in kwargs and isinstance(kwargs["json"], dict):
            kwargs = {
                **kwargs,
                "json": {k: (sid if v == "{sid}" else v) for k, v in kwargs["json"].items()},
            }
        response = client.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        body = response.json()
        assert body["code"] == code and body["message"]
        assert client.get("/api/session", params={"session_id": sid}).json() == before
        assert client.get("/api/sessions").json() == before_list


def test_oversized_body_is_413_and_changes_nothing(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        before = client.get("/api/sessions").json()
        response = client.post(
            "/api/sessions",
            content=b'{"title": "' + b"x" * (31 * 2**20) + b'"}',
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 413
        assert response.json()["code"] == "payload_too_large"
        assert client.get("/api/sessions").json() == before


def test_reads_renames_pins_and_restart_never_move_updated_at(server: ServerProcess) -> None:
    """Contract invariant 4 over the API: maintenance is not activity."""
    with server.client() as client:
        older = create(client, "Older")["session_id"]
        time.sleep(0.02)
        newer = create(client, "Newer")["session_id"]

        def observed() -> tuple[list[str], dict[str, tuple]]:
            rows = client.get("/api/sessions").json()["sessions"]
            return (
                [r["session_id"] for r in rows],
                {r["session_id"]: (r["updated_at"], r["last_message_at"]) for r in rows},
            )

        order, stamps = observed()
        assert order == [newer, older]
        for _ in range(3):
            client.get("/api/session", params={"session_id": older})
            client.get("/api/session/context", params={"session_id": older})
            client.get("/api/session/status", params={"session_id": older})
        client.patch("/api/session", json={"session_id": older, "title": "Renamed"})
        client.patch("/api/session", json={"session_id": older, "archived": True})
        client.patch("/api/session", json={"session_id": older, "archived": False})
        assert observed() == (order, stamps)
    server.restart()
    with server.client() as client:
        assert observed() == (order, stamps)
        rows = client.get("/api/sessions").json()["sessions"]
        assert rows[1]["title"] == "Renamed"


def test_truncate_on_a_rotated_parent_is_refused_before_any_mutation(tmp_path: Path) -> None:
    """Contract "Inactive compression continuation recovery": regeneration semantics are not
    silently retargeted, removed rows never reappear. A transcript-changing command on a
    rotated parent gets 409 `session_rotated` with the continuation, and nothing changes:
    not the parent's generation, rows or log, not the child's history or model context."""
    with rotated_conversation(tmp_path / "data") as (client, parent, child):

        def observed() -> tuple:
            return (
                session_body(client, parent),
                [
                    f
                    for f in read_events(client, parent, after="0", stop_on="heartbeat")
                    if f.get("id")
                ],
                session_body(client, child),
                client.get("/api/session/context", params={"session_id": child}).json(),
            )

        before = observed()
        assert before[0]["transcript_generation"] == 0 and len(before[0]["messages"]) == 2
        assert before[3]["context_messages"][0]["content"].startswith(SUMMARY_PREFIX)
        for keep_count in (0, 1, 2, 3):  # shrinking, a no-op, and too many: refused alike
            response = client.post(
                "/api/session/truncate", json={"session_id": parent, "keep_count": keep_count}
            )
            assert response.status_code == 409, response.text
            assert response.json()["code"] == "session_rotated"
            assert response.json()["continuation_session_id"] == child
        for path in ("/api/chat/start", "/api/chat/queue"):  # the other transcript changes
            response = client.post(path, json={"session_id": parent, "message": "stale tab"})
            assert response.status_code == 409, response.text
            assert response.json()["continuation_session_id"] == child
        assert observed() == before
        # The continuation itself is not rotated: truncating it works as usual.
        response = client.post("/api/session/truncate", json={"session_id": child, "keep_count": 0})
        assert response.status_code == 200, response.text


def test_a_method_the_route_does_not_take_names_the_ones_it_does(
    shared_server: ServerProcess,
) -> None:
    """A 405 keeps the `Allow` header (RFC 9110), so a client can tell what would work."""
    with shared_server.client() as client:
        response = client.put("/api/session")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"
    assert "GET" in {m.strip() for m in response.headers["allow"].split(",")}
