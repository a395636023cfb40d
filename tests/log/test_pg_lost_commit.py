"""A PostgreSQL connection lost after the writer sent its batch's COMMIT (layer: the log,
log/postgres.py; contract invariant 5, named as invariant 8 asks: what is durable is written
once and reported as written, so no caller undoes or writes again what a replay will show).

The replica reaches the database through a TCP proxy that, armed, forwards the next COMMIT,
waits for the server's answer to it (so the transaction is committed), drops that answer and
closes both sides: the network failing at the worst moment, on a real server, the same way
on every run. The writer used to report that batch as failed although it was durable (its
callers then release the bytes a turn refers to, unregister a run the database holds open,
or write it again). It now reads the transaction's status back on a new connection before it
answers: committed, the append returns its events; rolled back (the COMMIT never reached the
server), it fails and nothing is there."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from tether.log import Draft
from tether.log.errors import StorageError
from tether.log.postgres import PostgresEventStore

pytestmark = pytest.mark.slow

_COMMIT_SENT = b"COMMIT\x00"  # the query text of the client's Parse message
_COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"  # the server's CommandComplete for it


class CommitCutter:
    """A TCP proxy to the PostgreSQL server of `url`. `arm("after")`: the next COMMIT goes to
    the server, and once its answer comes back the connection is closed with the answer
    dropped; `arm("before")`: the next COMMIT is dropped and the connection closed, so the
    server never gets it. `cuts` counts the connections it cut."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        self.url = urlunsplit(
            parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)
        )
        self.mode: str | None = None
        self.cuts = 0
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, mode: str) -> None:
        self.mode = mode

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            state = {"cutting": False, "answer": b""}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _cut(self, a: socket.socket, b: socket.socket) -> None:
        self.cuts += 1
        for sock in (a, b):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        """Client to server."""
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_WR)
                return
            if _COMMIT_SENT in data:
                with self.lock:
                    mode, self.mode = self.mode, None
                if mode == "before":
                    self._cut(client, server)
                    return
                if mode == "after":
                    state["cutting"] = True
            try:
                server.sendall(data)
            except OSError:
                return

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        """Server to client."""
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_WR)
                return
            if state["cutting"]:
                state["answer"] += data
                if _COMMIT_DONE in state["answer"]:  # committed: its answer never arrives
                    self._cut(client, server)
                    return
                continue
            try:
                client.sendall(data)
            except OSError:
                return


@pytest.fixture
def cutter(url: str) -> Iterator[CommitCutter]:
    proxy = CommitCutter(url)
    try:
        yield proxy
    finally:
        proxy.close()


@contextlib.asynccontextmanager
async def stores(
    through: str, direct: str
) -> AsyncIterator[tuple[PostgresEventStore, PostgresEventStore]]:
    """A store through the proxy and one straight to the database, closed whatever happens
    (a store left open keeps its writer and pool tasks: asyncio.run would wait on them)."""
    opened = [
        PostgresEventStore(u, index_fold=lambda state, event: {}, index_version="t1")
        for u in (through, direct)
    ]
    try:
        yield opened[0], opened[1]
    finally:
        for store in opened:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(store.aclose(), 10)


def test_a_batch_whose_commit_answer_was_lost_is_read_back_and_reported_written(
    url: str, cutter: CommitCutter
) -> None:
    """The COMMIT reached the server and committed; its answer was lost with the connection.
    The append raised StorageError for events that are in the log (a retry wrote them twice).
    Now it returns them, and the log has them once."""

    async def main() -> None:
        async with stores(cutter.url, url) as (store, direct):
            await store.create_session("s1", [Draft("session.created", {})])
            cutter.arm("after")
            events = await store.append("s1", [Draft("note", {"text": "once"})])
            assert cutter.cuts == 1
            assert [(e.seq, e.data) for e in events] == [(2, {"text": "once"})]
            assert [(e.seq, e.type) for e in await direct.read("s1")] == [
                (1, "session.created"),
                (2, "note"),
            ]
            after = await store.append("s1", [Draft("note", {"text": "next"})])  # goes on
            assert [e.seq for e in after] == [3]

    asyncio.run(main())


def test_a_batch_whose_commit_never_reached_the_server_is_reported_failed(
    url: str, cutter: CommitCutter
) -> None:
    """The connection was lost as COMMIT was sent, before the server got it: the read-back
    finds the transaction rolled back, the append fails, and nothing of it is there."""

    async def main() -> None:
        async with stores(cutter.url, url) as (store, direct):
            await store.create_session("s1", [Draft("session.created", {})])
            cutter.arm("before")
            with pytest.raises(StorageError):
                await store.append("s1", [Draft("note", {"text": "lost"})])
            assert cutter.cuts == 1
            assert [e.seq for e in await direct.read("s1")] == [1]
            after = await store.append("s1", [Draft("note", {"text": "next"})])
            assert [(e.seq, e.data) for e in after] == [(2, {"text": "next"})]

    asyncio.run(main())
