"""The run engine: admission, the worker, Stop, and the terminal event.

One worker task per run pulls the runtime's typed events from the run's inbox, normalises and
coalesces them, and appends them to the log; it alone decides the outcome and appends the one
`run.finished`. Stop, shutdown and the runtime's own end are messages in that same inbox, so
partial output received before a Stop is always logged before the terminal event.

Agent registration after cancellation (contract): admission, registration in the run registry
and Stop admission happen on the event loop without an await between check and publication,
so they are one atomic step. Immediately before the runtime is invoked the worker re-checks
the phase: a Stop that won during preparation means zero model requests. The old worker never
touches a successor: the log fences its stream once `run.finished` is written, and the
registry removes a run only by identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.ingest.normalizer import Normalizer, coalesce
from tether.log import Draft, SessionNotFound, StorageError, StreamClosed
from tether.log.attachments import AttachmentStore
from tether.log.sqlite import SQLiteEventStore
from tether.projections.context import context_messages
from tether.runs.intake import Upload
from tether.runs.registry import CANCELLING, RUNNING, STARTING, Run, RunRegistry
from tether.runtimes.base import (
    AttachmentRef,
    ProviderError,
    ReasoningDelta,
    Runtime,
    TextDelta,
    TurnInput,
)
from tether.sessions.service import SessionError, SessionService

log = logging.getLogger("tether.runs")


@dataclass(frozen=True)
class _Signal:
    kind: str  # "end" | "stop" | "shutdown" | "error"
    error: ProviderError | None = None


END, STOP, SHUTDOWN = _Signal("end"), _Signal("stop"), _Signal("shutdown")
SHUTDOWN_REASON = "the server was shut down while this run was active"


class RunEngine:
    def __init__(self, *, store: SQLiteEventStore, sessions: SessionService,
                 registry: RunRegistry, runtime: Runtime, attachments: AttachmentStore,
                 coalesce_seconds: float = 0.016):
        self.store = store
        self.sessions = sessions
        self.registry = registry
        self.runtime = runtime
        self.attachments = attachments
        self.coalesce_seconds = coalesce_seconds
        self.closing = False

    # -- start ------------------------------------------------------------------------------
    async def start(self, session_id: str, text: str, uploads: list[Upload],
                    model: str | None) -> dict[str, Any]:
        async with self.sessions.locks(session_id):
            state = self.store.index_state(session_id)
            if state is None:
                raise SessionNotFound(session_id)
            if state["continuation_session_id"]:
                raise SessionError(
                    "session_rotated", "This conversation continues in a newer session.",
                    continuation_session_id=self.sessions.newest_continuation(session_id))
            if self.registry.busy(session_id):
                raise SessionError("session_busy", "A run is still using this session.",
                                   active_stream_id=self.registry.attachable_stream(session_id))
            if self.closing:
                raise SessionError("server_closing", "The server is shutting down.")
            refs = [await asyncio.to_thread(self.attachments.put, u.data, name=u.name,
                                            mime=u.mime) for u in uploads]
            run = Run(session_id, new_id("r"), new_id("u"))
            self.registry.add(run)
            submitted_at = time.time()
            try:
                await self.store.append(session_id, [Draft(ev.TURN_SUBMITTED, {
                    "turn_id": run.turn_id, "stream_id": run.stream_id, "text": text,
                    "attachments": refs, "submitted_at": submitted_at,
                }, stream_id=run.stream_id, turn_id=run.turn_id)])
            except BaseException:
                self.registry.remove(run)
                raise
            run.worker = asyncio.create_task(self._work(run, model), name=run.stream_id)
        return {"session_id": session_id, "stream_id": run.stream_id, "turn_id": run.turn_id,
                "pending_started_at": submitted_at}

    # -- Stop -------------------------------------------------------------------------------
    async def cancel(self, *, stream_id: str | None = None,
                     session_id: str | None = None) -> dict[str, Any]:
        run = self.registry.get(stream_id) if stream_id else (
            self.registry.for_session(session_id) if session_id else None)
        if run is None or run.resolved or run.phase not in (STARTING, RUNNING):
            return {"ok": True, "cancelled": False,
                    "stream_id": run.stream_id if run else stream_id}
        self.registry.move(run, CANCELLING)  # busy, never attachable from here on
        run.inbox.put_nowait(STOP)
        if run.producer is not None:
            run.producer.cancel()  # closes the model request now
        with contextlib.suppress(StreamClosed):  # the worker may have finished meanwhile
            await self.store.append(run.session_id, [Draft(
                ev.RUN_CANCEL_REQUESTED, {"stream_id": run.stream_id},
                stream_id=run.stream_id, turn_id=run.turn_id)])
        return {"ok": True, "cancelled": True, "stream_id": run.stream_id}

    # -- the worker -------------------------------------------------------------------------
    async def _work(self, run: Run, model: str | None) -> None:
        normalizer = Normalizer(run.stream_id, run.turn_id)
        state, extra = "error", {}
        try:
            turn = await self._turn_input(run, model)
            if run.phase == STARTING:
                self.registry.move(run, RUNNING)
                await self.store.append(run.session_id, [normalizer.started(
                    self.runtime.name, model or self.runtime.model)])
            # Revalidate right before invocation: a Stop that won means no model request.
            if run.phase == RUNNING:
                run.producer = asyncio.create_task(self._produce(turn, run.inbox))
            state, extra = await self._pump(run, normalizer)
        except StreamClosed:
            state = ""  # someone else (shutdown, reclaimer) already ended this run
        except StorageError as exc:
            log.error("run %s could not be written: %s", run.stream_id, exc)
            state, extra = "error", {"error": {"code": "internal", "message": str(exc)}}
        except Exception as exc:  # a bug: end the run truthfully, keep the server up
            log.exception("run %s failed", run.stream_id)
            state, extra = "error", {"error": {"code": "internal", "message": repr(exc)}}
        finally:
            run.resolved = True
            if state:
                await self._finish(run, normalizer.finish(state, **extra))
            run.channel_open = False
            await self._unwind(run)

    async def _turn_input(self, run: Run, model: str | None) -> TurnInput:
        fold = await self.sessions.folds.get(run.session_id)
        messages = context_messages(fold.transcript.messages)["context_messages"]
        refs: dict[str, AttachmentRef] = {}
        for row in fold.transcript.messages:
            for att in row.get("attachments") or []:
                path = self.attachments.path(att["id"])
                if path is not None:
                    refs[att["id"]] = AttachmentRef(att["id"], att["name"], att["mime"], path)
        return TurnInput(run.session_id, run.stream_id, run.turn_id, messages, refs, model)

    async def _produce(self, turn: TurnInput, inbox: asyncio.Queue) -> None:
        try:
            async with contextlib.aclosing(self.runtime.stream(turn)) as events:
                async for event in events:
                    inbox.put_nowait(event)
            inbox.put_nowait(END)
        except ProviderError as exc:
            inbox.put_nowait(_Signal("error", exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("runtime failed")
            inbox.put_nowait(_Signal("error", ProviderError("internal", f"{exc!r}")))

    async def _pump(self, run: Run, normalizer: Normalizer) -> tuple[str, dict[str, Any]]:
        """Move runtime events into the log until a signal ends the run; return the outcome."""
        inbox = run.inbox
        last_flush = 0.0
        while True:
            items = [await inbox.get()]
            while not inbox.empty():
                items.append(inbox.get_nowait())
            wait = last_flush + self.coalesce_seconds - time.monotonic()
            if wait > 0 and all(isinstance(i, ReasoningDelta | TextDelta) for i in items):
                try:  # gather deltas for at most one coalescing window
                    items.append(await asyncio.wait_for(inbox.get(), wait))
                    while not inbox.empty():
                        items.append(inbox.get_nowait())
                except TimeoutError:
                    pass
            drafts, signal = [], None
            for item in items:
                if isinstance(item, _Signal):
                    signal = item
                    break
                drafts.extend(normalizer.feed(item))
            if drafts:
                await self.store.append(run.session_id, coalesce(drafts))
                last_flush = time.monotonic()
            if signal is None and normalizer.finished is not None:
                signal = END
            if signal is not None:
                return self._outcome(run, signal, normalizer)

    def _outcome(self, run: Run, signal: _Signal,
                 normalizer: Normalizer) -> tuple[str, dict[str, Any]]:
        run.resolved = True  # from here a Stop changes nothing
        if signal is SHUTDOWN:
            return "interrupted", {"reason": SHUTDOWN_REASON, "maintenance": True}
        if run.phase == CANCELLING or signal is STOP:
            return "cancelled", {}
        if signal.kind == "error" and signal.error is not None:
            return "error", {"error": {"code": signal.error.code,
                                       "message": signal.error.message}}
        if normalizer.finished is not None:
            return normalizer.finished.state, {"reason": normalizer.finished.reason}
        return "completed", {}

    async def _finish(self, run: Run, draft: Draft) -> None:
        try:
            await self.store.append(run.session_id, [draft])
        except StreamClosed:
            pass
        except (StorageError, SessionNotFound) as exc:
            log.error("run %s: terminal event not written: %s", run.stream_id, exc)

    async def _unwind(self, run: Run) -> None:
        """Wait for the runtime to stop before the session admits a successor; a runtime that
        ignores cancellation is left to the reclaimer."""
        producer = run.producer
        if producer is not None and not producer.done():
            producer.cancel()
            await asyncio.wait([producer])
        self.registry.remove(run)

    # -- reclaim, recovery, shutdown --------------------------------------------------------
    def reclaim(self, window: float, now: float | None = None) -> list[Run]:
        """Free cancelling runs older than `window` (from the cancel) whose channel is closed:
        both conditions, never age alone (contract invariant 9)."""
        now = time.time() if now is None else now
        freed = []
        for run in self.registry.runs():
            if (run.phase == CANCELLING and not run.channel_open and run.cancelled_at is not None
                    and now - run.cancelled_at >= window):
                self.registry.remove(run)
                freed.append(run)
        return freed

    async def reclaim_forever(self, window: float) -> None:
        while True:
            await asyncio.sleep(min(max(window / 4, 0.05), 5.0))
            for run in self.reclaim(window):
                log.warning("reclaimed run %s: its worker did not unwind within %.1f s",
                            run.stream_id, window)

    async def recover(self) -> int:
        """At start: settle every run the previous process left open, as interrupted. Its
        turn and partial output stay visible and in the model context; no timestamp moves."""
        unfinished = await asyncio.to_thread(self.store.unfinished_streams)
        for session_id, stream_id, turn_id in unfinished:
            await self._finish(Run(session_id, stream_id, turn_id or ""), Draft(
                ev.RUN_FINISHED,
                {"stream_id": stream_id, "turn_id": turn_id, "state": "interrupted",
                 "reason": "Tether stopped before this run finished", "maintenance": True},
                stream_id=stream_id, turn_id=turn_id))
        return len(unfinished)

    async def shutdown(self, grace: float = 5.0) -> None:
        """Make every in-flight run durable as interrupted before the process exits."""
        self.closing = True
        runs = self.registry.runs()
        for run in runs:
            if not run.resolved:
                run.inbox.put_nowait(SHUTDOWN)
            if run.producer is not None:
                run.producer.cancel()
        workers = [r.worker for r in runs if r.worker is not None and not r.worker.done()]
        if workers:
            await asyncio.wait(workers, timeout=grace)
        await self.recover()
