"""The run engine: admitting and recording a turn (its worker: runs.worker; Stop, steer and
answers: runs.controls).

Agent registration after cancellation (contract): admission, registration in the run registry
and handle admission (`runs.handles`: a stateless runtime's here, with its turn; any other's in
the worker, runs/worker.py) happen on the event loop with no await between check and
publication, so each is one atomic step; the worker re-checks the phase right before it invokes
the runtime.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from tether import events as ev
from tether.errors import ApiError, InvalidRequest, QueueItemNotFound, ServerClosing
from tether.events import new_id
from tether.ingest.normalizer import Normalizer
from tether.log import Draft, SessionNotFound
from tether.log.attachments import BlobStore
from tether.log.completion import to_completion
from tether.log.errors import QueueItemEdited
from tether.log.store import AccountStore, EventStore, SharedLog
from tether.runs.handles import HandleCache, RuntimeHandle, StatelessHandle
from tether.runs.intake import Upload
from tether.runs.invocation import ask_early, drop_early, model_for
from tether.runs.registry import RUNNING, Run, RunRegistry
from tether.runs.worker import Rotation, work
from tether.runtimes.base import Runtime
from tether.sessions.branching import edit_fork, regenerate_fork, shown_generation
from tether.sessions.service import SessionService

log = logging.getLogger("tether.runs")

# How many times a start of a queued message reads it again when another replica edited it
# between the read and the start's append (then 409 queue_item_changed).
QUEUE_READS = 5


class BeforeStart(Protocol):
    """Runs under the session's lock before a turn is admitted (runs.agent_sync.AgentSync)."""

    async def before_start(self, session_id: str) -> None: ...


class RunEngine:
    """`rotator` and `agent_sync` act on the sessions, not on the engine, so they are built
    first and handed in here (tether.services); the queue acts on the engine (it starts
    turns), so it is built after it, and the engine starts the next queued turn itself."""

    def __init__(
        self,
        *,
        store: EventStore,
        sessions: SessionService,
        registry: RunRegistry,
        runtime: Runtime,
        attachments: BlobStore,
        rotator: Rotation | None = None,
        agent_sync: BeforeStart | None = None,
        people: AccountStore | None = None,
        coalesce_seconds: float = 0.016,
    ):
        self.store = store
        self.sessions = sessions
        self.registry = registry
        self.runtime = runtime
        self.attachments = attachments
        # Between turns: rotation runs while the finished run still holds the session, so no
        # turn can slip into the parent; the next queued message starts once it is free.
        self.rotator = rotator
        self.agent_sync = agent_sync  # for runtimes that keep their own history
        # The user modes' accounts: a removed person's queued messages are never sent.
        self.people = people
        self.coalesce_seconds = coalesce_seconds
        self.shared: SharedLog | None = None  # its leases and takeover (runs/leases.py)
        self.handles = HandleCache()
        self.closing = False

    # -- start ------------------------------------------------------------------------------
    async def start(
        self,
        session_id: str,
        text: str,
        uploads: Sequence[Upload] = (),
        model: str | None = None,
        queue_id: str | None = None,
        *,
        edit_of: str | None = None,
        keep_attachments: list[str] | None = None,
        max_attachments: int | None = None,
        after_seq: int | None = None,
    ) -> dict[str, Any]:
        """Admit and record a new turn. `uploads` are stored here, after every refusal.
        With `queue_id` the turn is that queued message, read under the session lock and
        taken off the queue in the same append, so an edit or a removal racing the start
        either lands before it (and is what gets sent) or finds the item gone (404).
        `edit_of` (a visible user row) makes the turn a new branch in that message's place
        (docs/api.md §10), with that message's attachments (those `keep_attachments` names,
        when given). `after_seq`: the position the sender's view of the transcript was
        folded to; a start from a view whose rows were hidden since (another tab switched
        branch, edited, regenerated or cut) is 409 `transcript_changed` (invariant 1).

        Through another replica sharing the database, the item's `queue.removed` carries the
        seq it was read at (`Draft.queued_since`): a start that another replica's edit beat
        is refused and reads the message again, so the edited text is what is sent; one
        another replica started or removed first is 404 (log/pg_batch.py)."""
        args = (session_id, text, uploads, model, queue_id, edit_of, keep_attachments)
        for _ in range(QUEUE_READS - 1):
            try:
                return await self._start(*args, max_attachments, after_seq)
            except QueueItemEdited:
                log.info("queued message %s was edited while it started: read again", queue_id)
        return await self._start(*args, max_attachments, after_seq)

    async def _start(
        self,
        session_id: str,
        text: str,
        uploads: Sequence[Upload],
        model: str | None,
        queue_id: str | None,
        edit_of: str | None,
        keep_attachments: list[str] | None,
        max_attachments: int | None,
        after_seq: int | None,
    ) -> dict[str, Any]:
        async with self.sessions.locks(session_id):
            row = await self._admissible(session_id)
            if keep_attachments is not None and edit_of is None:  # after the 404 and 409s
                raise InvalidRequest("keep_attachments goes with edit_of.")
            shown = None
            if after_seq is not None:  # several replicas: the database checks it again
                shown = shown_generation(await self.sessions.folds.get(session_id), after_seq)
            refs: list[dict[str, Any]] = []
            read_at = None
            if queue_id is not None:
                queued = await self.sessions.folds.get(session_id)
                # read before any await: the live tail advances a cached fold in place
                item, read_at = queued.transcript.queued.get(queue_id), queued.last_seq
                if item is None:
                    raise QueueItemNotFound(
                        "That queued message is not queued any more (it was sent or removed).",
                    )
                text = item["text"]
                refs = [
                    {k: a[k] for k in ("id", "name", "mime", "size")} for a in item["attachments"]
                ]
            before: list[Draft] = []
            extra: dict[str, Any] = {}
            if edit_of is not None:
                fold = await self.sessions.folds.get(session_id)
                before, kept = edit_fork(fold, edit_of, keep_attachments)
                total = len(kept) + len(refs) + len(uploads)
                if max_attachments is not None and total > max_attachments:
                    raise InvalidRequest(
                        f"{total} attachments with the ones kept; at most {max_attachments} "
                        "fit in one message (keep_attachments drops some)."
                    )
                refs = [*kept, *refs]
                extra = {"edit_of": edit_of}
            run = Run(session_id, new_id("r"), new_id("u"))
            submitted = {"text": text, "attachments": list(refs), **extra}
            after: list[Draft] = []
            if queue_id is not None:
                taken = {"queue_id": queue_id, "reason": "started", "stream_id": run.stream_id}
                after.append(Draft(ev.QUEUE_REMOVED, taken, queued_since=read_at))
            started = await self._record(
                run, before, submitted, uploads, after, row, model, shown_generation=shown
            )
        return started

    async def regenerate(
        self,
        session_id: str,
        row_id: str | None = None,
        model: str | None = None,
        after_seq: int | None = None,
    ) -> dict[str, Any]:
        """A new run answering again the turn that the answer `row_id` (default: the last
        one) answered, as a new branch beside it (docs/api.md §10). Retry after a Stop or an
        error is this. Refused exactly like a start, before any write: with `after_seq`, 409
        `transcript_changed` from a view whose rows were hidden since, and without `row_id`
        also from one that lacks the last answer (invariant 1: never an answer the user did
        not see, on a branch they are not looking at)."""
        async with self.sessions.locks(session_id):
            row = await self._admissible(session_id)
            fold = await self.sessions.folds.get(session_id)
            shown = None
            if after_seq is not None:  # several replicas: the database checks it again
                shown = shown_generation(fold, after_seq, last_row=row_id is None)
            before, turn_id, replaced = regenerate_fork(fold, row_id)
            run = Run(session_id, new_id("r"), turn_id)
            submitted = {
                "text": "",
                "attachments": [],
                "regenerate": True,
                "regenerate_of": replaced,
            }
            # A new answer to the unanswered message the transcript ends with hides nothing:
            # its turn is the first draft, and names "the last message" of this fold itself
            # (several replicas: refused, TranscriptMoved, if another one wrote since).
            checked_at = None if before else fold.last_seq
            started = await self._record(
                run,
                before,
                submitted,
                (),
                (),
                row,
                model,
                after_seq=checked_at,
                shown_generation=shown,
            )
        return started

    async def _admissible(self, session_id: str) -> dict[str, Any]:
        if self.agent_sync is not None:  # an unknown session: nothing to sync, 404 below
            await self.agent_sync.before_start(session_id)  # may reveal a continuation
        return await self.check_admissible(session_id, starting=True)

    async def _record(
        self,
        run: Run,
        before: list[Draft],
        fields: dict[str, Any],
        uploads: Sequence[Upload],
        after: Sequence[Draft],
        row: dict[str, Any],
        model: str | None,
        *,
        after_seq: int | None = None,
        shown_generation: int | None = None,
    ) -> dict[str, Any]:
        """Store `uploads`, register `run` and append `before`, its `turn.submitted` and
        `after` in one append, then start its worker (`row`: the session's sidebar row,
        `model`: the one the turn asked for, `after_seq`: the turn's `Draft.after_seq`
        when it comes first, `shown_generation`: the `Draft.shown_generation` of the
        append's first draft, an edit's or a regenerate's truncate when there is one, so a
        database shared by replicas refuses a view whose rows another replica hid as such,
        409, before the truncate's moved position); on any failure the run is unregistered
        and new bytes are released.

        With a stateless runtime there is no handle to build, so the run is admitted here
        and its `run.started` joins the same append: one commit (a WAL fsync) less before
        the model is asked; and for a new turn (no edit, no upload) the model is asked while
        that append commits, the request kept only if it asked what the log then asks
        (runs/invocation.py). A Stop that lands before that request is sent finds the run
        admitted but not invoked; one landing after interrupts it."""
        normalizer = Normalizer(run.stream_id, run.turn_id)
        opening: list[Draft] = []
        defaults = None
        if self.runtime.stateless:
            defaults = await self.sessions.defaults.current()  # the worker's too: one read
            model = model_for(row, model, defaults) or self.runtime.model  # as it says
            opening.append(normalizer.started(self.runtime.name, model))
        async with self.sessions.blob_guard(bool(uploads)):
            new_refs, blobs = await self.store_uploads(uploads)
            run.turn_recording = asyncio.Event()
            self.registry.add(run)
            submitted_at = time.time()
            submitted = {
                "turn_id": run.turn_id,
                "stream_id": run.stream_id,
                **fields,
                "attachments": [*fields["attachments"], *new_refs],
                "submitted_at": submitted_at,
            }
            draft = Draft(
                ev.TURN_SUBMITTED,
                submitted,
                stream_id=run.stream_id,
                turn_id=run.turn_id,
                blobs=blobs,
                admits_run=True,  # several replicas: the database admits (SessionOccupied)
                after_seq=after_seq,
            )
            drafts = [*before, draft, *after, *opening]
            if shown_generation is not None:  # on the first: checked before any position
                drafts[0] = replace(drafts[0], shown_generation=shown_generation)
            if opening:
                self._admit_ready(run, StatelessHandle(self.runtime))

            def start_worker(_: object) -> None:
                run.worker = asyncio.create_task(
                    work(self, run, model, normalizer, defaults), name=run.stream_id
                )

            async def unregister() -> None:
                await drop_early(run)
                self.handles.retire(run.session_id, run.stream_id)
                self.registry.remove(run)
                await self.sessions.release_blobs_held(blobs.values())

            # to its outcome, even for a caller cancelled meanwhile (a client gone, a
            # shutdown): a committed turn always gets its worker, and bytes its event is
            # committing are never released
            appending = asyncio.ensure_future(self.store.append(run.session_id, drafts))
            if opening and not uploads and not before and defaults is not None:
                ask_early(self, run, model, defaults, draft)  # while it commits
            try:
                await to_completion(appending, then=start_worker, undo=unregister)
            finally:
                run.turn_recording.set()  # a Stop that found the run may now record itself
        return {
            "session_id": run.session_id,
            "stream_id": run.stream_id,
            "turn_id": run.turn_id,
            "pending_started_at": submitted_at,
        }

    async def store_uploads(
        self, uploads: Sequence[Upload]
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Write the bytes of `uploads`: (the refs an event carries, their blobs). When one
        cannot be written, the bytes written before it are removed again (503, no trace).
        The caller holds `sessions.blob_guard` until the event holding them is appended."""
        refs: list[dict[str, Any]] = []
        blobs: dict[str, str] = {}
        try:
            for upload in uploads:
                new = await self.attachments.put(upload.data, name=upload.name, mime=upload.mime)
                refs.append(new.ref)
                blobs[new.ref["id"]] = new.blob
        except BaseException:
            await self.sessions.release_blobs_held(blobs.values())
            raise
        return refs, blobs

    def _admit_ready(self, run: Run, handle: RuntimeHandle) -> None:
        """Admit a handle that needs no building: registration, cache and RUNNING in one
        step with no await (the contract's atomic Stop admission)."""
        # What this evicts is stateless too (one runtime per server): nothing to close.
        self.handles.admit(run.session_id, run.stream_id, handle)
        run.handle = handle
        self.registry.move(run, RUNNING)

    async def check_admissible(self, session_id: str, *, starting: bool) -> dict[str, Any]:
        """The refusals that come before any mutation: unknown, rotated (409 session_rotated
        with the newest continuation), and, for a start, busy or shutting down. Returns the
        session's sidebar row."""
        state = await self.store.index_state(session_id)
        if state is None:
            raise SessionNotFound(session_id)
        await self.sessions.refuse_if_rotated(state)
        if not starting:
            return state
        self.sessions.refuse_if_busy(state, "A run is still using this session.")
        if self.closing:
            raise ServerClosing("The server is shutting down.")
        return state

    # -- queued messages (runs.queue) -------------------------------------------------------
    async def start_next(self, session_id: str) -> str | None:
        """Start the oldest queued message as the next turn, but those that wait for the
        user (their run was stopped or failed, or rows were hidden since they were queued:
        docs/api.md §4); None when there is none or the session is taken. It stays queued
        if the start is refused: also when rows were hidden after this fold (another tab or
        replica switched branch as the run ended), checked as a stale view's start."""
        try:
            fold = await self.sessions.folds.get(session_id)
        except SessionNotFound:  # deleted through another replica as its run finished
            return None
        queue = fold.transcript
        item = next((q for q in queue.queued.values() if q["queue_id"] not in queue.held), None)
        seen = fold.last_seq  # read before any await: the live tail advances the fold
        if item is None:
            return None
        if await self._owner_removed(session_id):
            log.info("queued message %s stays queued: its owner was removed", item["queue_id"])
            return None
        try:
            started = await self.start_queued(session_id, item, seen)
        except ApiError as exc:  # busy, rotated, closing, gone: it stays queued
            log.info("queued message %s stays queued: %s", item["queue_id"], exc.message)
            return None
        return started["stream_id"]

    async def _owner_removed(self, session_id: str) -> bool:
        """Whether the session's owner is no longer a user (docs/api.md §15): a run of theirs
        that completed before the removal's Stop reached it (`tether users remove` is seen
        at the next heartbeat) must not send what they queued, for no one may send it now."""
        if self.people is None:
            return False
        owner = await self.store.session_owner(session_id)
        return owner is not None and await self.people.user_by_id(owner) is None

    async def start_queued(
        self, session_id: str, item: dict[str, Any], after_seq: int | None = None
    ) -> dict[str, Any]:
        """Start one queued message as the turn now; a refused start (`session_busy`, ...)
        raises and leaves it queued. `start` reads the item again under the session lock:
        what it sends is the latest edit, and the item leaves the queue in the turn's own
        append. `after_seq`: the view "Send now" was clicked in, checked as a start's."""
        return await self.start(
            session_id, item["text"], queue_id=item["queue_id"], after_seq=after_seq
        )
