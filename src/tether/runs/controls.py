"""Stop, steer and the answers to a running agent's prompts.

Through the process that runs the stream they act on its run at once. On a log shared by
several replicas (PostgreSQL) a Stop for a run this process does not run is recorded in the
log (`run.cancel_requested`, once per run by the backend), and the owner hears it through
the log's wake-up (`on_events`, from the Hub) and stops the run.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.log import Draft, SessionNotFound, StreamClosed
from tether.log.errors import CancelRequested
from tether.log.store import EventStore
from tether.runs.pump import STOP
from tether.runs.registry import CANCELLING, RUNNING, STARTING, Run, RunRegistry

_NOT_RUNNING = "The run is not running any more."
_JUST_FINISHED = "The run has just finished."


def stop_locally(registry: RunRegistry, run: Run) -> None:
    """Stop a run this process runs: busy, never attachable from here on, its model request
    closed now."""
    registry.move(run, CANCELLING)
    run.inbox.put_nowait(STOP)
    if run.producer is not None:  # only an invocation that started is interrupted
        if run.handle is not None:
            run.handle.interrupt()
        run.producer.cancel()


def leftover_drafts(run: Run, leftovers: list[tuple[str, str]]) -> list[Draft]:
    """Steers the run never took in, given back (the page puts them in the composer)."""
    if not leftovers:
        return []
    return [
        Draft(
            ev.STEER_LEFTOVER,
            {
                "stream_id": run.stream_id,
                "steer_ids": [sid for sid, _ in leftovers],
                "text": "\n\n".join(text for _, text in leftovers),
            },
            stream_id=run.stream_id,
            turn_id=run.turn_id,
        )
    ]


def _cancel_draft(stream_id: str, turn_id: str | None) -> Draft:
    return Draft(
        ev.RUN_CANCEL_REQUESTED, {"stream_id": stream_id}, stream_id=stream_id, turn_id=turn_id
    )


class RunControls:
    """`shared_log`: the log is shared with other replicas, so a Stop for a run this
    process does not run is recorded in the log for its owner."""

    def __init__(self, *, store: EventStore, registry: RunRegistry, shared_log: bool = False):
        self.store = store
        self.registry = registry
        self.shared_log = shared_log

    async def _visible(self, run: Run | None) -> Run | None:
        """The run, unless its session is not the requester's: another person's run is no
        run at all, so Stop, steer and answers leave it alone (log/ownership.py)."""
        if run is None or await self.store.last_seq(run.session_id) is None:
            return None
        return run

    # -- Stop -------------------------------------------------------------------------------
    async def cancel(
        self, *, stream_id: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        run = await self._visible(
            self.registry.get(stream_id)
            if stream_id
            else (self.registry.for_session(session_id) if session_id else None)
        )
        if run is None and self.shared_log:
            return await self._cancel_elsewhere(stream_id, session_id)
        if run is None or run.resolved or run.phase not in (STARTING, RUNNING):
            return {
                "ok": True,
                "cancelled": False,
                "stream_id": run.stream_id if run else stream_id,
            }
        stop_locally(self.registry, run)
        try:
            with contextlib.suppress(StreamClosed):  # the worker may have finished meanwhile
                await self.store.append(run.session_id, [_cancel_draft(run.stream_id, run.turn_id)])
        except CancelRequested:  # a Stop through another replica was recorded first
            return {"ok": True, "cancelled": False, "stream_id": run.stream_id}
        return {"ok": True, "cancelled": True, "stream_id": run.stream_id}

    async def _cancel_elsewhere(
        self, stream_id: str | None, session_id: str | None
    ) -> dict[str, Any]:
        """Stop of a run another replica runs: one `run.cancel_requested` in the log (the
        backend records it once per run, so of concurrent Stops through several replicas
        exactly one answers `cancelled: true`)."""
        open_runs = [
            s
            for s in await self.store.unfinished_streams()
            if (s.stream_id == stream_id if stream_id else s.session_id == session_id)
        ]
        if not open_runs:
            return {"ok": True, "cancelled": False, "stream_id": stream_id}
        target = open_runs[-1]
        try:
            await self.store.append(
                target.session_id, [_cancel_draft(target.stream_id, target.turn_id)]
            )
        except (StreamClosed, CancelRequested, SessionNotFound):
            return {"ok": True, "cancelled": False, "stream_id": target.stream_id}
        return {"ok": True, "cancelled": True, "stream_id": target.stream_id}

    # -- steer ------------------------------------------------------------------------------
    async def steer(self, stream_id: str, text: str) -> dict[str, Any]:
        run = await self._visible(self.registry.get(stream_id))
        if run is None or run.resolved or run.phase not in (STARTING, RUNNING):
            return {"accepted": False, "reason": _NOT_RUNNING}
        steer_id = new_id("st")
        try:
            await self.store.append(
                run.session_id, [_steer_draft(stream_id, run.turn_id, steer_id, text)]
            )
        except StreamClosed:
            return {"accepted": False, "reason": _JUST_FINISHED}
        if not run.steer.put(steer_id, text):  # resolved while we appended: give it back
            with contextlib.suppress(StreamClosed):
                await self.store.append(run.session_id, leftover_drafts(run, [(steer_id, text)]))
            return {"accepted": False, "reason": _JUST_FINISHED}
        return {"accepted": True, "steer_id": steer_id}

    # -- answers ----------------------------------------------------------------------------
    async def approve(self, stream_id: str, approval_id: str, choice: str) -> dict[str, Any]:
        """The user's answer to an approval prompt of a running agent. Not accepted when the
        run or the prompt is no longer open (answered, timed out, stopped); a choice the
        open prompt does not offer raises `ChoiceNotOffered` (nothing changes)."""
        run = await self._visible(self.registry.get(stream_id))
        accepted = (
            run is not None
            and not run.resolved
            and run.phase == RUNNING
            and run.approvals.answer(approval_id, choice)
        )
        return {"accepted": accepted, "stream_id": stream_id, "approval_id": approval_id}

    async def answer(self, stream_id: str, question_id: str, text: str) -> dict[str, Any]:
        """The user's answer to a question of a running agent (`clarify.requested`). Not
        accepted when the run or the question is no longer open (answered, timed out,
        stopped)."""
        run = await self._visible(self.registry.get(stream_id))
        accepted = (
            run is not None
            and not run.resolved
            and run.phase == RUNNING
            and run.questions.answer(question_id, text)
        )
        return {"accepted": accepted, "stream_id": stream_id, "question_id": question_id}

    # -- what the log says other replicas recorded ------------------------------------------
    def on_events(self, events: list[ev.Event]) -> None:
        """Committed events, from the Hub: a Stop recorded through another replica reaches
        the run this process runs (its own Stops find the run cancelling already)."""
        for event in events:
            if event.type == ev.RUN_CANCEL_REQUESTED and event.stream_id is not None:
                run = self.registry.get(event.stream_id)
                if run is not None and not run.resolved and run.phase in (STARTING, RUNNING):
                    stop_locally(self.registry, run)


def _steer_draft(stream_id: str, turn_id: str, steer_id: str, text: str) -> Draft:
    return Draft(
        ev.STEER_ACCEPTED,
        {"stream_id": stream_id, "steer_id": steer_id, "text": text},
        stream_id=stream_id,
        turn_id=turn_id,
    )
