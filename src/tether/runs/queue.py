"""Queued messages (docs/api.md §4): typed while a run is busy, started as the next turn when the
run completes, kept (visible, editable, removable) when it is cancelled or fails. They live
in the log, so they survive reloads and restarts. Adding, editing and removing one is here;
starting one is the engine's (`RunEngine.start_next` once a completed turn frees the session,
`RunEngine.start_queued`), which this service acts on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether import events as ev
from tether.errors import QueueItemNotFound
from tether.events import new_id
from tether.log import Draft
from tether.log.completion import to_completion
from tether.runs.engine import RunEngine
from tether.runs.intake import Upload
from tether.sessions.branching import shown_generation


class QueueService:
    def __init__(self, engine: RunEngine):
        self.engine = engine
        self.store = engine.store
        self.sessions = engine.sessions

    async def add(
        self, session_id: str, text: str, uploads: Sequence[Upload], after_seq: int | None = None
    ) -> dict[str, Any]:
        """Queue a message; in an idle session it starts at once (`start_next`). `after_seq`:
        where the sender's view was folded to, checked then as a start's (409
        `transcript_changed` before any write, invariant 1; several replicas: the database
        checks it again). Behind a run it is not: what is shown when it starts is what it
        follows, and a row hidden before that makes it wait for the user."""
        async with self.sessions.locks(session_id):
            row = await self.engine.check_admissible(session_id, starting=False)
            shown = None
            if after_seq is not None and not self.sessions.occupancy(row).busy:
                shown = shown_generation(await self.sessions.folds.get(session_id), after_seq)
            async with self.sessions.blob_guard(bool(uploads)):
                refs, blobs = await self.engine.store_uploads(uploads)
                queue_id = new_id("q")
                data = {"queue_id": queue_id, "text": text, "attachments": refs}
                added = Draft(ev.QUEUE_ADDED, data, blobs=blobs, shown_generation=shown)
                await to_completion(  # bytes are never released while their event commits
                    self.store.append(session_id, [added]),
                    undo=lambda: self.sessions.release_blobs_held(blobs.values()),
                )
        started = None
        state = await self.store.index_state(session_id)  # None: deleted meanwhile
        if state is not None and not self.sessions.occupancy(state).busy:
            started = await self.engine.start_next(session_id)
        return {"queue_id": queue_id, "started": started}

    async def _locate(self, queue_id: str) -> tuple[str, dict[str, Any], int]:
        """The session of a queued message, the message, and the seq it was read at."""
        session_id = await self.store.queue_session(queue_id)
        if session_id is not None:
            fold = await self.sessions.folds.get(session_id)
            item = fold.transcript.queued.get(queue_id)
            if item is not None:
                return session_id, item, fold.last_seq
        raise QueueItemNotFound(
            "That queued message is not queued any more (it was sent or removed).",
        )

    async def update(self, queue_id: str, text: str) -> dict[str, Any]:
        """Edit a queued message. Through another replica sharing the database, an edit
        that its start (or a removal) beat is refused, 404, never accepted for a message
        already sent (`Draft.queued_since`, log/pg_batch.py); one that lands first is what
        the start sends (`RunEngine.start`)."""
        session_id, _, _ = await self._locate(queue_id)
        async with self.sessions.locks(session_id):
            session_id, _, read_at = await self._locate(queue_id)
            data = {"queue_id": queue_id, "text": text}
            await self.store.append(
                session_id, [Draft(ev.QUEUE_UPDATED, data, queued_since=read_at)]
            )
        return {"ok": True, "queue_id": queue_id}

    async def remove(self, queue_id: str) -> dict[str, Any]:
        """Remove a queued message; refused (404) like an edit once it left the queue through
        another replica, and not a start of it: one edited since is still removed."""
        session_id, _, _ = await self._locate(queue_id)
        async with self.sessions.locks(session_id):
            session_id, _, read_at = await self._locate(queue_id)
            data = {"queue_id": queue_id, "reason": "removed"}
            await self.store.append(
                session_id, [Draft(ev.QUEUE_REMOVED, data, queued_since=read_at)]
            )
        return {"ok": True, "queue_id": queue_id}

    async def start(self, queue_id: str, after_seq: int | None = None) -> dict[str, Any]:
        """Start one queued message as the turn now (`POST /api/chat/queue/start`); a refused
        start (`session_busy`, `transcript_changed` for a view changed since `after_seq`,
        ...) raises and leaves it queued."""
        session_id, item, _ = await self._locate(queue_id)
        return await self.engine.start_queued(session_id, item, after_seq)
