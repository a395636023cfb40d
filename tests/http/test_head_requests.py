"""HEAD is answered on every GET route with the GET's status and headers and no body, the
event streams included (health checkers probe with HEAD)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from helpers import ServerProcess, new_session

pytestmark = pytest.mark.slow


def get_routes(client: httpx.Client, sid: str) -> list[str]:
    """Every GET path of the OpenAPI document with its parameters filled, and the pages."""
    paths = [
        path.replace("{session_id}", sid).replace("{attachment_id}", "0" * 64)
        for path, operations in client.get("/api/openapi.json").json()["paths"].items()
        if "get" in operations
    ]
    query = f"?session_id={sid}"
    return [
        p + query if p in ("/api/session", "/api/session/context", "/api/session/status") else p
        for p in paths
    ] + ["/", f"/s/{sid}", "/login", "/static/js/main.js", "/api/openapi.json", "/nope"]


def test_head_answers_like_get_without_a_body(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = new_session(client, "head")
        routes = get_routes(client, sid)
        assert "/api/health" in routes and f"/api/sessions/{sid}/events" in routes
        for path in routes:
            head = client.head(path, timeout=5)
            if path.endswith("/events"):
                assert head.status_code == 200, path
                assert head.headers["content-type"].startswith("text/event-stream")
            else:
                get = client.get(path)
                assert head.status_code == get.status_code, (path, head.status_code)
                assert head.headers.get("content-type") == get.headers.get("content-type"), path
            assert head.content == b"", path
            assert head.status_code != 405, path


def test_head_on_a_stream_returns_at_once_and_frees_its_slot(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = new_session(client)
        started = time.monotonic()
        for _ in range(40):  # more than the 32 streams one client may hold open
            assert client.head(f"/api/sessions/{sid}/events", timeout=5).status_code == 200
            assert client.head("/api/events", timeout=5).status_code == 200
        assert time.monotonic() - started < 20
        with client.stream("GET", "/api/events", timeout=5) as stream:
            assert stream.status_code == 200


def test_a_raw_head_request_gets_a_head_and_nothing_else(shared_server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", shared_server.port), timeout=5) as sock:
        sock.sendall(
            f"HEAD /api/health HTTP/1.1\r\nHost: 127.0.0.1:{shared_server.port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert rest == b""
