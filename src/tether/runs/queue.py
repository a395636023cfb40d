"""Queued messages (docs/api.md §4): typed while a run is busy, started as the next turn when the
run completes, kept (visible, editable, removable) when it is cancelled or fails. They live
in the log, so they survive reloads and restarts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tether import events as ev
from tether.errors import ApiError, QueueItemNotFound
from tether.events import new_id
from tether.log import Draft
from tether.runs.engine import RunEngine
from tether.runs.intake import Upload

log = logging.getLogger("tether.runs")


class QueueService:
    def __init__(self, engine: RunEngine):
        self.engine = engine
        self.store = engine.store
        self.sessions = engine.sessions

    async def add(self, session_id: str, text: str, uploads: Sequence[Upload]) -> dict[str, Any]:
        async with self.sessions.locks(session_id):
            await self.engine.check_admissible(session_id, starting=False)
            async with self.sessions.blob_guard(bool(uploads)):
                refs, blobs = await self.engine.store_uploads(uploads)
                queue_id = new_id("q")
                data = {"queue_id": queue_id, "text": text, "attachments": refs}
                try:
                    await self.store.append(session_id, [Draft(ev.QUEUE_ADDED, data, blobs=blobs)])
                except BaseException:
                    await self.sessions.release_blobs_held(blobs.values())
                    raise
        started = None
        if not self.engine.registry.busy(session_id):
            started = await self.start_next(session_id)
        return {"queue_id": queue_id, "started": started}

    async def _locate(self, queue_id: str) -> tuple[str, dict[str, Any]]:
        session_id = await self.store.queue_session(queue_id)
        if session_id is not None:
            fold = await self.sessions.folds.get(session_id)
            item = fold.transcript.queued.get(queue_id)
            if item is not None:
                return session_id, item
        raise QueueItemNotFound(
            "That queued message is not queued any more (it was sent or removed).",
        )

    async def update(self, queue_id: str, text: str) -> dict[str, Any]:
        session_id, _ = await self._locate(queue_id)
        async with self.sessions.locks(session_id):
            session_id, _ = await self._locate(queue_id)
            await self.store.append(
                session_id, [Draft(ev.QUEUE_UPDATED, {"queue_id": queue_id, "text": text})]
            )
        return {"ok": True, "queue_id": queue_id}

    async def remove(self, queue_id: str) -> dict[str, Any]:
        session_id, _ = await self._locate(queue_id)
        async with self.sessions.locks(session_id):
            session_id, _ = await self._locate(queue_id)
            await self.store.append(
                session_id, [Draft(ev.QUEUE_REMOVED, {"queue_id": queue_id, "reason": "removed"})]
            )
        return {"ok": True, "queue_id": queue_id}

    async def start(self, queue_id: str) -> dict[str, Any]:
        """Start one queued message as the turn now (`POST /api/chat/queue/start`); a refused
        start (`session_busy`, ...) raises and leaves it queued."""
        session_id, item = await self._locate(queue_id)
        return await self._start_item(session_id, item)

    async def start_next(self, session_id: str) -> str | None:
        """Start the oldest queued message as the next turn; None when nothing is queued or
        the session is taken. It stays queued if the start is refused."""
        fold = await self.sessions.folds.get(session_id)
        item = next(iter(fold.transcript.queued.values()), None)
        if item is None:
            return None
        try:
            started = await self._start_item(session_id, item)
        except ApiError as exc:  # busy, rotated, closing, gone: it stays queued
            log.info("queued message %s stays queued: %s", item["queue_id"], exc.message)
            return None
        return started["stream_id"]

    async def _start_item(self, session_id: str, item: dict[str, Any]) -> dict[str, Any]:
        # The engine reads the item again under the session lock: what it sends is the
        # latest edit, and the item leaves the queue in the turn's own append.
        return await self.engine.start(session_id, item["text"], queue_id=item["queue_id"])
