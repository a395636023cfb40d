"""One session's projections at one `seq`, kept warm in a small LRU cache.

A cached fold is advanced by the live tail as events are published, and otherwise by reading
only the events after its `last_seq`, so a read costs what is new, not the session's size.
Reads never write (docs/architecture.md §1).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from tether.events import Event
from tether.log import SessionNotFound
from tether.log.store import EventStore
from tether.projections.sidebar import fold_row
from tether.projections.transcript import TranscriptFold


class SessionFold:
    """The sidebar row and the transcript of one session, folded to the same `seq`."""

    def __init__(self) -> None:
        self.row: dict[str, Any] | None = None
        self.transcript = TranscriptFold()

    @property
    def last_seq(self) -> int:
        return self.transcript.last_seq

    def system_prompt(self, default: str | None) -> str | None:
        """The session's own system prompt (`PATCH /api/session`), else the server's."""
        own = (self.row or {}).get("system_prompt")
        return own if own is not None else default

    def context(self, default_system_prompt: str | None, runtime: str) -> dict[str, Any]:
        """What `runtime`'s next model call gets, as the user is shown it: the whole system
        message first (its agent's own part included), then the transcript."""
        system_prompt = self.system_prompt(default_system_prompt)
        system_message = self.transcript.system_message(system_prompt, runtime)
        return self.transcript.context(system_message)

    def apply(self, event: Event) -> None:
        self.row = fold_row(self.row, event)
        self.transcript.apply(event)


class FoldCache:
    def __init__(self, store: EventStore, capacity: int = 128):
        self._store = store
        self._capacity = capacity
        self._folds: OrderedDict[str, SessionFold] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, session_id: str) -> SessionFold:
        """The session's fold at (at least) its current last seq; SessionNotFound if none."""
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            if await self._store.last_seq(session_id) is None:
                self.forget(session_id)
                raise SessionNotFound(session_id)
            fold = self._folds.get(session_id) or SessionFold()
            while True:
                # The live tail (`on_batch`) may advance a cached fold while these reads
                # wait on the database, so its position is read after each await, never
                # before one: reading past it would find nothing and look like a deletion.
                target = await self._store.last_seq(session_id) or 0
                if fold.last_seq >= target:
                    break
                events = await self._store.read(session_id, after=fold.last_seq, limit=5000)
                if not events and fold.last_seq < target:  # deleted while we read
                    raise SessionNotFound(session_id)
                for event in events:
                    fold.apply(event)
            self._folds[session_id] = fold
            self._folds.move_to_end(session_id)
            self._evict()
            return fold

    def _evict(self) -> None:
        while len(self._folds) > self._capacity:
            evicted, _ = self._folds.popitem(last=False)
            self._locks.pop(evicted, None)

    def adopt(self, session_id: str, created: list[Event]) -> None:
        """Cache a session just created from the events that created it, so its first turn
        needs no read of the log before the model is asked (about 0.5 ms of the first token,
        bench/README.md). Kept only when they are the whole log so far: anything appended
        since is then applied by `on_batch`, or read by the next `get` after a gap."""
        if session_id in self._folds or not created:
            return
        fold = SessionFold()
        for event in created:
            if event.seq != fold.last_seq + 1:
                return
            fold.apply(event)
        self._folds[session_id] = fold
        self._evict()

    def cached(self, session_id: str) -> SessionFold | None:
        """The session's cached fold as it is, read from nothing: maybe behind the log (the
        early request, runs/invocation.py, checks what it built from it against `get`'s)."""
        return self._folds.get(session_id)

    def forget(self, session_id: str) -> None:
        self._folds.pop(session_id, None)

    def on_batch(self, events: list[Event]) -> None:
        """Keep cached folds current from the live tail (hub publication, after commit), so a
        read of a hot session needs no database round trip. Only the next contiguous seq is
        applied; after a gap the next `get` reads what is missing from the log."""
        for event in events:
            fold = self._folds.get(event.session_id)
            if fold is not None and event.seq == fold.last_seq + 1:
                fold.apply(event)
