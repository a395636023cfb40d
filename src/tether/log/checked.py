"""The store the services write through: any backend, with each draft's payload checked
against its event type's definition (`tether.events`) before the backend sees it.

A payload that does not match (a missing or unknown field, a wrong type, a type nobody
defined) is a bug in whoever wrote it: the whole append is refused with `PayloadMismatch`
and nothing is stored, so the mistake fails the test that made it instead of reaching a
fold, a page or another backend. The check costs a few microseconds a draft. Backends
themselves stay payload-agnostic: the backend contract suite appends any JSON.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tether.events import VOCABULARY, Event, Vocabulary
from tether.log.store import Draft, EventStore, OpenStream, SearchHit
from tether.log.subscriptions import Hub

SESSIONS_PER_SLICE = 20  # checked between two yields to the loop: 1-2 ms of an import


class CheckedStore:
    """An `EventStore` that checks every draft, then hands everything to `backend`."""

    def __init__(self, backend: EventStore, vocabulary: Vocabulary = VOCABULARY):
        self.backend = backend
        self.vocabulary = vocabulary

    def _check(self, drafts: list[Draft]) -> None:
        for draft in drafts:
            self.vocabulary.check(draft.type, draft.data)

    def attach_hub(self, hub: Hub | None) -> None:
        self.backend.attach_hub(hub)

    async def create_session(
        self, session_id: str, drafts: list[Draft], owner: str | None = None
    ) -> list[Event]:
        self._check(drafts)
        return await self.backend.create_session(session_id, drafts, owner)

    async def create_sessions(
        self, sessions: list[tuple[str, list[Draft]]], owner: str | None = None
    ) -> list[list[Event]]:
        for n, (_, drafts) in enumerate(sessions, start=1):
            self._check(drafts)
            if n % SESSIONS_PER_SLICE == 0:
                await asyncio.sleep(0)  # an import's thousand sessions: let requests in between
        return await self.backend.create_sessions(sessions, owner)

    async def append(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        self._check(drafts)
        return await self.backend.append(session_id, drafts)

    async def delete_session(self, session_id: str, *, only_idle: bool = False) -> None:
        await self.backend.delete_session(session_id, only_idle=only_idle)

    async def read(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        return await self.backend.read(session_id, after, limit)

    async def last_seq(self, session_id: str) -> int | None:
        return await self.backend.last_seq(session_id)

    async def index_state(self, session_id: str) -> dict[str, Any] | None:
        return await self.backend.index_state(session_id)

    async def index_states(self) -> dict[str, dict[str, Any]]:
        return await self.backend.index_states()

    async def search_text(self, needle: str) -> set[str]:
        return await self.backend.search_text(needle)

    async def search(
        self, terms: list[str], limit: int, owner: str | None = None
    ) -> list[SearchHit]:
        return await self.backend.search(terms, limit, owner)

    async def unfinished_streams(self) -> list[OpenStream]:
        return await self.backend.unfinished_streams()

    async def unfinished_stream(
        self, *, stream_id: str | None = None, session_id: str | None = None
    ) -> OpenStream | None:
        return await self.backend.unfinished_stream(stream_id=stream_id, session_id=session_id)

    async def queue_session(self, queue_id: str) -> str | None:
        return await self.backend.queue_session(queue_id)

    async def attachment(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        return await self.backend.attachment(attachment_id, session_id)

    async def blob_in_use(self, blob: str) -> bool:
        return await self.backend.blob_in_use(blob)

    async def session_blobs(self, session_id: str) -> set[str]:
        return await self.backend.session_blobs(session_id)

    async def session_owner(self, session_id: str) -> str | None:
        return await self.backend.session_owner(session_id)

    async def claim_unowned(self, owner: str) -> int:
        return await self.backend.claim_unowned(owner)

    async def aclose(self) -> None:
        await self.backend.aclose()
