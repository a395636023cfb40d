"""The run engine: admission and the worker (Stop, steer and answers: runs.controls).

One worker task per run prepares the model context, admits a runtime handle, invokes it,
pumps its events into the log (`runs.pump`) and appends the one `run.finished`.

Agent registration after cancellation (contract): admission, registration in the run registry
and handle admission (`runs.handles`) happen on the event loop with no await between check and
publication, so each is one atomic step. Immediately before the runtime is invoked the worker
re-checks the phase and that it still holds its handle: a Stop that won during preparation or
construction means zero model requests and no interrupt. The old worker never touches a
successor: the log fences its stream once `run.finished` is written, the registry removes a run
only by identity, and the handle cache releases only what this exact stream owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from tether import events as ev
from tether.errors import ApiError, InvalidRequest, QueueItemNotFound, ServerClosing
from tether.events import new_id
from tether.ingest.normalizer import Normalizer, SteerDelivered
from tether.log import Draft, SessionNotFound, StorageError, StreamClosed
from tether.log.attachments import BlobStore
from tether.log.completion import to_completion
from tether.log.errors import QueueItemEdited
from tether.log.store import EventStore, SharedLog
from tether.runs.controls import leftover_drafts
from tether.runs.handles import HandleCache, RuntimeHandle, StatelessHandle, open_handle
from tether.runs.intake import Upload
from tether.runs.pump import END, Signal, outcome, pump
from tether.runs.registry import RUNNING, STARTING, Run, RunRegistry
from tether.runtimes.base import AttachmentRef, ProviderError, Runtime, TurnInput
from tether.sessions.branching import edit_fork, regenerate_fork, shown_generation
from tether.sessions.defaults import Defaults
from tether.sessions.service import SessionService
from tether.visible_text import shown_file_name

log = logging.getLogger("tether.runs")

# How many times a start of a queued message reads it again when another replica edited it
# between the read and the start's append (then 409 queue_item_changed).
QUEUE_READS = 5


class BeforeStart(Protocol):
    """Runs under the session's lock before a turn is admitted (runs.agent_sync.AgentSync)."""

    async def before_start(self, session_id: str) -> None: ...


class Rotation(Protocol):
    """After a completed turn, while its run still holds the session (runs.rotation.Rotator):
    returns the session the next turn goes to. A rotation that fails (the summary request,
    the storage) is skipped with a log line and the parent returned; the worker unwinds its
    run whatever happens here (contract invariant 9: an ended run frees its session)."""

    async def maybe_rotate(self, session_id: str, normalizer: Normalizer) -> str: ...


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
        the model is asked. A Stop that lands during that append finds the run admitted but
        not invoked, exactly as one landing during a separate `run.started` append would."""
        normalizer = Normalizer(run.stream_id, run.turn_id)
        opening: list[Draft] = []
        defaults = None
        if self.runtime.stateless:
            defaults = await self.sessions.defaults.current()  # the worker's too: one read
            model = _model_for(row, model, defaults) or self.runtime.model  # as it says
            opening.append(normalizer.started(self.runtime.name, model))
        async with self.sessions.blob_guard(bool(uploads)):
            new_refs, blobs = await self.store_uploads(uploads)
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
                    self._work(run, model, normalizer, defaults), name=run.stream_id
                )

            async def unregister() -> None:
                self.handles.retire(run.session_id, run.stream_id)
                self.registry.remove(run)
                await self.sessions.release_blobs_held(blobs.values())

            # to its outcome, even for a caller cancelled meanwhile (a client gone, a
            # shutdown): a committed turn always gets its worker, and bytes its event is
            # committing are never released
            await to_completion(
                self.store.append(run.session_id, drafts),
                then=start_worker,
                undo=unregister,
            )
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
        fold = await self.sessions.folds.get(session_id)
        queue = fold.transcript
        item = next((q for q in queue.queued.values() if q["queue_id"] not in queue.held), None)
        seen = fold.last_seq  # read before any await: the live tail advances the fold
        if item is None:
            return None
        try:
            started = await self.start_queued(session_id, item, seen)
        except ApiError as exc:  # busy, rotated, closing, gone: it stays queued
            log.info("queued message %s stays queued: %s", item["queue_id"], exc.message)
            return None
        return started["stream_id"]

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

    # -- the worker -------------------------------------------------------------------------
    async def _work(
        self, run: Run, model: str | None, normalizer: Normalizer, defaults: Defaults | None
    ) -> None:
        state = "error"
        extra: dict[str, Any] = {}
        try:
            turn = await self._turn_input(run, model, defaults)
            # A stateless runtime's run was admitted, and its run.started written, with the
            # turn (_record); any other builds or borrows its handle now.
            handle = run.handle if run.handle is not None else await self._admit_handle(run)
            if handle is not None and run.phase == STARTING:
                self.registry.move(run, RUNNING)
                await self.store.append(
                    run.session_id,
                    [normalizer.started(self.runtime.name, turn.model or self.runtime.model)],
                )
            # Revalidate right before invocation: Stop may have won during the append.
            if (
                handle is not None
                and run.phase == RUNNING
                and self.handles.holds(run.session_id, run.stream_id, handle)
            ):
                run.producer = asyncio.create_task(self._produce(handle, turn, run.inbox))
            elif handle is not None:
                retired = self.handles.retire(run.session_id, run.stream_id)
                if retired is not None:
                    await retired.close()
            signal = await pump(
                run,
                normalizer,
                lambda drafts: self.store.append(run.session_id, drafts),
                self.coalesce_seconds,
            )
            state, extra = outcome(run, signal, normalizer)
        except StreamClosed:
            state = ""  # someone else (shutdown, recovery) already ended this run
        except StorageError as exc:
            log.error("run %s could not be written: %s", run.stream_id, exc)
            state, extra = "error", {"error": {"code": "internal", "message": str(exc)}}
        except Exception as exc:  # a bug: end the run truthfully, keep the server up
            log.exception("run %s failed", run.stream_id)
            state, extra = "error", {"error": {"code": "internal", "message": repr(exc)}}
        finally:
            run.resolved = True
            leftovers = run.steer.close()
            run.approvals.close()  # an agent still asking gets "deny"
            run.questions.close()  # and no answer to its questions
            if state:
                await self._append_ending(
                    run,
                    [
                        *normalizer.end_item(),
                        *normalizer.open_questions_stopped(),
                        *leftover_drafts(run, leftovers),
                        normalizer.finish(state, **extra),
                    ],
                )
            run.channel_open = False
            run.handle = None  # a final steer drain can never reach a successor's handle
            next_session = run.session_id
            try:
                if self.rotator is not None and state == "completed" and not self.closing:
                    next_session = await self.rotator.maybe_rotate(run.session_id, normalizer)
            finally:  # whatever became of the rotation, the ended run frees its session
                await self._unwind(run)
        if state == "completed" and not self.closing:
            await self.start_next(next_session)

    async def _append_ending(self, run: Run, drafts: list[Draft]) -> None:
        """Write the run's one `run.finished`, retrying while storage fails.

        Fault found by tests/faults/test_storage_faults.py: this append used to swallow a
        `StorageError` (disk full, database read-only), so the worker unregistered a run whose
        ending was never written. The log then showed the turn as live forever (until a
        restart), while the registry already admitted a successor on top of it. Now the run
        keeps the session (busy) and its model request is stopped, since nothing it says can
        be recorded; the ending is retried with backoff until the database takes it. Once
        space returns, the user sees the row settle with its state (`error` and the storage
        message when the failure cut the run). Shutdown stops retrying: start-up recovery
        then settles the run as interrupted.
        """
        pause = 0.05
        while True:
            try:
                await self.store.append(run.session_id, drafts)
                return
            except (StreamClosed, SessionNotFound):
                return  # someone else ended it, or the session is gone
            except StorageError as exc:
                if self.closing:
                    log.error(
                        "run %s: could not record its end at shutdown: %s", run.stream_id, exc
                    )
                    return
                if pause == 0.05:  # the first failure: say it once, not every retry
                    log.warning(
                        "run %s: could not record its end, retrying: %s", run.stream_id, exc
                    )
                if run.producer is not None:
                    run.producer.cancel()
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _admit_ready(self, run: Run, handle: RuntimeHandle) -> None:
        """Admit a handle that needs no building: registration, cache and RUNNING in one
        step with no await (the contract's atomic Stop admission)."""
        # What this evicts is stateless too (one runtime per server): nothing to close.
        self.handles.admit(run.session_id, run.stream_id, handle)
        run.handle = handle
        self.registry.move(run, RUNNING)

    async def _admit_handle(self, run: Run) -> RuntimeHandle | None:
        """Borrow the session's cached handle or build one; None when Stop won first."""
        sid = run.session_id
        handle = self.handles.borrow(sid) if self.handles.owner(sid) is None else None
        if handle is None:
            candidate = await open_handle(self.runtime, sid)  # construction may take long
            if run.phase not in (STARTING, RUNNING):
                await candidate.close()  # never published: construction-cancellation cleanup
                return None
            handle = candidate
        elif run.phase not in (STARTING, RUNNING):
            return None  # a rejected cache hit: the borrowed handle is left untouched
        for evicted in self.handles.admit(sid, run.stream_id, handle):
            await evicted.close()
        run.handle = handle
        return handle

    async def _upload_path(self, session_id: str, attachment_id: str) -> Path | None:
        upload = await self.store.attachment(attachment_id, session_id)
        return None if upload is None else await self.attachments.path(upload["blob"])

    async def _turn_input(
        self, run: Run, model: str | None, defaults: Defaults | None
    ) -> TurnInput:
        """What the runtime gets: the context the session shows (invariant 1) and the
        turn's model (`_model_for`), with the server's defaults as `_record` read them."""
        fold = await self.sessions.folds.get(run.session_id)
        if defaults is None:
            defaults = await self.sessions.defaults.current()
        model = _model_for(fold.row or {}, model, defaults)
        system_prompt = fold.system_prompt(defaults.system_prompt)
        messages = fold.transcript.context(system_prompt)["context_messages"]
        refs: dict[str, AttachmentRef] = {}
        for row in fold.transcript.messages:
            for att in row.get("attachments") or []:
                path = await self._upload_path(run.session_id, att["id"])
                if path is not None:
                    shown = shown_file_name(att["name"])  # as the page names it
                    refs[att["id"]] = AttachmentRef(att["id"], shown, att["mime"], path)
        run.steer.on_drain = lambda ids: run.inbox.put_nowait(SteerDelivered(ids))
        user = fold.transcript.users.get(run.turn_id)
        agent_prompt = fold.transcript.agent_prompt
        return TurnInput(
            run.session_id,
            run.stream_id,
            run.turn_id,
            messages,
            refs,
            model,
            system_prompt=system_prompt,
            steer=run.steer,
            submitted_at=user["created_at"] if user else None,
            approvals=run.approvals,
            questions=run.questions,
            agent_system_prompt=agent_prompt.text if agent_prompt is not None else None,
        )

    async def _produce(self, handle: RuntimeHandle, turn: TurnInput, inbox: asyncio.Queue) -> None:
        try:
            async with contextlib.aclosing(handle.stream(turn)) as events:
                async for event in events:
                    inbox.put_nowait(event)
            inbox.put_nowait(END)
        except ProviderError as exc:
            inbox.put_nowait(Signal("error", exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("runtime failed")
            inbox.put_nowait(Signal("error", ProviderError("internal", f"{exc!r}")))

    async def _unwind(self, run: Run) -> None:
        """Wait for the runtime to stop before the session admits a successor; a runtime that
        ignores cancellation is left to the reclaimer."""
        producer = run.producer
        if producer is not None and not producer.done():
            producer.cancel()
            await asyncio.wait([producer])
        # Only now is the handle idle: a wedged run keeps its ownership, so a successor
        # admitted by the reclaimer builds its own handle instead of sharing this one.
        self.handles.release(run.session_id, run.stream_id)
        self.registry.remove(run)


def _model_for(row: dict[str, Any], asked: str | None, defaults: Defaults) -> str | None:
    """A turn's model: the one it asked for, else the session's own (`PATCH /api/session
    {model}`), else the settings panel's default, else None (the runtime's own)."""
    return asked or row.get("model") or defaults.model
