"""`--compression-mode rotate`: between turns, a session whose context crossed the threshold
continues in a child session.

The turn that crossed the threshold finishes in the parent (compressing in place if it had to).
Then, while that finished run still holds the session (so no turn can slip in through this
replica), one summary request produces the handoff, the child is created with it
(`parent_session_id`, its model context starts from the summary; it shows the parent's
history above its own, display only) and `session.rotated` is appended to the parent.
Rotation is maintenance: the child inherits the parent's `updated_at`, and nothing moves in
the sidebar order.

The handoff summarizes the parent as one fold saw it, so nothing may land in the parent
between that fold and `session.rotated` that the child would not carry (contract invariant
1: what is shown enters the model context). Through this replica, the session's lock is held
from the last look at the parent to the write; through another replica sharing the database
(which sees the run finished, so may take a turn meanwhile), the write carries the fold's last
seq (`Draft.after_seq`) and is refused while a run is unfinished: the database refuses it when
anything was written since. Either way the rotation is planned again on what is there, and
skipped when the parent's model context has changed since the summary (the turn that changed
it rotates in its turn if it crosses the threshold).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.ingest.normalizer import Normalizer
from tether.log import Draft
from tether.log.completion import to_completion
from tether.log.errors import (
    SessionContinued,
    SessionNotFound,
    SessionOccupied,
    StorageError,
    TranscriptMoved,
)
from tether.runtimes.base import ProviderError, Runtime
from tether.sessions.folds import SessionFold
from tether.sessions.service import SessionService
from tether.settings import Settings

log = logging.getLogger("tether.runs")

# On a log shared by replicas, a child younger than this may be another replica's rotation
# between its two writes, not one cut short.
UNFINISHED_AFTER_SECONDS = 600.0

# How many times a rotation is planned again when another replica wrote to the parent
# between its last look and its write, before it is left to a later turn.
PLANS = 3


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """About four characters a token, the estimate the runtimes use without provider usage."""
    return sum(
        len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages
    ) // 4 + 4 * len(messages)


class RotationStopped(Exception):
    """A Stop came before anything of the rotation was written."""


async def _unless_stopped(request: Coroutine[Any, Any, str], stop: asyncio.Event) -> str:
    """The handoff summary, or RotationStopped as soon as `stop` is set: the request is
    cancelled, which closes it at the model server."""
    asking = asyncio.ensure_future(request)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({asking, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (asking, stopping):
            if not task.done():
                task.cancel()
        await asyncio.wait({asking, stopping})
    if stop.is_set():
        raise RotationStopped
    return asking.result()  # the summary, or its ProviderError


class Rotator:
    """The worker's `Rotation` (runs/worker.py): it acts on the sessions, not on the engine."""

    def __init__(self, sessions: SessionService, runtime: Runtime, settings: Settings):
        self.sessions = sessions
        self.runtime = runtime
        self.settings = settings

    def _window(self) -> int | None:
        return self.settings.context_window or self.runtime.context_window

    def crossed(self, normalizer: Normalizer) -> bool:
        if normalizer.compressed:
            return True
        window = self._window()
        usage = normalizer.usage
        if not window or not usage:
            return False
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        return used >= self.settings.compression_threshold * window

    async def maybe_rotate(
        self, session_id: str, normalizer: Normalizer, stop: asyncio.Event | None = None
    ) -> str:
        """Rotate if this turn crossed the threshold; return where the next turn goes.
        `stop` (a Stop of the finished run that holds the session) skips it."""
        if self.settings.compression_mode != "rotate" or not self.crossed(normalizer):
            return session_id
        try:
            return await self.rotate(session_id, stop or asyncio.Event())
        except RotationStopped:
            log.info("rotation of %s skipped: stopped", session_id)
        except SessionNotFound:  # deleted through another replica once its run finished
            log.info("rotation of %s skipped: the session was deleted", session_id)
        except ProviderError as exc:
            log.warning(
                "rotation of %s skipped: the summary request failed: %s", session_id, exc.message
            )
        except StorageError as exc:  # disk full, database away: nothing was rotated
            log.warning("rotation of %s skipped: it could not be written: %s", session_id, exc)
        except Exception:  # a bug: the turn is over all the same, its run must unwind
            log.exception("rotation of %s skipped: it failed", session_id)
        # The parent's context is as large as it was: its next turn crosses the threshold
        # again and rotates then.
        return session_id

    async def rotate(self, parent_id: str, stop: asyncio.Event) -> str:
        sessions = self.sessions
        fold = await sessions.folds.get(parent_id)
        messages = fold.transcript.context()["context_messages"]
        summary = await _unless_stopped(self.runtime.summarize(messages, None), stop)
        handoff = {
            "summary": summary,
            "tokens_before": estimate_tokens(messages),
            "tokens_after": estimate_tokens([{"content": summary}]),
        }
        for _ in range(PLANS):
            async with sessions.locks(parent_id):
                if stop.is_set():  # a Stop as the summary came: nothing written yet
                    raise RotationStopped
                fold = await sessions.folds.get(parent_id)
                if fold.transcript.context()["context_messages"] != messages:
                    break  # a turn, an edit or a switch since: the summary is not of it
                try:
                    return await continue_in(
                        sessions, parent_id, new_id("s"), create=True, fold=fold, handoff=handoff
                    )
                except (TranscriptMoved, SessionOccupied, SessionContinued):
                    continue  # another replica wrote meanwhile: look again
        log.info("rotation of %s skipped: the session moved on meanwhile", parent_id)
        return parent_id


async def continue_in(
    sessions: SessionService,
    parent_id: str,
    child_id: str,
    *,
    create: bool,
    fold: SessionFold | None = None,
    **created: object,
) -> str:
    """Make `parent_id` continue in `child_id` (created here, or already there): the child
    takes the parent's place in the sidebar without looking newer, the parent records
    `session.rotated`, queued messages move along (into the child first, then out of the
    parent with `session.rotated`). `created` goes into the child's
    `session.created` (its handoff, the agent session it drives). The caller holds the
    parent's lock; `fold` is the parent as the caller checked it (default: read here).

    `session.rotated` is refused (TranscriptMoved, SessionOccupied, SessionContinued) when
    another replica wrote to the parent since `fold`, runs a turn in it or rotated it, and
    fails (SessionNotFound) when it deleted it: a child created here is deleted again, and
    the error raised, nothing rotated."""
    store = sessions.store
    if fold is None:
        fold = await sessions.folds.get(parent_id)
    # A cached fold is advanced in place by the live tail (sessions/folds.py): what was
    # checked is read now, before any await lets another replica's events into it.
    seen, moved = fold.last_seq, list(fold.transcript.queued.values())
    parent = await sessions.row(parent_id)
    if parent is None:  # deleted through another replica since `fold`
        raise SessionNotFound(parent_id)
    assert fold.row is not None
    if create:
        await sessions.create_log(
            child_id,
            [
                Draft(
                    ev.SESSION_CREATED,
                    {
                        "title": fold.row["title"] or fold.row["title_from_message"],
                        "parent_session_id": parent_id,
                        "inherited_updated_at": parent["updated_at"],
                        "inherited_last_message_at": parent["last_message_at"],
                        **created,
                    },
                ),
                *_chosen_in_child(parent),
                # queued messages follow the conversation, in the child's creating append:
                # the parent's queue.removed "moved" commits with session.rotated, so no
                # failure in between can lose them
                *_queued_in_child(moved),
            ],
            owner=await store.session_owner(parent_id),  # the parent's person
        )
    copied = [] if create else await _copy_queue(sessions, parent_id, child_id, moved)
    rotated = Draft(
        ev.SESSION_ROTATED,
        {"continuation_session_id": child_id},
        needs_no_run=True,  # several replicas: not under another one's turn,
        after_seq=seen,  # nor after anything the child would not carry
    )
    try:
        await store.append(
            parent_id,
            [rotated]
            + [
                Draft(ev.QUEUE_REMOVED, {"queue_id": q["queue_id"], "reason": "moved"})
                for q in moved
            ],
        )
    except (TranscriptMoved, SessionOccupied, SessionContinued, SessionNotFound, StorageError):
        if create:  # nothing continues in it (nor a parent deleted since `fold`)
            await _remove_unused(sessions, child_id)
        elif copied:  # the parent keeps them: the next pass copies what it has then
            with contextlib.suppress(StorageError):  # that pass removes them as stale
                await store.append(child_id, _moved_back(copied))
        raise
    log.info("session %s continues in %s", parent_id, child_id)
    return child_id


async def _copy_queue(
    sessions: SessionService, parent_id: str, child_id: str, moved: list[dict[str, Any]]
) -> list[str]:
    """Make the child's queue the parent's (`moved`) before the parent lets go of it, so no
    failure between the two writes loses a queued message: a pass cut short there left
    copies in the child, taken as they are; a copy whose original the parent no longer
    queues (sent or removed meanwhile) leaves the child. Returns the queue ids added."""
    child = await sessions.folds.get(child_id)
    in_child = set(child.transcript.queued)
    wanted = {q["queue_id"] for q in moved}
    stale: list[str] = []
    if in_child - wanted:  # copies of another pass, or the child's own: the parent's log tells
        parent_ids = {
            e.data["queue_id"]
            for e in await sessions.store.read(parent_id)
            if e.type == ev.QUEUE_ADDED
        }
        stale = sorted((in_child - wanted) & parent_ids)
    missing = [q for q in moved if q["queue_id"] not in in_child]
    if missing or stale:
        await sessions.store.append(child_id, _queued_in_child(missing) + _moved_back(stale))
    return [q["queue_id"] for q in missing]


def _moved_back(queue_ids: list[str]) -> list[Draft]:
    return [Draft(ev.QUEUE_REMOVED, {"queue_id": q, "reason": "moved"}) for q in queue_ids]


def _chosen_in_child(parent: dict[str, Any]) -> list[Draft]:
    """What the user chose for the conversation (`PATCH /api/session`: its model, system
    prompt, pin, archive) goes on in the child that takes its place: metadata, so it moves
    nothing in the sidebar (invariant 4)."""
    chosen = {key: parent[key] for key in ("pinned", "archived") if parent[key]}
    chosen |= {key: parent[key] for key in ("model", "system_prompt") if parent[key] is not None}
    return [Draft(ev.SESSION_UPDATED, chosen)] if chosen else []


def _queued_in_child(moved: list[dict[str, Any]]) -> list[Draft]:
    return [
        Draft(
            ev.QUEUE_ADDED,
            {
                "queue_id": q["queue_id"],
                "text": q["text"],
                "attachments": [
                    {k: a[k] for k in ("id", "name", "mime", "size")} for a in q["attachments"]
                ],
            },
        )
        for q in moved
    ]


async def _remove_unused(sessions: SessionService, child_id: str) -> None:
    """Delete a child nothing continues in; when the storage refuses that too, it stays (a
    session of its own, its parent not rotated) and the log says so."""
    try:
        await to_completion(sessions.delete(child_id))
    except StorageError as exc:
        log.error("session %s, made for a rotation that failed, stays: %s", child_id, exc)


async def remove_cut_short(sessions: SessionService, *, shared: bool) -> int:
    """Remove the children of rotations cut short between their two writes (the process
    killed after creating the child, before `session.rotated`): each showed the conversation
    a second time beside its parent. Only a child nothing continues in, made by a rotation
    (a handoff; an agent's continuation is completed by the next sync pass instead), holding
    nothing but its creating append (its creation, the parent's choices: `_chosen_in_child`)
    and copies of the parent's queue (the parent still has them): the parent's next turn
    rotates again. A child someone has used stays."""
    store = sessions.store
    states = await store.index_states()
    removed = 0
    for child_id, state in states.items():
        parent = states.get(state["parent_session_id"] or "")
        if parent is None or parent["continuation_session_id"] == child_id:
            continue
        if state["message_count"] or state["open_stream"] or state["last_run_state"]:
            continue
        if shared and time.time() - state["created_at"] < UNFINISHED_AFTER_SECONDS:
            continue
        events = await store.read(child_id)
        if not events or "handoff" not in events[0].data:
            continue
        made = events[0].at  # the creating append: the parent's choices, its queue
        if any(
            e.type not in (ev.SESSION_CREATED, ev.QUEUE_ADDED)
            and not (e.type == ev.SESSION_UPDATED and e.at == made)
            for e in events
        ):
            continue
        try:
            await sessions.delete(child_id)
        except (SessionNotFound, SessionOccupied, StorageError) as exc:  # another replica's
            log.warning("session %s, left by a rotation cut short, stays: %s", child_id, exc)
            continue
        log.warning(
            "removed session %s: the rotation of %s into it was cut short; it rotates again",
            child_id,
            state["parent_session_id"],
        )
        removed += 1
    return removed
