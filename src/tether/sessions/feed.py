"""The sidebar feed behind `GET /api/events`: which sessions changed, and why.

It listens to committed batches and to run-registry changes (busy/attachable flip without an
event when a worker unwinds). Each client has a small bounded queue of session ids; a client
that cannot keep up is told to refetch the list instead of growing memory.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from tether.events import Event
from tether.projections.sidebar import ROW_EVENT_TYPES

_MAX_PENDING = 512


class FeedClient:
    def __init__(self, wakeup: asyncio.Event | None = None) -> None:
        self.pending: OrderedDict[str, str] = OrderedDict()
        self.wakeup = wakeup or asyncio.Event()
        self.resync = False

    def push(self, session_id: str, reason: str) -> None:
        self.pending.pop(session_id, None)
        self.pending[session_id] = reason
        if len(self.pending) > _MAX_PENDING:
            self.pending.clear()
            self.resync = True
        self.wakeup.set()

    def has_pending(self) -> bool:
        return bool(self.pending) or self.resync

    def take(self) -> list[tuple[str, str]] | None:
        """Changed (session_id, reason) pairs without waiting; None when a resync is due."""
        if self.resync:
            self.resync = False
            return None
        items = list(self.pending.items())
        self.pending.clear()
        return items

    async def next(self, timeout: float) -> list[tuple[str, str]] | None:
        """Changed pairs, [] on timeout, None when a resync is due."""
        if not self.has_pending():
            self.wakeup.clear()
            try:  # not wait_for: on Python 3.11 a wake-up as it is cancelled swallows the cancel
                async with asyncio.timeout(timeout):
                    await self.wakeup.wait()
            except TimeoutError:
                return []
        return self.take()


class SidebarFeed:
    def __init__(self) -> None:
        self._clients: set[FeedClient] = set()

    def connect(self, wakeup: asyncio.Event | None = None) -> FeedClient:
        client = FeedClient(wakeup)
        self._clients.add(client)
        return client

    def disconnect(self, client: FeedClient) -> None:
        self._clients.discard(client)

    def on_batch(self, events: list[Event]) -> None:
        last: dict[str, str] = {}
        for event in events:
            if event.type in ROW_EVENT_TYPES:
                last[event.session_id] = event.type
        for session_id, reason in last.items():
            self.notify(session_id, reason)

    def on_deleted(self, session_id: str) -> None:
        self.notify(session_id, "deleted")

    def notify(self, session_id: str, reason: str) -> None:
        for client in self._clients:
            client.push(session_id, reason)
