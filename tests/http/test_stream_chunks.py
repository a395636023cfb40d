"""A replay goes out in body chunks of about 64 KiB, not one per event (bench/floor_log.py:
one send per event was most of a replay's cost) and not one per page of 500 (a slow reader
must finish each send within the write deadline). Read on a raw socket, so the HTTP chunked
encoding's own chunk sizes are seen, on a real server over a real log."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from tether.events import SESSION_CREATED, SESSION_UPDATED
from tether.log import Draft
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

from helpers import running_server

EVENTS = 1200
TITLE = 1000  # characters: frames of about 1.2 KB, a page of 500 is about 600 KB


def _build(db: Path) -> None:
    async def fill(store: SQLiteEventStore) -> None:
        await store.create_session("s_chunks", [Draft(SESSION_CREATED, {"title": "x"})])
        for start in range(2, EVENTS + 1, 100):
            drafts = [
                Draft(SESSION_UPDATED, {"title": f"{n}".ljust(TITLE, "~")})
                for n in range(start, min(start + 100, EVENTS + 1))
            ]
            await store.append("s_chunks", drafts)

    store = SQLiteEventStore(db, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)
    try:
        asyncio.run(fill(store))
    finally:
        store.close()


def _chunk_sizes(port: int, path: str, want_seq: int) -> tuple[list[int], bytes]:
    """The chunked body's chunk sizes and the de-chunked body, up to the frame `id: want_seq`."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, buf = buf.split(b"\r\n\r\n", 1)
    assert b" 200 " in head.split(b"\r\n")[0] and b"chunked" in head.lower(), head
    sizes: list[int] = []
    body = b""
    marker = f"id: {want_seq}\r\n".encode()
    while marker not in body:
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        line, buf = buf.split(b"\r\n", 1)
        size = int(line.split(b";")[0], 16)
        while len(buf) < size + 2:
            buf += sock.recv(65536)
        sizes.append(size)
        body += buf[:size]
        buf = buf[size + 2 :]
    sock.close()
    return sizes, body


def test_a_replay_is_sent_in_bounded_chunks_of_many_frames(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _build(data / "tether.db")
    with running_server(data, "--heartbeat-seconds", "5") as server:
        sizes, body = _chunk_sizes(server.port, "/api/sessions/s_chunks/events?after=0", EVENTS)
    ids = [int(line[4:]) for line in body.decode().split("\r\n") if line.startswith("id: ")]
    assert ids == list(range(1, EVENTS + 1))  # every frame once, in order
    frame = len(body) // EVENTS
    assert len(sizes) < EVENTS // 20, f"{len(sizes)} chunks for {EVENTS} frames"
    assert max(sizes) <= 64 * 1024 + 2 * frame, max(sizes)  # a bound, not a page of 600 KB
