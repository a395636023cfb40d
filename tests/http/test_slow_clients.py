"""Slow clients are bounded (a request head and a request body each have a deadline), and
X-Forwarded-For counts only from a configured proxy (docs/security.md, "Slow clients" and
"The login rate limit"). Raw sockets against a real server, loopback only, bounded loops."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from helpers import ServerProcess, running_server, wait_until

pytestmark = pytest.mark.slow

PW_ARGS = ("--password-env", "TETHER_TEST_PW")
PW_ENV = {"TETHER_TEST_PW": "correct horse"}
DEADLINES = ("--header-timeout-seconds", "1", "--body-timeout-seconds", "1")


def connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.setblocking(False)
    return sock


def dribble_until_closed(
    socks: list[socket.socket], piece: bytes, limit: float
) -> tuple[dict[socket.socket, bytes], float]:
    """Send `piece` on every open socket every 0.2 s until the server has closed them all or
    `limit` seconds passed; what each received, and when the last one closed."""
    received = {sock: b"" for sock in socks}
    open_ = set(socks)
    started = time.monotonic()
    while open_ and time.monotonic() - started < limit:
        readable, _, _ = select.select(list(open_), [], [], 0.2)
        for sock in readable:  # read before sending again, so an answer is never reset away
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b""
            received[sock] += chunk
            if not chunk:
                open_.discard(sock)
        for sock in open_ - set(readable):
            if piece:
                try:
                    sock.send(piece)
                except BlockingIOError:
                    pass
                except OSError:
                    open_.discard(sock)
    assert not open_, f"{len(open_)} of {len(socks)} connections still open after {limit} s"
    return received, time.monotonic() - started


@contextmanager
def sockets(server: ServerProcess, count: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        yield [stack.enter_context(connect(server)) for _ in range(count)]


def test_connections_that_dribble_headers_are_closed(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", *DEADLINES) as server, sockets(server, 50) as socks:
        head = f"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode()
        for sock in socks[:40]:
            sock.send(head)
        # 40 send a header line every 0.2 s, 10 say nothing at all.
        received, took = dribble_until_closed(socks[:40], b"X-Slow: 1\r\n", limit=8)
        _, silent_took = dribble_until_closed(socks[40:], b"", limit=8)
        assert took < 5 and silent_took < 5, (took, silent_took)
        for answer in received.values():
            assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
            assert b'"code": "request_timeout"' in answer
        assert httpx.get(server.base_url + "/api/health", timeout=5).status_code == 200


def test_a_chunked_body_that_never_ends_is_answered_408(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", *DEADLINES) as server, sockets(server, 20) as socks:
        before = httpx.get(server.base_url + "/api/sessions").json()["sessions"]
        head = (
            f"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            '2\r\n{"\r\n'
        ).encode()
        for sock in socks[:10]:
            sock.send(head)
        short = (
            f"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"title": "'
        ).encode()
        for sock in socks[10:]:
            sock.send(short)
        # Half the chunked ones keep sending a chunk every 0.2 s; the rest just stall.
        dribbled, took = dribble_until_closed(socks[:5], b"1\r\na\r\n", limit=8)
        stalled, stalled_took = dribble_until_closed(socks[5:], b"", limit=8)
        assert took < 5 and stalled_took < 5, (took, stalled_took)
        for answer in [*dribbled.values(), *stalled.values()]:
            assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
            assert b'"code": "request_timeout"' in answer
        assert httpx.get(server.base_url + "/api/sessions").json()["sessions"] == before
        assert "Traceback" not in server.log()


def read_to_end(sock: socket.socket, limit: float = 5) -> bytes:
    """Everything the server sends until it shuts its side down."""
    sock.setblocking(True)
    sock.settimeout(limit)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def still_writable(sock: socket.socket) -> bool:
    """Whether two writes 0.1 s apart both go through: a server that has closed its socket
    answers the first with a reset, which fails the second."""
    try:
        for _ in range(2):
            sock.send(b"X-Late: 1\r\n")
            time.sleep(0.1)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("stage", ["head", "body"])
def test_a_client_still_sending_after_its_408_is_not_reset(tmp_path: Path, stage: str) -> None:
    """Closing a socket with unread input sends a reset, which can destroy the 408 before the
    client reads it (under load, one of 40 dribbling sockets read nothing). So the server shuts
    down its side and drains what the client still sends for a while before closing."""
    with running_server(tmp_path / "data", *DEADLINES) as server, sockets(server, 1) as (sock,):
        head = f"POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        if stage == "body":
            head += "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        sock.send(head.encode())
        answer = read_to_end(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert still_writable(sock)


def test_streams_and_prompt_requests_outlive_the_deadlines(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", *DEADLINES) as server, server.client() as client:
        started = time.monotonic()
        with client.stream("GET", "/api/events", timeout=5) as stream:
            assert stream.status_code == 200
            for _ in stream.iter_lines():
                if time.monotonic() - started > 3:
                    break
        assert time.monotonic() - started > 3
        # A keep-alive connection idle for less than uvicorn's keep-alive is reused.
        assert client.post("/api/sessions", json={"title": "one"}).status_code == 201
        time.sleep(1.5)
        assert client.post("/api/sessions", json={"title": "two"}).status_code == 201


def login(client: httpx.Client, forwarded_for: str, password: str = "nope") -> int:
    return client.post(
        "/api/auth/login", json={"password": password}, headers={"X-Forwarded-For": forwarded_for}
    ).status_code


def test_forwarded_for_from_an_untrusted_client_gets_no_fresh_bucket(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "data", *PW_ARGS, env=PW_ENV) as server,
        server.client() as client,
    ):
        for n in range(5):
            assert login(client, f"10.0.0.{n}") == 401
        # A new forwarded address from the same (loopback, untrusted) peer: still limited.
        assert login(client, "10.9.9.9") == 429
        assert login(client, "10.9.9.9", PW_ENV["TETHER_TEST_PW"]) == 429


def test_forwarded_for_from_an_untrusted_client_shares_the_stream_cap(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "data", "--max-streams-per-client", "2") as server,
        server.client() as client,
        ExitStack() as streams,
    ):
        for n in range(2):
            opened = streams.enter_context(
                client.stream("GET", "/api/events", headers={"X-Forwarded-For": f"10.0.0.{n}"})
            )
            assert opened.status_code == 200
        wait_until(lambda: client.get("/api/health").json()["open_streams"] == 2)
        refused = client.get("/api/events", headers={"X-Forwarded-For": "10.0.0.9"})
        assert refused.status_code == 429 and refused.json()["code"] == "too_many_streams"


def test_a_configured_proxy_is_believed(tmp_path: Path) -> None:
    with (
        running_server(
            tmp_path / "data",
            "--max-streams-per-client",
            "1",
            *PW_ARGS,
            env={**PW_ENV, "TETHER_TRUSTED_PROXIES": "192.0.2.1,127.0.0.1"},
        ) as server,
        server.client() as client,
        ExitStack() as streams,
    ):
        for _ in range(5):
            assert login(client, "10.0.0.1") == 401
        assert login(client, "10.0.0.1") == 429
        assert login(client, "10.0.0.2") == 401  # another client behind the proxy
        assert login(client, "10.0.0.2", PW_ENV["TETHER_TEST_PW"]) == 200
        for n in range(3):
            opened = streams.enter_context(
                client.stream("GET", "/api/events", headers={"X-Forwarded-For": f"10.0.1.{n}"})
            )
            assert opened.status_code == 200
        again = client.get("/api/events", headers={"X-Forwarded-For": "10.0.1.0"})
        assert again.status_code == 429
