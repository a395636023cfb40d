"""The worker lifecycle registry, with the two predicates of contract invariant 9.

`busy(session)` answers "may a new turn start?" and counts a cancelling worker that is still
unwinding. `attachable_stream(session)` answers "may a browser render this run?" and never
names a cancelling one. They are two functions over one `Run` state machine
(`starting -> running -> cancelling -> finished`), never one dict read two ways.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.runtimes.base import ApprovalDesk, QuestionDesk, RuntimeHandle, SteerInbox

STARTING, RUNNING, CANCELLING, FINISHED = "starting", "running", "cancelling", "finished"
_NEXT = {
    STARTING: {RUNNING, CANCELLING, FINISHED},
    RUNNING: {CANCELLING, FINISHED},
    CANCELLING: {FINISHED},
    FINISHED: set(),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass(eq=False)
class Run:
    session_id: str
    stream_id: str
    turn_id: str
    started_at: float = field(default_factory=time.time)
    phase: str = STARTING
    cancelled_at: float | None = None
    # The worker's plumbing (runs.worker): its inbox of runtime events and control signals,
    # the runtime's task, whether the worker decided the outcome, and whether its event
    # channel to the log is still open (the reclaimer's second condition).
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue, repr=False)
    worker: asyncio.Task | None = field(default=None, repr=False)
    producer: asyncio.Task | None = field(default=None, repr=False)
    resolved: bool = False
    channel_open: bool = True
    steer: SteerInbox = field(default_factory=SteerInbox, repr=False)
    approvals: ApprovalDesk = field(default_factory=ApprovalDesk, repr=False)
    questions: QuestionDesk = field(default_factory=QuestionDesk, repr=False)
    handle: RuntimeHandle | None = field(default=None, repr=False)  # admitted for this run
    # Set once the run ended completed and holds the session for a rotation's handoff
    # summary (runs/rotation.py); a Stop then sets `rotation_stop`, which skips it.
    rotating: bool = False
    rotation_stop: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # A Stop through this process closes the model request before it records its
    # `run.cancel_requested`; the worker writes `run.finished` only once that record is
    # settled, or the log would fence the Stop's record out (runs/controls.py `cancel`).
    stop_recording: asyncio.Event | None = field(default=None, repr=False)
    # That record was refused (the storage failing): the run's end carries it instead.
    stop_unrecorded: bool = False
    # Set once the append of the run's `turn.submitted` has its outcome (the worker started,
    # or the run unregistered): a Stop that found the run meanwhile records itself only then,
    # after the turn it stops (runs/engine.py `_record`, runs/controls.py `cancel`).
    turn_recording: asyncio.Event | None = field(default=None, repr=False)
    # A stateless runtime asked while the turn commits (runs/invocation.py `ask_early`): the
    # worker keeps that request only when it asked what the committed log asks.
    early: asyncio.Task | None = field(default=None, repr=False)

    def move(self, phase: str) -> None:
        if phase not in _NEXT[self.phase]:
            raise IllegalTransition(f"{self.stream_id}: {self.phase} -> {phase}")
        self.phase = phase
        if phase == CANCELLING:
            self.cancelled_at = time.time()


class RunRegistry:
    """Runs that still occupy a session, by session and by stream. One per process."""

    def __init__(self, on_change: Callable[[str], None] | None = None):
        self._by_session: dict[str, Run] = {}
        self._by_stream: dict[str, Run] = {}
        self._on_change = on_change

    def _changed(self, session_id: str) -> None:
        if self._on_change is not None:
            self._on_change(session_id)

    def add(self, run: Run) -> None:
        if self.busy(run.session_id):
            raise IllegalTransition(f"session {run.session_id} is occupied")
        self._by_session[run.session_id] = run
        self._by_stream[run.stream_id] = run
        self._changed(run.session_id)

    def move(self, run: Run, phase: str) -> None:
        run.move(phase)
        self._changed(run.session_id)

    def remove(self, run: Run) -> None:
        """The worker is gone (or reclaimed): the session admits a successor."""
        if self._by_session.get(run.session_id) is run:
            del self._by_session[run.session_id]
        if self._by_stream.get(run.stream_id) is run:
            del self._by_stream[run.stream_id]
        if run.phase != FINISHED:
            run.phase = FINISHED
        self._changed(run.session_id)

    def get(self, stream_id: str) -> Run | None:
        return self._by_stream.get(stream_id)

    def for_session(self, session_id: str) -> Run | None:
        return self._by_session.get(session_id)

    # -- the two predicates -----------------------------------------------------------------
    def busy(self, session_id: str) -> bool:
        return session_id in self._by_session

    def attachable_stream(self, session_id: str) -> str | None:
        run = self._by_session.get(session_id)
        if run is None or run.phase not in (STARTING, RUNNING):
            return None
        return run.stream_id

    def phase(self, session_id: str) -> str:
        run = self._by_session.get(session_id)
        return "idle" if run is None else run.phase

    def own_stream(self, session_id: str) -> str | None:
        """The stream of the worker here that occupies the session, attachable or not."""
        run = self._by_session.get(session_id)
        return None if run is None else run.stream_id

    def runs(self) -> list[Run]:
        return list(self._by_session.values())
