"""One turn on a Hermes handle: send it, map the sidecar's events to typed runtime events,
forward steers, and stop the agent when the consumer stops (Stop cancels the task).

The sidecar exiting mid-turn (killed, crashed) ends the run `interrupted`: the agent did not
fail, its process went away (every run on that sidecar ends so; the next turn builds a new
agent in a new sidecar, pool.py).

Steer: the handle drains the run's `SteerInbox` every STEER_POLL_SECONDS and forwards the
text to the sidecar (`AIAgent.steer()`); the inbox's `on_drain` (which records where the
agent took the steer) is called only when the sidecar reports `steer_taken`. What the agent
never took is put back into the inbox, so the engine reports it as leftover.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from tether.runtimes.base import (
    AgentSystemPrompt,
    AnswerFinished,
    ApprovalDesk,
    ApprovalRequested,
    ApprovalResolved,
    ClarifyRequested,
    ClarifyResolved,
    CompressionCompleted,
    CompressionStarted,
    Finished,
    ProviderError,
    ReasoningDelta,
    RuntimeEvent,
    RuntimeStream,
    RuntimeUnavailable,
    SteerInbox,
    TextDelta,
    ToolCompleted,
    ToolStarted,
    TurnInput,
    Usage,
)
from tether.runtimes.hermes.client import AgentChannel
from tether.runtimes.hermes.messages import split_turn
from tether.runtimes.hermes.proofs import Proof, ProofStore

STEER_POLL_SECONDS = 0.05
SIDECAR_EXITED = "the Hermes sidecar exited during the turn"


class TurnHost(Protocol):
    """What a turn needs of the runtime that owns its handle (runtime.HermesRuntime)."""

    proofs: ProofStore

    def next_timestamp(self) -> float: ...


class TurnHandle(Protocol):
    """What a turn needs of its session's handle (runtime.HermesHandle). Declared here, so
    this module needs nothing from runtime.py, which imports it."""

    agent_session_id: str
    turn_open: bool

    @property
    def runtime(self) -> TurnHost: ...

    async def settle_previous(self) -> None: ...

    async def ensure_started(self) -> AgentChannel: ...

    def release(self, channel: AgentChannel) -> None: ...

    def turn_begins(self, stream_id: str) -> None: ...

    async def turn_done(self, event: dict[str, Any]) -> None: ...

    def interrupt(self) -> None: ...


class _Steers:
    """The steers of one turn between the engine's inbox and the agent."""

    def __init__(self, inbox: SteerInbox | None):
        self.inbox = inbox
        self.forwarded: dict[str, str] = {}  # steer_id -> text, in forwarding order

    def take_new(self) -> list[tuple[str, str]]:
        inbox = self.inbox
        if inbox is None or inbox.closed:
            return []
        ids: list[str] = []
        notify: Callable[[list[str]], None] | None = inbox.on_drain
        inbox.on_drain = ids.extend  # hold back delivery until the agent takes them
        try:
            texts = inbox.drain()
        finally:
            inbox.on_drain = notify
        pairs = list(zip(ids, texts, strict=True))
        self.forwarded.update(pairs)
        return pairs

    def taken(self, steer_ids: list[str]) -> None:
        ids = [i for i in steer_ids if self.forwarded.pop(i, None) is not None]
        if ids and self.inbox is not None and self.inbox.on_drain is not None:
            self.inbox.on_drain(ids)

    def give_back(self) -> None:
        """Everything forwarded but never taken goes back to the inbox (→ leftover)."""
        if self.inbox is not None:
            for steer_id, text in self.forwarded.items():
                self.inbox.put(steer_id, text)
        self.forwarded.clear()


def _map(event: dict[str, Any], turn: TurnInput) -> RuntimeEvent | None:
    kind = event.get("ev")
    if kind == "reasoning":
        return ReasoningDelta(str(event.get("text") or ""))
    if kind == "text":
        return TextDelta(str(event.get("text") or ""))
    if kind == "tool_started":
        args = event.get("args")
        return ToolStarted(
            str(event.get("call_id")),
            str(event.get("name")),
            args if isinstance(args, dict) else {},
        )
    if kind == "tool_completed":
        return ToolCompleted(
            str(event.get("call_id")),
            str(event.get("name")),
            str(event.get("result") or ""),
            bool(event.get("is_error")),
            int(event.get("duration_ms") or 0),
        )
    if kind == "compression_started":
        return CompressionStarted(str(event.get("pass_id")))
    if kind == "compression_completed":
        return CompressionCompleted(
            str(event.get("pass_id")),
            int(event.get("tokens_before") or 0),
            int(event.get("tokens_after") or 0),
            str(event.get("summary") or ""),
            turn.turn_id,
        )
    if kind == "approval_requested":
        return ApprovalRequested(
            str(event.get("approval_id")),
            str(event.get("command") or ""),
            str(event.get("description") or ""),
            _choices(event),
        )
    if kind == "approval_resolved":
        return ApprovalResolved(
            str(event.get("approval_id")),
            str(event.get("choice")),
            str(event.get("reason") or "user"),
        )
    if kind == "clarify_requested":
        offered = event.get("choices")
        return ClarifyRequested(
            str(event.get("question_id")),
            str(event.get("question") or ""),
            tuple(str(c) for c in offered) if isinstance(offered, list) else (),
        )
    if kind == "clarify_resolved":
        return ClarifyResolved(
            str(event.get("question_id")),
            str(event.get("text") or ""),
            str(event.get("reason") or "user"),
        )
    if kind == "usage":
        return Usage(int(event.get("prompt_tokens") or 0), int(event.get("completion_tokens") or 0))
    return None


async def _prove(proofs: ProofStore, agent_session_id: str, turn: TurnInput, ts: float) -> None:
    """The binding and the turn's proof, once the agent confirmed it got the timestamp."""
    await asyncio.to_thread(proofs.bind, turn.session_id, agent_session_id)
    await asyncio.to_thread(
        proofs.record,
        Proof(turn.session_id, turn.stream_id, turn.turn_id, agent_session_id, ts),
    )


def _iteration_limit(done: dict[str, Any]) -> str | None:
    """Why the turn stopped short when Hermes stopped it at its iteration limit
    (`turn_exit_reason` `max_iterations_reached(2/2)`) before a final answer: the model was
    still calling tools, or still being asked to continue an answer cut off."""
    reason = str(done.get("turn_exit_reason") or "")
    if done.get("interrupted") or not reason.startswith("max_iterations_reached"):
        return None
    used = reason.partition("(")[2].rstrip(")").partition("/")[2]
    count = f"{used} iterations" if used.isdigit() else "its iterations"
    return (
        f"Hermes Agent stopped after {count}, its limit for one turn (max_iterations), "
        "before a final answer. Send a message to let it continue."
    )


def _still_truncated(done: dict[str, Any]) -> bool:
    """Hermes asks the model to continue an answer cut at the token limit, a few times,
    then gives up and returns what it has: "Response remained truncated after N
    continuation attempts"."""
    return (
        not done.get("completed")
        and not done.get("interrupted")
        and "remained truncated" in str(done.get("error") or "")
    )


def _no_answer(done: dict[str, Any]) -> str | None:
    """Why the turn ended without an answer, when Hermes ended it so without calling it a
    failure: the model replied with nothing, again after Hermes' retries
    (`empty_response_exhausted`, whose `final_response` is Hermes' own note, never
    streamed), or the turn ended with no final response at all (`completed` false). The run
    would otherwise end `completed` with an empty answer and nothing saying why."""
    if done.get("interrupted") or done.get("failed"):
        return None
    reason = str(done.get("turn_exit_reason") or "")
    if reason == "empty_response_exhausted":
        return (
            "Hermes Agent: the model returned nothing (an empty reply, again after Hermes' "
            "retries), so the turn has no answer. Send the message again, or choose "
            "another model."
        )
    if not done.get("completed"):
        return (
            "Hermes Agent ended the turn without an answer "
            f"(turn_exit_reason: {reason or 'none given'}). Send the message again."
        )
    return None


def _choices(event: dict[str, Any]) -> tuple[str, ...]:
    """The answers the agent offers for this prompt (sidecar.py `on_approval`)."""
    offered = event.get("choices")
    if not isinstance(offered, list):
        return ("once", "deny")
    return tuple(c for c in ApprovalDesk.CHOICES if c in offered) or ("once", "deny")


async def run_turn(handle: TurnHandle, turn: TurnInput) -> RuntimeStream:
    await handle.settle_previous()
    try:
        channel = await handle.ensure_started()
    except RuntimeUnavailable as exc:  # the sidecar cannot start: the run ends saying why
        raise ProviderError("internal", str(exc)) from exc
    channel.busy = True  # no await since it was handed out: it cannot be evicted meanwhile
    try:
        async with contextlib.aclosing(_drive(handle, channel, turn)) as events:
            async for event in events:
                yield event
    finally:
        handle.release(channel)


async def _drive(handle: TurnHandle, channel: AgentChannel, turn: TurnInput) -> RuntimeStream:
    history, message, persist_text = await asyncio.to_thread(split_turn, turn)
    runtime = handle.runtime
    # The contract's proof value: the turn's exact `pending_started_at`.
    timestamp = turn.submitted_at if turn.submitted_at is not None else runtime.next_timestamp()
    steers = _Steers(turn.steer)
    await asyncio.to_thread(handle.turn_begins, turn.stream_id)
    channel.send(
        {
            "op": "turn",
            "id": turn.turn_id,
            "history": history,
            "message": message,
            "persist_user_message": persist_text,
            "persist_user_timestamp": timestamp,
            "model": turn.model,
            "system_prompt": turn.system_prompt or None,
            "task_id": turn.stream_id,
        }
    )
    handle.turn_open = True
    done = False
    proving: asyncio.Future[None] | None = None
    agent_prompt = turn.agent_system_prompt  # as the log holds it
    asked: dict[str, asyncio.Future[str]] = {}  # approval prompts the user has not answered
    questions: dict[str, asyncio.Future[str | None]] = {}  # clarify questions, likewise
    try:
        while True:
            for steer_id, text in steers.take_new():
                channel.send({"op": "steer", "steer_id": steer_id, "text": text})
            for approval_id, answer in list(asked.items()):
                if answer.done():
                    del asked[approval_id]
                    channel.send(
                        {"op": "approve", "approval_id": approval_id, "choice": answer.result()}
                    )
            for question_id, reply in list(questions.items()):
                if reply.done():
                    del questions[question_id]
                    if reply.result() is not None:  # None: the run ended (Stop answers it)
                        channel.send(
                            {"op": "answer", "question_id": question_id, "text": reply.result()}
                        )
            try:  # what is queued already needs no timer (a stream of deltas)
                event = channel.events.get_nowait()
            except asyncio.QueueEmpty:
                try:  # not wait_for: on Python 3.11 it can swallow a Stop's cancel
                    async with asyncio.timeout(STEER_POLL_SECONDS):
                        event = await channel.events.get()
                except TimeoutError:
                    continue
            kind = event.get("ev")
            if kind in ("eof", "done") and proving is not None:
                await proving
            if kind == "eof":
                handle.turn_open = False
                done = True
                steers.give_back()
                yield Finished("interrupted", SIDECAR_EXITED)
                return
            if kind == "accepted":
                handle.agent_session_id = str(event.get("session_id") or handle.agent_session_id)
                # Written while the turn streams (each is a commit): done waits for them.
                proving = asyncio.ensure_future(
                    _prove(
                        runtime.proofs,
                        handle.agent_session_id,
                        turn,
                        float(event.get("persist_user_timestamp") or timestamp),
                    )
                )
                continue
            if kind == "approval_requested":
                approval_id = str(event.get("approval_id"))
                if turn.approvals is not None:
                    asked[approval_id] = turn.approvals.open(approval_id, _choices(event))
                else:  # driven without a way to ask anyone: refuse
                    channel.send({"op": "approve", "approval_id": approval_id, "choice": "deny"})
            if kind == "clarify_requested":
                question_id = str(event.get("question_id"))
                if turn.questions is not None:
                    questions[question_id] = turn.questions.open(question_id)
                else:  # driven without a way to ask anyone: nobody answers
                    channel.send({"op": "answer", "question_id": question_id, "text": ""})
            if kind == "system_prompt":
                text = str(event.get("text") or "")
                if text != agent_prompt:  # recorded only when it changed
                    agent_prompt = text
                    yield AgentSystemPrompt(text)
                continue
            if kind == "steer_taken":
                steers.taken([str(i) for i in event.get("steer_ids") or []])
                continue
            if kind == "compression_completed" and event.get("session_id"):
                handle.agent_session_id = str(event["session_id"])
                await asyncio.to_thread(
                    runtime.proofs.bind, turn.session_id, handle.agent_session_id
                )
            if kind == "done":
                done = True
                await handle.turn_done(event)
                steers.give_back()
                if event.get("failed"):
                    raise ProviderError(
                        event.get("error_code") or "internal",
                        f"Hermes Agent: {event.get('error') or 'the turn failed'}",
                    )
                limit = _iteration_limit(event)
                if limit is not None:
                    yield Finished("tool_limit_reached", limit)
                elif _still_truncated(event):
                    yield AnswerFinished("length")
                elif (nothing := _no_answer(event)) is not None:
                    raise ProviderError("bad_response", nothing)
                return
            mapped = _map(event, turn)
            if mapped is not None:
                yield mapped
            else:
                channel.handle_side_event(event)
    finally:
        if not done:  # the consumer stopped (Stop, shutdown): stop the agent too
            handle.interrupt()
            steers.give_back()
