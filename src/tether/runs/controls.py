"""Stop, steer and the answers to a running agent's prompts, through any replica.

Through the process that runs the stream they act on its run at once. On a log shared by
several replicas (PostgreSQL) a replica that does not run it records the control in the log,
the only source, and the owner hears it through the log's wake-up (`on_events`, from the Hub)
and applies it to its run:

- Stop: `run.cancel_requested`, recorded once per run by the backend.
- steer: `steer.accepted`; the owner hands it to the run's inbox, or gives it back as
  `steer.leftover` when the run has resolved.
- answers: `approval.answered` / `clarify.answered`, recorded once per prompt by the backend,
  so of answers sent at once through several replicas (the owner too) exactly one is
  accepted. The runtime's own `approval.resolved` / `clarify.resolved` stays the truth of
  what the agent got.
- a removed person (docs/api.md §15): each of their runs gets the Stop they could have
  sent, through the same path; their queued messages stay queued, as after any Stop.

A replica that does not run the stream decides from the log (the session's fold): the run is
open and not stopping, the prompt was asked, is not resolved and has no answer yet, and a
choice the prompt does not offer raises the same `ChoiceNotOffered` as on the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from tether import events as ev
from tether.events import new_id
from tether.log import Draft, SessionNotFound, StorageError, StreamClosed
from tether.log.completion import to_completion
from tether.log.errors import CancelRequested, PromptAnswered
from tether.log.ownership import VIEWER
from tether.log.store import AccountStore, EventStore
from tether.projections.run_items import RunScene
from tether.runs.pump import STOP, Signal
from tether.runs.registry import CANCELLING, RUNNING, STARTING, Run, RunRegistry
from tether.runtimes.base import ApprovalDesk, ChoiceNotOffered
from tether.sessions.service import SessionService

log = logging.getLogger("tether.runs")

_NOT_RUNNING = "The run is not running any more."
_JUST_FINISHED = "The run has just finished."


def stop_locally(registry: RunRegistry, run: Run, signal: Signal = STOP) -> None:
    """Stop a run this process runs: busy, never attachable from here on, its model request
    closed now; `signal` says why (runs/pump.py `outcome`)."""
    registry.move(run, CANCELLING)
    run.inbox.put_nowait(signal)
    if run.producer is not None:  # only an invocation that started is interrupted
        if run.handle is not None:
            run.handle.interrupt()
        run.producer.cancel()


def unrecorded_stop(run: Run) -> list[Draft]:
    """The Stop the storage refused when it was made (`RunControls._record_stop`), written
    with the run's end."""
    return [_cancel_draft(run.stream_id, run.turn_id)] if run.stop_unrecorded else []


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
    """`shared_log`: the log is shared with other replicas, so a control for a run this
    process does not run is recorded in the log for its owner."""

    def __init__(
        self,
        *,
        store: EventStore,
        sessions: SessionService,
        registry: RunRegistry,
        shared_log: bool = False,
    ):
        self.store = store
        self.sessions = sessions
        self.registry = registry
        self.shared_log = shared_log
        self._own_steers: set[str] = set()  # appended here and put here: on_events skips them
        self._tasks: set[asyncio.Task] = set()

    async def _visible(self, run: Run | None) -> Run | None:
        """The run, unless its session is not the requester's: another person's run is no
        run at all, so Stop, steer and answers leave it alone (log/ownership.py)."""
        if run is None or await self.store.last_seq(run.session_id) is None:
            return None
        return run

    async def _logged(self, stream_id: str) -> tuple[str, RunScene] | None:
        """The session and the live scene of a run the log shows open (another replica's)."""
        stream = await self.store.unfinished_stream(stream_id=stream_id)
        if stream is None:
            return None
        try:
            fold = await self.sessions.folds.get(stream.session_id)
        except SessionNotFound:
            return None
        scene = fold.transcript.active.get(stream_id)
        return None if scene is None else (stream.session_id, scene)

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
        if run is not None and run.rotating and run.phase == RUNNING:
            # Its run.finished (completed) is written; it holds the session for a rotation's
            # summary request, which a Stop closes: the rotation is skipped, the session
            # freed. `cancelled` stays false: this Stop did not decide the run's outcome.
            self.registry.move(run, CANCELLING)
            run.rotation_stop.set()
            return {"ok": True, "cancelled": False, "stream_id": run.stream_id}
        if run is not None and not stream_id and self.shared_log and _unwinding(run):
            # A worker here that ignores its Stop still holds the session; the session's
            # open run, if any, is then another replica's: the Stop is for that one.
            target = await self.store.unfinished_stream(session_id=run.session_id)
            if target is not None and target.stream_id != run.stream_id:
                return await self._cancel_elsewhere(target.stream_id, None)
        if run is None or _unwinding(run):
            return {
                "ok": True,
                "cancelled": False,
                "stream_id": run.stream_id if run else stream_id,
            }
        run.stop_recording = asyncio.Event()
        stop_locally(self.registry, run)
        # One step whatever happens to the caller (`to_completion`): the run is stopped
        # already, so its Stop is recorded even when the client goes away meanwhile.
        return await to_completion(self._record_stop(run, run.stop_recording))

    async def _record_stop(self, run: Run, recording: asyncio.Event) -> dict[str, Any]:
        """The `run.cancel_requested` of a run stopped here, then `recording` set."""
        try:
            if run.turn_recording is not None:  # the Stop's record goes after the turn's
                await run.turn_recording.wait()
                if run.worker is None:  # the turn was refused: there was no run to stop
                    return {"ok": True, "cancelled": False, "stream_id": run.stream_id}
            with contextlib.suppress(StreamClosed):  # recovery or shutdown ended it meanwhile
                await self.store.append(run.session_id, [_cancel_draft(run.stream_id, run.turn_id)])
        except CancelRequested:  # a Stop through another replica was recorded first
            return {"ok": True, "cancelled": False, "stream_id": run.stream_id}
        except StorageError as exc:  # the run is stopped all the same: its end, retried
            run.stop_unrecorded = True  # until the storage takes it, records this Stop
            log.warning("the Stop of run %s is recorded with its end: %s", run.stream_id, exc)
        finally:
            recording.set()  # the worker may now write the run's end
        return {"ok": True, "cancelled": True, "stream_id": run.stream_id}

    async def _cancel_elsewhere(
        self, stream_id: str | None, session_id: str | None
    ) -> dict[str, Any]:
        """Stop of a run another replica runs: one `run.cancel_requested` in the log (the
        backend records it once per run, so of concurrent Stops through several replicas
        exactly one answers `cancelled: true`)."""
        target = (
            await self.store.unfinished_stream(stream_id=stream_id, session_id=session_id)
            if stream_id or session_id
            else None
        )
        if target is None:
            return {"ok": True, "cancelled": False, "stream_id": stream_id}
        try:
            await self.store.append(
                target.session_id, [_cancel_draft(target.stream_id, target.turn_id)]
            )
        except (StreamClosed, CancelRequested, SessionNotFound):
            return {"ok": True, "cancelled": False, "stream_id": target.stream_id}
        return {"ok": True, "cancelled": True, "stream_id": target.stream_id}

    # -- a removed person -------------------------------------------------------------------
    async def stop_runs_of(self, user_id: str) -> list[str]:
        """Stop every run of the person's sessions, here or (on a shared log) anywhere, as
        their own Stop would: one durable `run.cancel_requested` each, then the run's one
        `run.finished` in state `cancelled` (invariant 9's lifecycle, unchanged). It acts as
        that person, so it reaches exactly their runs. The streams Stop decided."""
        viewer = VIEWER.set(user_id)
        try:
            streams = {run.stream_id for run in self.registry.runs()}
            streams.update(stream.stream_id for stream in await self.store.unfinished_streams())
            stopped = []
            for stream_id in sorted(streams):
                if (await self.cancel(stream_id=stream_id))["cancelled"]:
                    stopped.append(stream_id)
            return stopped
        finally:
            VIEWER.reset(viewer)

    async def stop_runs_of_removed(self, accounts: AccountStore) -> None:
        """Stop the runs this process runs whose owner is no longer a user: removed by
        `tether users remove`, which writes the database beside the server, or through
        another replica. Asked at each heartbeat (`stop_removed_forever`)."""
        owners = {
            await self.store.session_owner(run.session_id)
            for run in self.registry.runs()
            if run.phase in (STARTING, RUNNING) and not run.resolved
        }
        for owner in owners:
            if owner is not None and await accounts.user_by_id(owner) is None:
                stopped = await self.stop_runs_of(owner)
                if stopped:  # none when a Stop through another replica got there first
                    log.warning("stopped the run(s) %s of a removed user", ", ".join(stopped))

    async def stop_removed_forever(self, accounts: AccountStore, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.stop_runs_of_removed(accounts)
            except StorageError as exc:
                log.warning("could not look for the runs of removed users: %s", exc)

    # -- steer ------------------------------------------------------------------------------
    async def steer(self, stream_id: str, text: str) -> dict[str, Any]:
        run = await self._visible(self.registry.get(stream_id))
        if run is None and self.shared_log:
            return await self._steer_elsewhere(stream_id, text)
        if run is None or run.resolved or run.phase not in (STARTING, RUNNING):
            return {"accepted": False, "reason": _NOT_RUNNING}
        steer_id = new_id("st")
        self._own_steers.add(steer_id)

        async def append_and_hand_over() -> dict[str, Any]:
            """One step whatever happens to the caller (`to_completion`): once
            `steer.accepted` is committed, the run takes it, or it is given back."""
            await self.store.append(
                run.session_id, [_steer_draft(stream_id, run.turn_id, steer_id, text)]
            )
            if run.steer.put(steer_id, text):
                return {"accepted": True, "steer_id": steer_id}
            with contextlib.suppress(StreamClosed):  # resolved while we appended
                await self.store.append(run.session_id, leftover_drafts(run, [(steer_id, text)]))
            return {"accepted": False, "reason": _JUST_FINISHED}

        try:
            return await to_completion(append_and_hand_over())
        except StreamClosed:
            self._own_steers.discard(steer_id)
            return {"accepted": False, "reason": _JUST_FINISHED}
        except BaseException:
            self._own_steers.discard(steer_id)
            raise

    async def _steer_elsewhere(self, stream_id: str, text: str) -> dict[str, Any]:
        """A steer for a run another replica runs: its `steer.accepted` is in the log before
        this answers, and the owner takes it from there (`on_events`)."""
        found = await self._logged(stream_id)
        if found is None or found[1].phase not in ("starting", "running"):
            return {"accepted": False, "reason": _NOT_RUNNING}
        session_id, scene = found
        steer_id = new_id("st")
        try:
            await self.store.append(
                session_id, [_steer_draft(stream_id, scene.turn_id, steer_id, text)]
            )
        except (StreamClosed, SessionNotFound):
            return {"accepted": False, "reason": _JUST_FINISHED}
        return {"accepted": True, "steer_id": steer_id}

    # -- answers ----------------------------------------------------------------------------
    async def approve(self, stream_id: str, approval_id: str, choice: str) -> dict[str, Any]:
        """The user's answer to an approval prompt of a running agent. Not accepted when the
        run or the prompt is no longer open (answered, timed out, stopped); a choice the
        open prompt does not offer raises `ChoiceNotOffered` (nothing changes)."""
        out = {"accepted": False, "stream_id": stream_id, "approval_id": approval_id}
        data = {"stream_id": stream_id, "approval_id": approval_id, "choice": choice}
        run = await self._visible(self.registry.get(stream_id))
        if run is None:
            found = await self._logged(stream_id) if self.shared_log else None
            if found is not None and _asked(found[1], f"approval.{approval_id}"):
                item = found[1].by_id[f"{stream_id}.approval.{approval_id}"]
                if choice in ApprovalDesk.CHOICES and choice not in item["choices"]:
                    raise ChoiceNotOffered(tuple(item["choices"]))
                if choice in ApprovalDesk.CHOICES:
                    draft = Draft(ev.APPROVAL_ANSWERED, data, stream_id=stream_id)
                    out["accepted"] = await self._record(found[0], draft)
            return out
        if run.resolved or run.phase != RUNNING:
            return out
        if not self.shared_log:
            out["accepted"] = run.approvals.answer(approval_id, choice)
        elif run.approvals.offers(approval_id, choice):  # applied on hearing it (on_events)
            draft = Draft(ev.APPROVAL_ANSWERED, data, stream_id=stream_id, turn_id=run.turn_id)
            out["accepted"] = await self._record(run.session_id, draft)
        return out

    async def answer(self, stream_id: str, question_id: str, text: str) -> dict[str, Any]:
        """The user's answer to a question of a running agent (`clarify.requested`). Not
        accepted when the run or the question is no longer open (answered, timed out,
        stopped)."""
        out = {"accepted": False, "stream_id": stream_id, "question_id": question_id}
        data = {"stream_id": stream_id, "question_id": question_id, "text": text}
        run = await self._visible(self.registry.get(stream_id))
        if run is None:
            found = await self._logged(stream_id) if self.shared_log else None
            if found is not None and _asked(found[1], f"clarify.{question_id}"):
                draft = Draft(ev.CLARIFY_ANSWERED, data, stream_id=stream_id)
                out["accepted"] = await self._record(found[0], draft)
            return out
        if run.resolved or run.phase != RUNNING:
            return out
        if not self.shared_log:
            out["accepted"] = run.questions.answer(question_id, text)
        elif run.questions.asks(question_id):  # applied on hearing it (on_events)
            draft = Draft(ev.CLARIFY_ANSWERED, data, stream_id=stream_id, turn_id=run.turn_id)
            out["accepted"] = await self._record(run.session_id, draft)
        return out

    async def _record(self, session_id: str, draft: Draft) -> bool:
        """Record the prompt's one answer; False when it has one already or the run ended."""
        try:
            await self.store.append(session_id, [draft])
        except (PromptAnswered, StreamClosed, SessionNotFound):
            return False
        return True

    # -- what the log says other replicas recorded ------------------------------------------
    def on_events(self, events: list[ev.Event]) -> None:
        """Committed events, from the Hub: controls recorded through another replica reach
        the run this process runs (its own Stops find the run cancelling already)."""
        for event in events:
            run = self.registry.get(event.stream_id) if event.stream_id else None
            if event.type == ev.STEER_ACCEPTED:
                self._steered(run, event.data["steer_id"], event.data["text"])
            elif run is None or run.resolved:
                continue
            elif event.type == ev.RUN_CANCEL_REQUESTED:
                if run.phase in (STARTING, RUNNING):
                    stop_locally(self.registry, run)
            elif event.type == ev.APPROVAL_ANSWERED and run.phase == RUNNING:
                with contextlib.suppress(ChoiceNotOffered):  # checked before it was recorded
                    run.approvals.answer(event.data["approval_id"], event.data["choice"])
            elif event.type == ev.CLARIFY_ANSWERED and run.phase == RUNNING:
                run.questions.answer(event.data["question_id"], event.data["text"])

    def _steered(self, run: Run | None, steer_id: str, text: str) -> None:
        if steer_id in self._own_steers:
            self._own_steers.discard(steer_id)
            return
        if run is None or run.steer.put(steer_id, text):
            return
        task = asyncio.get_running_loop().create_task(self._give_back(run, steer_id, text))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _give_back(self, run: Run, steer_id: str, text: str) -> None:
        """A steer through another replica that reached a run already resolved."""
        try:
            await self.store.append(run.session_id, leftover_drafts(run, [(steer_id, text)]))
        except (StreamClosed, SessionNotFound):
            pass  # its run.finished came first: the finished row does not show it
        except StorageError as exc:
            log.warning("run %s: could not give back steer %s: %s", run.stream_id, steer_id, exc)


def _unwinding(run: Run) -> bool:
    """The run's end is decided (resolved, or Stopped): its worker only unwinds."""
    return run.resolved or run.phase not in (STARTING, RUNNING)


def _steer_draft(stream_id: str, turn_id: str, steer_id: str, text: str) -> Draft:
    return Draft(
        ev.STEER_ACCEPTED,
        {"stream_id": stream_id, "steer_id": steer_id, "text": text},
        stream_id=stream_id,
        turn_id=turn_id,
    )


def _asked(scene: RunScene, prompt: str) -> bool:
    """The log shows the prompt asked, not resolved and without an answer, in a running run."""
    item = scene.by_id.get(f"{scene.stream_id}.{prompt}")
    return (
        scene.phase == "running"
        and item is not None
        and item["reason"] is None
        and item["id"] not in scene.answered
    )
