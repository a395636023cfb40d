"""Ownership as a filter of the log (docs/api.md §15, docs/security.md): every layer above
reads and writes through `OwnedStore`, which shows the person a request acts for only their
own sessions. Another person's session is simply not there: reads find nothing, writes raise
`SessionNotFound`, so every route, stream, search or export built on the store answers 404
`session_not_found` without a check of its own, and existence is never revealed.

Whom a request acts for is `VIEWER`, a context variable the HTTP gate sets for the whole
request (asyncio tasks started by it, a run's worker for instance, inherit it). `EVERYONE`
(the default) is the single-user modes and the server's own work between requests
(recovery, the reclaimer, agent sync); `NOBODY` sees nothing.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final

from tether.events import Event
from tether.log.errors import SessionNotFound
from tether.log.store import Draft, EventStore, OpenStream, SearchHit
from tether.log.subscriptions import Hub

EVERYONE: Final = None
NOBODY: Final = ""
VIEWER: ContextVar[str | None] = ContextVar("tether_viewer", default=EVERYONE)
_MAX_GONE = 10_000


class OwnedStore:
    """An `EventStore` that filters any other `EventStore` by `VIEWER`. Sessions a viewer
    creates are theirs. It remembers the owners of sessions deleted through it, so that a
    deletion is announced to their owner only."""

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        self._gone: dict[str, str | None] = {}
        # Who owns a session the server makes on its own (agent sync, with no person
        # behind it): the first admin in the accounts modes, nobody otherwise.
        self.default_owner: str | None = None

    async def visible(self, session_id: str) -> bool:
        """Whether the current viewer may see the session (existing, or deleted here)."""
        viewer = VIEWER.get()
        if viewer is EVERYONE:
            return True
        if viewer == NOBODY:
            return False
        if session_id in self._gone:
            return self._gone[session_id] == viewer
        return await self.inner.session_owner(session_id) == viewer

    async def _require(self, session_id: str) -> None:
        if not await self.visible(session_id):
            raise SessionNotFound(session_id)

    # -- EventStore -------------------------------------------------------------------------
    def attach_hub(self, hub: Hub | None) -> None:
        self.inner.attach_hub(hub)

    async def create_session(
        self, session_id: str, drafts: list[Draft], owner: str | None = None
    ) -> list[Event]:
        viewer = VIEWER.get()
        if viewer == NOBODY:
            raise SessionNotFound(session_id)
        return await self.inner.create_session(
            session_id, drafts, owner or viewer or self.default_owner
        )

    async def create_sessions(
        self, sessions: list[tuple[str, list[Draft]]], owner: str | None = None
    ) -> list[list[Event]]:
        viewer = VIEWER.get()
        if viewer == NOBODY:
            raise SessionNotFound(sessions[0][0] if sessions else "")
        return await self.inner.create_sessions(sessions, owner or viewer or self.default_owner)

    async def append(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        await self._require(session_id)
        return await self.inner.append(session_id, drafts)

    async def delete_session(self, session_id: str, *, only_idle: bool = False) -> None:
        await self._require(session_id)
        owner = await self.inner.session_owner(session_id)
        await self.inner.delete_session(session_id, only_idle=only_idle)
        if len(self._gone) >= _MAX_GONE:
            self._gone.pop(next(iter(self._gone)))
        self._gone[session_id] = owner

    async def read(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        if not await self.visible(session_id):
            return []
        return await self.inner.read(session_id, after, limit)

    async def last_seq(self, session_id: str) -> int | None:
        return await self.inner.last_seq(session_id) if await self.visible(session_id) else None

    async def index_state(self, session_id: str) -> dict[str, Any] | None:
        if not await self.visible(session_id):
            return None
        return await self.inner.index_state(session_id)

    async def index_states(self) -> dict[str, dict[str, Any]]:
        states = await self.inner.index_states()
        if VIEWER.get() is EVERYONE:
            return states
        return {sid: state for sid, state in states.items() if await self.visible(sid)}

    async def search_text(self, needle: str) -> set[str]:
        return {sid for sid in await self.inner.search_text(needle) if await self.visible(sid)}

    async def search(
        self, terms: list[str], limit: int, owner: str | None = None
    ) -> list[SearchHit]:
        """The viewer's best `limit` matches, ranked among the viewer's rows only: the
        backend ranks a bounded window of the newest matches, which another person's rows
        must not fill."""
        viewer = VIEWER.get()
        if viewer is EVERYONE:
            return await self.inner.search(terms, limit, owner)
        if viewer == NOBODY:
            return []
        hits = await self.inner.search(terms, limit, viewer)
        return [hit for hit in hits if await self.visible(hit.session_id)]

    async def unfinished_streams(self) -> list[OpenStream]:
        return [s for s in await self.inner.unfinished_streams() if await self.visible(s[0])]

    async def unfinished_stream(
        self, *, stream_id: str | None = None, session_id: str | None = None
    ) -> OpenStream | None:
        found = await self.inner.unfinished_stream(stream_id=stream_id, session_id=session_id)
        return found if found is not None and await self.visible(found.session_id) else None

    async def queue_session(self, queue_id: str) -> str | None:
        session_id = await self.inner.queue_session(queue_id)
        return session_id if session_id is not None and await self.visible(session_id) else None

    async def attachment(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        if session_id is not None and not await self.visible(session_id):
            return None
        upload = await self.inner.attachment(attachment_id, session_id)
        if upload is None or not await self.visible(upload["session_id"]):
            return None
        return upload

    async def blob_in_use(self, blob: str) -> bool:
        return await self.inner.blob_in_use(blob)  # bytes are shared: asked for everyone

    async def session_blobs(self, session_id: str) -> set[str]:
        if not await self.visible(session_id):
            return set()
        return await self.inner.session_blobs(session_id)

    async def session_owner(self, session_id: str) -> str | None:
        if not await self.visible(session_id):
            return None
        return await self.inner.session_owner(session_id)

    async def claim_unowned(self, owner: str) -> int:
        return await self.inner.claim_unowned(owner)

    async def aclose(self) -> None:
        await self.inner.aclose()
