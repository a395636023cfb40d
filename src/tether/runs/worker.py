"""A run's worker: what happens to a turn once it is recorded (`runs.engine` admits it).

One worker task per run prepares the model context, admits a runtime handle, invokes it,
pumps its events into the log (`runs.pump`) and appends the one `run.finished`.

Agent registration after cancellation (contract): immediately before the runtime is invoked
the worker re-checks the phase and that it still holds its handle, so a Stop that won during
preparation or construction means zero model requests and no interrupt (a stateless
runtime's request may have been sent while the turn committed, with the same check:
runs/invocation.py). The old worker never
touches a successor: the log fences its stream once `run.finished` is written, the registry
removes a run only by identity, and the handle cache releases only what this exact stream owns.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from tether.ingest.normalizer import Normalizer
from tether.log import Draft, SessionNotFound, StorageError, StreamClosed
from tether.log.attachments import BlobStore
from tether.log.store import EventStore
from tether.runs.controls import leftover_drafts, unrecorded_stop
from tether.runs.handles import HandleCache, RuntimeHandle, open_handle
from tether.runs.invocation import keep_early, produce, turn_input
from tether.runs.pump import outcome, pump
from tether.runs.registry import RUNNING, STARTING, Run, RunRegistry
from tether.runtimes.base import Runtime
from tether.sessions.defaults import Defaults
from tether.sessions.service import SessionService

log = logging.getLogger("tether.runs")

# How long a stopped runtime gets to give back the steers it holds (forwarded to its agent,
# never taken in) before the run's end is written with them as `steer.leftover`; one that
# ignores the cancel is not waited for longer (`_unwind`, then the reclaimer).
GIVE_BACK_SECONDS = 0.2


class Rotation(Protocol):
    """After a completed turn, while its run still holds the session (runs.rotation.Rotator):
    returns the session the next turn goes to. A rotation that fails (the summary request,
    the storage) is skipped with a log line and the parent returned; the worker unwinds its
    run whatever happens here (contract invariant 9: an ended run frees its session)."""

    async def maybe_rotate(
        self, session_id: str, normalizer: Normalizer, stop: asyncio.Event
    ) -> str: ...


class WorkerHost(Protocol):
    """What a worker uses of the engine that started it (`runs.engine.RunEngine`), read at
    each use: shutdown sets `closing` while workers run. `start_next` starts the next queued
    message once a completed run has freed its session."""

    store: EventStore
    sessions: SessionService
    registry: RunRegistry
    runtime: Runtime
    attachments: BlobStore
    handles: HandleCache
    rotator: Rotation | None
    coalesce_seconds: float
    closing: bool

    async def start_next(self, session_id: str) -> str | None: ...


async def work(
    engine: WorkerHost,
    run: Run,
    model: str | None,
    normalizer: Normalizer,
    defaults: Defaults | None,
) -> None:
    """A recorded turn's run, as one task (started by `RunEngine._record` once its
    `turn.submitted` is committed). Whatever happens, the run ends with one `run.finished`
    and frees its session; a completed one then lets the next queued message start."""
    state = "error"
    extra: dict[str, Any] = {}
    try:
        turn = await turn_input(engine, run, model, defaults)
        asked = await keep_early(run, turn)  # a stateless runtime's, sent while it committed
        # A stateless runtime's run was admitted, and its run.started written, with the
        # turn (RunEngine._record); any other builds or borrows its handle now.
        handle = run.handle if run.handle is not None else await _admit_handle(engine, run)
        if handle is not None and run.phase == STARTING:
            engine.registry.move(run, RUNNING)
            await engine.store.append(
                run.session_id,
                [normalizer.started(engine.runtime.name, turn.model or engine.runtime.model)],
            )
        # Revalidate right before invocation: Stop may have won during the append.
        if asked:
            pass  # its revalidation was made right before it was sent
        elif (
            handle is not None
            and run.phase == RUNNING
            and engine.handles.holds(run.session_id, run.stream_id, handle)
        ):
            run.producer = asyncio.create_task(produce(handle, turn, run.inbox))
        elif handle is not None:
            retired = engine.handles.retire(run.session_id, run.stream_id)
            if retired is not None:
                await retired.close()
        signal = await pump(
            run,
            normalizer,
            lambda drafts: engine.store.append(run.session_id, drafts),
            engine.coalesce_seconds,
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
        await _given_back(run)
        leftovers = run.steer.close()
        run.approvals.close()  # an agent still asking gets "deny"
        run.questions.close()  # and no answer to its questions
        if run.stop_recording is not None:  # a Stop's record goes before the run's end
            await run.stop_recording.wait()
        if state:
            await _append_ending(
                engine,
                run,
                [
                    *unrecorded_stop(run),
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
            if engine.rotator is not None and state == "completed" and not engine.closing:
                run.rotating = True
                next_session = await engine.rotator.maybe_rotate(
                    run.session_id, normalizer, run.rotation_stop
                )
        finally:  # whatever became of the rotation, the ended run frees its session
            await _unwind(engine, run)
    # a Stop during the rotation: queued messages wait for "Send now", as after any Stop
    if state == "completed" and not engine.closing and not run.rotation_stop.is_set():
        await engine.start_next(next_session)


async def _given_back(run: Run) -> None:
    """A runtime stopped (its task cancelled) gives back in its cleanup what it took from
    the steer inbox but its agent never took in (runtimes/hermes/streaming.py); the worker,
    woken by the same Stop first, waits for that cleanup before it closes the inbox."""
    producer = run.producer
    if producer is not None and not producer.done() and producer.cancelling():
        await asyncio.wait([producer], timeout=GIVE_BACK_SECONDS)


async def _append_ending(engine: WorkerHost, run: Run, drafts: list[Draft]) -> None:
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
            await engine.store.append(run.session_id, drafts)
            return
        except (StreamClosed, SessionNotFound):
            return  # someone else ended it, or the session is gone
        except StorageError as exc:
            if engine.closing:
                log.error("run %s: could not record its end at shutdown: %s", run.stream_id, exc)
                return
            if pause == 0.05:  # the first failure: say it once, not every retry
                log.warning("run %s: could not record its end, retrying: %s", run.stream_id, exc)
            if run.producer is not None:
                run.producer.cancel()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)


async def _admit_handle(engine: WorkerHost, run: Run) -> RuntimeHandle | None:
    """Borrow the session's cached handle or build one; None when Stop won first."""
    sid = run.session_id
    handle = engine.handles.borrow(sid) if engine.handles.owner(sid) is None else None
    if handle is None:
        candidate = await open_handle(engine.runtime, sid)  # construction may take long
        if run.phase not in (STARTING, RUNNING):
            await candidate.close()  # never published: construction-cancellation cleanup
            return None
        handle = candidate
    elif run.phase not in (STARTING, RUNNING):
        return None  # a rejected cache hit: the borrowed handle is left untouched
    for evicted in engine.handles.admit(sid, run.stream_id, handle):
        await evicted.close()
    run.handle = handle
    return handle


async def _unwind(engine: WorkerHost, run: Run) -> None:
    """Wait for the runtime to stop before the session admits a successor; a runtime that
    ignores cancellation is left to the reclaimer."""
    producer = run.producer
    if producer is not None and not producer.done():
        producer.cancel()
        await asyncio.wait([producer])
    # Only now is the handle idle: a wedged run keeps its ownership, so a successor
    # admitted by the reclaimer builds its own handle instead of sharing this one.
    engine.handles.release(run.session_id, run.stream_id)
    engine.registry.remove(run)
