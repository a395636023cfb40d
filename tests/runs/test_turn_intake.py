"""Layers: log + attachments. A refused start leaves no trace (docs/api.md §4); attachments are
stored once beside the log and served only with safe headers."""

from __future__ import annotations

import base64
import json

import pytest

from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def upload(name: str, mime: str, data: bytes) -> dict:
    return {"name": name, "mime": mime, "data_base64": base64.b64encode(data).decode()}


BAD_STARTS = [
    ({"message": ""}, 400, "invalid_request"),
    ({"message": "  \n\t "}, 400, "invalid_request"),
    ({"message": 42}, 400, "invalid_request"),
    ({"message": "x" * 200_001}, 413, "payload_too_large"),
    (
        {"message": "hi", "attachments": [upload("a.bin", "application/x-msdownload", b"MZ")]},
        400,
        "invalid_request",
    ),
    *(  # a type that is no media type (a header's line break, no subtype) is not stored
        ({"message": "hi", "attachments": [upload("a.txt", mime, b"x")]}, 400, "invalid_request")
        for mime in ("text/plain\r\nX-Evil: 1", "text", "text/plain\x00", "text/ plain", "/plain")
    ),
    (
        {
            "message": "hi",
            "attachments": [{"name": "a.txt", "mime": "text/plain", "data_base64": "not base64!!"}],
        },
        400,
        "invalid_request",
    ),
    (
        {"message": "hi", "attachments": [upload("../etc/passwd", "text/plain", b"x")]},
        400,
        "invalid_request",
    ),
    (
        {
            "message": "hi",
            "attachments": [upload(f"f{i}.txt", "text/plain", b"x") for i in range(11)],
        },
        400,
        "invalid_request",
    ),
    ({"message": "hi", "model": ""}, 400, "invalid_request"),
    ({"message": "hi", "session_id": "no such"}, 400, "invalid_request"),
    ({"message": "hi", "session_id": "s_unknown"}, 404, "session_not_found"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_STARTS)
def test_bad_start_is_refused_before_anything_is_recorded(
    shared_demo_server: ServerProcess, body: dict, status: int, code: str
) -> None:
    attachments = shared_demo_server.data_dir / "attachments"
    stored_before = sorted(attachments.rglob("*"))
    with shared_demo_server.client() as client:
        sid = new_session(client)
        before = session_body(client, sid)
        response = client.post("/api/chat/start", json={"session_id": sid, **body})
        assert response.status_code == status, response.text
        assert response.json()["code"] == code and response.json()["message"]
        assert session_body(client, sid) == before
        assert sorted(attachments.rglob("*")) == stored_before


def test_attachment_too_large_is_413(shared_demo_server: ServerProcess) -> None:
    with shared_demo_server.client() as client:
        sid = new_session(client)
        big = upload("big.txt", "text/plain", b"a" * (20 * 2**20 + 1))
        response = client.post(
            "/api/chat/start", json={"session_id": sid, "message": "hi", "attachments": [big]}
        )
        assert response.status_code == 413
        assert response.json()["code"] == "payload_too_large"
        assert response.json()["message"].startswith("big.txt is 20,971,521 bytes")
        assert response.json()["limit_bytes"] == 20 * 2**20
        assert session_body(client, sid)["message_count"] == 0


def test_an_attachment_at_the_limit_fits_in_a_request_with_a_long_message(
    shared_demo_server: ServerProcess,
) -> None:
    """One attachment may be 20 MiB (docs/api.md §1), which is 26.7 MiB as base64: the
    request body's limit must hold it and the longest message, or a file the page lets the
    user attach (up to 20 MiB) is refused for the body's size instead."""
    with shared_demo_server.client(timeout=60) as client:
        sid = new_session(client)
        whole = upload("whole.txt", "text/plain", b"a" * (20 * 2**20))
        message = "\U0001f600" * 200_000  # the longest message, each character 12 JSON bytes
        body = json.dumps({"session_id": sid, "message": message, "attachments": [whole]})
        response = client.post(
            "/api/chat/start", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 200, response.text[:300]
        client.post("/api/chat/cancel", json={"session_id": sid})
        [row] = [m for m in session_body(client, sid)["messages"] if m["role"] == "user"]
        assert [(a["name"], a["size"]) for a in row["attachments"]] == [("whole.txt", 20 * 2**20)]


def test_attachments_are_stored_once_served_safely_and_reach_the_context(
    demo_server: ServerProcess,
) -> None:
    with demo_server.client() as client:
        sid = new_session(client)
        files = [
            upload("dot.png", "image/png", PNG),
            upload("notes.txt", "text/plain", b"<script>alert(1)</script>"),
        ]
        start_turn(client, sid, "look", attachments=files)
        body = wait_idle(client, sid)
        user = body["messages"][0]
        assert [a["name"] for a in user["attachments"]] == ["dot.png", "notes.txt"]
        image, text = user["attachments"]
        assert image["size"] == len(PNG) and image["mime"] == "image/png"
        served = client.get(image["url"])
        assert served.status_code == 200 and served.content == PNG
        assert served.headers["content-type"] == "image/png"
        assert served.headers["x-content-type-options"] == "nosniff"
        served_text = client.get(text["url"])
        assert served_text.headers["content-type"] == "application/octet-stream"
        assert served_text.headers["content-disposition"].startswith("attachment")
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        parts = context["context_messages"][0]["content"]
        assert parts[0] == {"type": "text", "text": "look"}
        assert [p["attachment_id"] for p in parts[1:]] == [image["id"], text["id"]]
        # the same bytes in another session are stored once
        other = new_session(client)
        start_turn(client, other, "again", attachments=files[:1])
        other_image = wait_idle(client, other)["messages"][0]["attachments"][0]
        stored = [p for p in (demo_server.data_dir / "attachments").rglob("*") if p.is_file()]
        assert len(stored) == 2
        # deleting a session removes its uploads, and the bytes only it held
        client.delete("/api/session", params={"session_id": sid})
        assert client.get(text["url"]).status_code == 404
        assert client.get(image["url"]).status_code == 404
        assert client.get(other_image["url"]).content == PNG
        stored = [p for p in (demo_server.data_dir / "attachments").rglob("*") if p.is_file()]
        assert len(stored) == 1


def test_unknown_attachment_is_404(shared_demo_server: ServerProcess) -> None:
    with shared_demo_server.client() as client:
        response = client.get("/api/attachments/" + "0" * 64)
        assert response.status_code == 404
        assert response.json()["code"] == "attachment_not_found"


def test_files_too_large_together_are_refused_saying_so(shared_demo_server: ServerProcess) -> None:
    """Two files of 12 MiB each fit the attachment limit but not one request (30 MiB, as
    base64): the refusal must tell the person sending them what to do, not only a count of
    bytes. Nothing is recorded."""
    with shared_demo_server.client(timeout=60) as client:
        sid = new_session(client)
        files = [upload(f"part{n}.txt", "text/plain", b"a" * (12 * 2**20)) for n in (1, 2)]
        response = client.post(
            "/api/chat/start", json={"session_id": sid, "message": "hi", "attachments": files}
        )
        assert response.status_code == 413
        body = response.json()
        assert body["code"] == "payload_too_large"
        assert body["limit_bytes"] == 30 * 2**20
        assert body["message"] == (
            "The request body is larger than 30 MiB (31,457,280 bytes). A message and its "
            "attachments are sent together, as base64: attach fewer or smaller files."
        )
        assert session_body(client, sid)["message_count"] == 0
