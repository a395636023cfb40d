"""Limits on event streams (issue 6: open SSE connections per client, and a write deadline that
disconnects a subscriber that stops reading without slowing the run or other subscribers).
Layer: live stream / SSE (invariant 7: observation never stalls the rest)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers import iter_sse, running_server


def open_streams(client: httpx.Client) -> int:
    return client.get("/api/health").json()["open_streams"]


def test_a_client_over_its_stream_limit_gets_a_clear_429(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "data", "--max-streams-per-client", "2") as server,
        server.client() as client,
    ):
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        with (
            client.stream("GET", f"/api/sessions/{sid}/events"),
            client.stream("GET", "/api/events"),
        ):
            deadline = time.monotonic() + 5
            while open_streams(client) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = client.get("/api/events")
            assert refused.status_code == 429
            assert refused.json()["code"] == "too_many_streams"
            assert refused.json()["limit"] == 2
        deadline = time.monotonic() + 5
        while open_streams(client) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert open_streams(client) == 0  # closing frees the slots
        with client.stream("GET", "/api/events") as again:
            assert again.status_code == 200


@pytest.mark.slow
def test_a_subscriber_that_stops_reading_is_cut_off_without_slowing_others(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "data", "--sse-write-deadline-seconds", "1") as server,
        server.client() as client,
    ):
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        client.post("/api/chat/start", json={"session_id": sid, "message": "/slow busy"})
        queue_id = client.post("/api/chat/queue", json={"session_id": sid, "message": "x"}).json()[
            "queue_id"
        ]
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", server.port))
        stuck.sendall(
            f"GET /api/sessions/{sid}/events?after=0 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\n\r\n".encode()
        )
        received: list[int] = []

        def follow() -> None:
            with (
                server.client() as own,
                own.stream(
                    "GET", f"/api/sessions/{sid}/events", params={"after": "0"}, timeout=60
                ) as response,
            ):
                for frame in iter_sse(response):
                    if frame.get("id"):
                        received.append(int(frame["id"]))
                    if frame.event == "queue.removed":
                        return

        reader = threading.Thread(target=follow)
        reader.start()
        big = "y" * 150_000
        started = time.monotonic()
        for i in range(60):  # ~9 MB of frames: far more than the stuck socket's buffers hold
            assert (
                client.patch(
                    "/api/chat/queue", params={"queue_id": queue_id}, json={"text": f"{i}{big}"}
                ).status_code
                == 200
            )
        writes_took = time.monotonic() - started
        client.delete("/api/chat/queue", params={"queue_id": queue_id})
        reader.join(30)
        last = client.get("/api/session/status", params={"session_id": sid}).json()["last_seq"]
        assert received[:last] == list(range(1, last + 1))  # the reader lost nothing
        deadline = time.monotonic() + 15
        while open_streams(client) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert open_streams(client) == 0  # the stuck subscriber was disconnected
        assert writes_took < 20  # writers were never held back by the stuck reader
        stuck.close()
