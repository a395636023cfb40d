"""What a runtime is asked (`turn_input`, from the session's fold: invariant 1) and the task
that asks it (`produce`), including the early request of a stateless runtime.

The early request. A stateless runtime's turn is admitted with its append (runs/engine.py
`_record`), and the model's own latency (milliseconds for a local server, far more for a
hosted one) used to start only once that commit was on disk and the worker had started. So
the request is sent while the turn commits (`ask_early`), built from the fold as it will be
once the turn is in it (`TranscriptFold.context(pending=...)`). It is a guess, checked
before anything of it counts: once the commit is done, the worker builds the turn's input
from the log's fold as always, and keeps the early request (`keep_early`) only when it
asked exactly that (messages, attachments, model, system prompts); otherwise it is cancelled
unread and the model asked again. Its output waits in its own inbox until then, so nothing
of it reaches the log before the turn (invariant 2), and a turn the log refuses cancels it.
A Stop that comes first means no request; one that comes after interrupts it, as any Stop
of an invoked run (the contract's cancellation rules)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tether import events as ev
from tether.events import Event
from tether.ingest.normalizer import SteerDelivered
from tether.log import Draft
from tether.log.attachments import BlobStore
from tether.log.store import EventStore
from tether.runs.pump import END, Signal
from tether.runs.registry import RUNNING, Run
from tether.runtimes.base import AttachmentRef, ProviderError, Runtime, TurnInput
from tether.sessions.defaults import Defaults
from tether.sessions.folds import SessionFold
from tether.sessions.service import SessionService
from tether.visible_text import shown_file_name

if TYPE_CHECKING:
    from tether.runs.handles import HandleCache, RuntimeHandle

log = logging.getLogger("tether.runs")


class WorkerHost(Protocol):
    """What asking a runtime uses of the engine (`runs.worker.WorkerHost` has it all)."""

    store: EventStore
    sessions: SessionService
    runtime: Runtime
    attachments: BlobStore
    handles: HandleCache


def model_for(row: dict[str, Any], asked: str | None, defaults: Defaults) -> str | None:
    """A turn's model: the one it asked for, else the session's own (`PATCH /api/session
    {model}`), else the settings panel's default, else None (the runtime's own)."""
    return asked or row.get("model") or defaults.model


async def turn_input(
    engine: WorkerHost,
    run: Run,
    model: str | None,
    defaults: Defaults | None,
    pending: Draft | None = None,
) -> TurnInput:
    """What the runtime gets: the context the session shows (invariant 1) and the turn's
    model (`model_for`), with the server's defaults as `RunEngine._record` read them.
    `pending`: the turn's `turn.submitted` while it commits (the early request), taken as
    folded when the fold does not hold it yet."""
    folds = engine.sessions.folds
    # while the turn commits, the cached fold as it is (no read of the log for it: the
    # worker's build after the commit is the check); else the log's, caught up
    fold = (pending and folds.cached(run.session_id)) or await folds.get(run.session_id)
    if defaults is None:
        defaults = await engine.sessions.defaults.current()
    model = model_for(fold.row or {}, model, defaults)
    system_prompt = fold.system_prompt(defaults.system_prompt)
    # read with no await in between: the live tail advances a cached fold in place
    unfolded = _unfolded(fold, run, pending)
    messages = fold.transcript.context(system_prompt, unfolded)["context_messages"]
    agent_prompt = fold.transcript.agent_prompt
    rows = list(fold.transcript.messages)
    if unfolded is not None:  # its run.started, in the same append, keeps only this runtime's
        rows.append({"attachments": unfolded.data.get("attachments")})
        if agent_prompt is not None and agent_prompt.runtime != engine.runtime.name:
            agent_prompt = None
    refs: dict[str, AttachmentRef] = {}
    for row in rows:
        for att in row.get("attachments") or []:
            path = await _upload_path(engine, run.session_id, att["id"])
            if path is not None:
                shown = shown_file_name(att["name"])  # as the page names it
                refs[att["id"]] = AttachmentRef(att["id"], shown, att["mime"], path)
    run.steer.on_drain = lambda ids: run.inbox.put_nowait(SteerDelivered(ids))
    user = fold.transcript.users.get(run.turn_id)  # a regenerate's: the turn it answers
    submitted_at = user["created_at"] if user else None
    if user is None and unfolded is not None:
        submitted_at = unfolded.data.get("submitted_at")
    return TurnInput(
        run.session_id,
        run.stream_id,
        run.turn_id,
        messages,
        refs,
        model,
        system_prompt=system_prompt,
        steer=run.steer,
        submitted_at=submitted_at,
        approvals=run.approvals,
        questions=run.questions,
        agent_system_prompt=agent_prompt.text if agent_prompt is not None else None,
    )


def _unfolded(fold: SessionFold, run: Run, pending: Draft | None) -> Event | None:
    if pending is None or run.stream_id in fold.transcript.active:
        return None  # its commit was quicker: the fold holds it
    return Event(
        run.session_id,
        fold.last_seq + 1,
        ev.TURN_SUBMITTED,
        time.time(),
        pending.data,
        pending.stream_id,
        pending.turn_id,
    )


async def _upload_path(engine: WorkerHost, session_id: str, attachment_id: str) -> Path | None:
    upload = await engine.store.attachment(attachment_id, session_id)
    return None if upload is None else await engine.attachments.path(upload["blob"])


async def produce(handle: RuntimeHandle, turn: TurnInput, inbox: asyncio.Queue) -> None:
    """The runtime's events into `inbox`, then END, or the error as a Signal."""
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


@dataclass
class EarlyRequest:
    turn: TurnInput
    inbox: asyncio.Queue[Any]


def ask_early(
    engine: WorkerHost, run: Run, model: str | None, defaults: Defaults, submitted: Draft
) -> None:
    """Ask the model for `run` while its turn (`submitted`) commits: a task, so nothing here
    can come between the turn's append and its outcome (`RunEngine._record`)."""
    run.early = asyncio.create_task(_ask(engine, run, model, defaults, submitted))


async def _ask(
    engine: WorkerHost, run: Run, model: str | None, defaults: Defaults, submitted: Draft
) -> EarlyRequest | None:
    turn = await turn_input(engine, run, model, defaults, pending=submitted)
    handle = run.handle
    # immediately before the invocation, as the worker does: a Stop that won means none
    if (
        handle is None
        or run.phase != RUNNING
        or not engine.handles.holds(run.session_id, run.stream_id, handle)
    ):
        return None
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    run.producer = asyncio.create_task(produce(handle, turn, inbox))
    return EarlyRequest(turn, inbox)


async def drop_early(run: Run) -> None:
    """The turn was not recorded: its early request (if any) is cancelled unread."""
    task, run.early = run.early, None
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # said by the turn's error
        await task
    if run.producer is not None:
        run.producer.cancel()


async def keep_early(run: Run, turn: TurnInput) -> bool:
    """After the commit, in the worker: whether the early request stands. It does when it
    asked what the log's fold asks (`turn`); its inbox then becomes the run's, holding its
    output so far and, after it, any signal sent meanwhile (a Stop that interrupted it).
    Otherwise it is cancelled, its output dropped, and False."""
    task, run.early = run.early, None
    if task is None:
        return False
    try:
        early = await task
    except Exception:
        log.exception("run %s: the early request failed to start", run.stream_id)
        early = None
    if early is not None and _same(early.turn, turn):
        meanwhile, run.inbox = run.inbox, early.inbox
        while not meanwhile.empty():
            run.inbox.put_nowait(meanwhile.get_nowait())
        return True
    producer, run.producer = run.producer, None
    if early is not None and producer is not None:
        log.info("run %s: the log's context differs from the early request's", run.stream_id)
        producer.cancel()
        await asyncio.wait([producer])
    return False


def _same(early: TurnInput, turn: TurnInput) -> bool:
    return (
        early.messages == turn.messages
        and early.attachments == turn.attachments
        and early.model == turn.model
        and early.system_prompt == turn.system_prompt
        and early.agent_system_prompt == turn.agent_system_prompt
        and early.submitted_at == turn.submitted_at
    )
