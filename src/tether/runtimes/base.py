"""The runtime adapter protocol: a runtime turns a model context into typed events.

Typed events replace the string heuristics of older designs (compression start, error classes,
terminal reasons). A runtime never touches the log: the run engine owns ordering, coalescing
and the single terminal event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from tether.settings import Settings


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolStarted:
    call_id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCompleted:
    call_id: str
    name: str
    result: str
    is_error: bool = False
    duration_ms: int = 0


@dataclass(frozen=True, slots=True)
class CompressionStarted:
    pass_id: str


@dataclass(frozen=True, slots=True)
class CompressionCompleted:
    """A compression pass replaced every visible turn before `boundary_turn_id` (the current
    turn) with `summary` in the model context. The summary is agent-facing handoff material
    (contract invariant 6): it never becomes visible transcript or the user's intent."""

    pass_id: str
    tokens_before: int
    tokens_after: int
    summary: str
    boundary_turn_id: str


@dataclass(frozen=True, slots=True)
class AgentSystemPrompt:
    """The agent's own part of its model request's system message, which it puts before the
    session's system prompt (Hermes); yielded when it changes, so that the context view can
    show the whole system message the model gets (invariant 1)."""

    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    """What the provider reported for one model request (ephemeral: the context meter)."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class AnswerFinished:
    """Why the provider ended the final answer (its `finish_reason`), when it is not a plain
    `"stop"`: `"length"` means the answer was cut off at the token limit, which the row and
    its notice say."""

    finish_reason: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The runtime decided how the run ends, other than plain completion."""

    state: str  # "tool_limit_reached" | "compression_exhausted"
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """The agent wants to run something its safety rules flag (Hermes' dangerous-command
    patterns) and waits for the user's answer; its id is the runtime's."""

    approval_id: str
    command: str
    description: str
    choices: tuple[str, ...] = ("once", "deny")  # what the agent offers, of CHOICES


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    approval_id: str
    choice: str  # one of ApprovalDesk.CHOICES
    reason: str  # "user" | "timeout" | "stopped"


@dataclass(frozen=True, slots=True)
class ClarifyRequested:
    """The agent asks the user a question (Hermes' clarify tool) and waits for the answer:
    free text, or one of its `choices` (none: an open question)."""

    question_id: str
    question: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClarifyResolved:
    question_id: str
    text: str  # the user's answer ("" when nobody answered)
    reason: str  # "user" | "timeout" | "stopped"


RuntimeEvent = (
    ReasoningDelta
    | TextDelta
    | ToolStarted
    | ToolCompleted
    | CompressionStarted
    | CompressionCompleted
    | Usage
    | AgentSystemPrompt
    | AnswerFinished
    | Finished
    | ApprovalRequested
    | ApprovalResolved
    | ClarifyRequested
    | ClarifyResolved
)

# What a turn yields. A generator rather than any iterator, so the engine can close it
# (`contextlib.aclosing`) and the runtime's `finally` closes the model request at once.
RuntimeStream = AsyncGenerator[RuntimeEvent, None]

# Stable error codes of docs/api.md §4.
ERROR_CODES = (
    "auth",
    "rate_limit",
    "model_not_found",
    "context_overflow",
    "network",
    "bad_response",
    "internal",
)


class ProviderError(Exception):
    """The model provider failed; `code` is one of ERROR_CODES, `message` is for people."""

    def __init__(self, code: str, message: str):
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message


class RuntimeUnavailable(Exception):
    """The configured runtime cannot be used (missing extra, bad configuration)."""


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    attachment_id: str
    name: str
    mime: str
    path: Path


@dataclass
class TurnInput:
    session_id: str
    stream_id: str
    turn_id: str
    messages: list[dict[str, Any]]
    """The model context in OpenAI shape (`projections.context`); user content may hold
    `{"type": "attachment", "attachment_id": ...}` parts, resolved through `attachments`."""
    attachments: dict[str, AttachmentRef] = field(default_factory=dict)
    model: str | None = None
    system_prompt: str | None = None
    """The session's system prompt, already the first of `messages` when set: a runtime that
    compresses keeps that message out of what it summarizes."""
    steer: SteerInbox | None = None
    """Text the user sent to the running agent; a runtime drains it at its next step."""
    submitted_at: float | None = None
    """The turn's `submitted_at` in the log (the view's `pending_started_at`)."""
    approvals: ApprovalDesk | None = None
    """Where the user's answers to the run's approval prompts arrive."""
    questions: QuestionDesk | None = None
    """Where the user's answers to the agent's clarify questions arrive."""
    agent_system_prompt: str | None = None
    """The agent's own part of the system message as the log last recorded it: a runtime
    whose agent has one yields `AgentSystemPrompt` only when it differs."""


class SteerInbox:
    """Steering text for one run. The engine puts; the runtime drains at a step boundary
    (after the current tool result); what is never drained comes back as leftover."""

    def __init__(self) -> None:
        self._pending: list[tuple[str, str]] = []
        self.closed = False
        # Told which steers a drain delivered, so the log records where the agent took them.
        self.on_drain: Callable[[list[str]], None] | None = None

    def put(self, steer_id: str, text: str) -> bool:
        if self.closed:
            return False
        self._pending.append((steer_id, text))
        return True

    def drain(self) -> list[str]:
        taken, self._pending = self._pending, []
        if taken and self.on_drain is not None:
            self.on_drain([steer_id for steer_id, _ in taken])
        return [text for _, text in taken]

    def close(self) -> list[tuple[str, str]]:
        """No more steering: return (steer_id, text) of what was never drained."""
        self.closed = True
        taken, self._pending = self._pending, []
        return taken


class ChoiceNotOffered(ValueError):
    """The answer is not one the open prompt offers (the agent hid it: `choices`)."""

    def __init__(self, choices: tuple[str, ...]):
        super().__init__(f"This question offers only: {', '.join(choices)}.")
        self.choices = choices


class ApprovalDesk:
    """A run's open approval prompts. The runtime opens one and waits for its answer; the
    engine answers from `POST /api/chat/approve`; closing the desk (the run ended) denies
    whatever is still open, so an agent never waits on a run that is gone.

    The choices are Hermes Agent's own: `once` (this command, this time), `session` (its
    pattern for the rest of this session), `always` (its permanent allowlist) and `deny`."""

    CHOICES = ("once", "session", "always", "deny")

    def __init__(self) -> None:
        self._open: dict[str, tuple[asyncio.Future[str], tuple[str, ...]]] = {}
        self.closed = False

    def open(
        self, approval_id: str, choices: tuple[str, ...] = ("once", "deny")
    ) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result("deny")
        else:
            self._open[approval_id] = (future, choices)
        return future

    def offers(self, approval_id: str, choice: str) -> bool:
        """True when this prompt is open and would take `choice`. A choice the prompt does
        not offer raises `ChoiceNotOffered`."""
        future, choices = self._open.get(approval_id, (None, ()))
        if future is None or future.done() or choice not in self.CHOICES:
            return False
        if choice not in choices:
            raise ChoiceNotOffered(choices)
        return True

    def answer(self, approval_id: str, choice: str) -> bool:
        """True when this prompt was open and now has the answer. A choice the prompt does
        not offer raises `ChoiceNotOffered` and leaves it open."""
        if not self.offers(approval_id, choice):
            return False
        future, _ = self._open.pop(approval_id)
        future.set_result(choice)
        return True

    def close(self) -> None:
        self.closed = True
        for future, _ in self._open.values():
            if not future.done():
                future.set_result("deny")
        self._open.clear()


class QuestionDesk:
    """A run's open clarify questions, like `ApprovalDesk`: the runtime opens one and waits;
    the engine answers from `POST /api/chat/answer`; closing the desk (the run ended) gives
    whatever is still open None (nobody answered)."""

    def __init__(self) -> None:
        self._open: dict[str, asyncio.Future[str | None]] = {}
        self.closed = False

    def open(self, question_id: str) -> asyncio.Future[str | None]:
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(None)
        else:
            self._open[question_id] = future
        return future

    def asks(self, question_id: str) -> bool:
        """True when this question is open."""
        future = self._open.get(question_id)
        return future is not None and not future.done()

    def answer(self, question_id: str, text: str) -> bool:
        """True when this question was open and now has the answer."""
        future = self._open.pop(question_id, None)
        if future is None or future.done():
            return False
        future.set_result(text)
        return True

    def close(self) -> None:
        self.closed = True
        for future in self._open.values():
            if not future.done():
                future.set_result(None)
        self._open.clear()


@dataclass(frozen=True)
class AgentNews:
    """What an agent that keeps its own history (Hermes' state.db) holds for a session that
    Tether's log does not: the payload of an `agent.imported` event, and a continuation
    session the agent's lineage authorizes (contract: inactive compression continuation
    recovery). Runtimes offering it implement `AgentHistory`. Without `entries` no event is
    written: the runtime keeps, durably and privately, how far it looked, and starts there
    next time."""

    watermark: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    continuation: str | None = None  # the agent's session id that continues this one
    more: bool = False  # a bounded pass stopped short: rows after `watermark` remain


class AgentHistory(Protocol):
    """What runs/agent_sync.py needs of a runtime whose agent keeps its own history."""

    name: ClassVar[str]

    async def agent_news(
        self, session_id: str, watermark: int, continued: Sequence[tuple[str, int]] = ()
    ) -> AgentNews | None:
        """What the agent holds for `session_id` after `watermark`; None while a turn of
        the session is still being written. `continued`: the sessions it continues
        (`session.rotated`), oldest first, each with the watermark its log ended at; what
        their agent sessions got after that is this session's too (their logs are final)."""

    async def agent_changed(self) -> list[str]:
        """Tether sessions whose agent rows moved since the last call."""

    async def agent_started_elsewhere(self, exists: Callable[[str], bool]) -> list[dict[str, Any]]:
        """Agent sessions started in another client that no Tether session drives:
        `{agent_session_id, title, started_at, archived?}` (`archived`: put away there, so
        adopted archived)."""

    async def bind(self, session_id: str, agent_session_id: str) -> bool:
        """Bind the agent session to the Tether session; False when bound elsewhere."""

    async def agent_adopted(self, agent_session_id: str) -> None:
        """The Tether session made for this agent session, started elsewhere, exists now:
        it is never adopted again, also once that session is deleted."""

    async def agent_owner(self, agent_session_id: str) -> str | None:
        """The Tether session bound to this agent session, if any."""

    async def agent_look_again(self) -> None:
        """A pass failed halfway: the next one asks anew even if nothing moved since."""


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can do, declared on its class: `tether runtimes` lists it and
    `GET /api/health` reports it, so nothing has to probe a runtime for methods."""

    streaming: bool = True
    """Text and reasoning arrive as deltas while the model writes."""
    tools: bool = False
    """The agent calls tools (`tool.started` / `tool.completed`)."""
    attachments: tuple[str, ...] = ()
    """The kinds of file a turn may carry (`accepts(mime)` decides each one)."""
    steer: bool = False
    """The agent takes in `TurnInput.steer` at its next step."""
    interrupt: bool = False
    """Stop reaches the agent mid-turn (the request in flight is closed or interrupted)."""
    compression: bool = False
    """The runtime compresses its context (`compression.*` events, `summarize`)."""
    agent_sync: bool = False
    """The agent keeps its own history (`agent_history()`, runs/agent_sync.py)."""
    approvals: bool = False
    """The agent asks before flagged actions (`approval.*` events, `TurnInput.approvals`)."""

    def names(self) -> list[str]:
        """The capabilities it has, by name (attachment kinds as `attachments:<kind>`)."""
        flags = [k for k, v in vars(self).items() if v is True]
        return flags + [f"attachments:{kind}" for kind in self.attachments]


class RuntimeHandle(Protocol):
    """What a stateful runtime builds to run one session's turns (runs/handles.py)."""

    def stream(self, turn: TurnInput) -> RuntimeStream: ...

    def interrupt(self) -> None:
        """Stop the invocation in flight (called only for an admitted, started invocation)."""

    async def close(self) -> None: ...


class Runtime:
    """Who answers a turn: the whole surface the engine, the run handles, rotation, agent
    sync and the health route use. A runtime sets `name`, `model` and `capabilities`,
    implements `stream` (and `summarize` when it compresses) and keeps the defaults for
    what it does not do. Built-ins and plugins alike are registered in the entry-point group
    `tether.runtimes` (docs/runtimes.md)."""

    name: ClassVar[str]
    model: str
    demo: bool = False
    """The offline demo: the page says so."""
    description: ClassVar[str] = ""
    """One line for `tether runtimes`."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    stateless: ClassVar[bool] = False
    """True for a runtime with no per-session state (it keeps the default `open_handle`):
    its turn's `run.started` is then written in the turn's own commit, one durable write
    less before the model is asked (runs/engine.py)."""

    def __init__(self, settings: Settings) -> None:
        """Built once, before the server serves; raise RuntimeUnavailable (with the reason
        a person can act on) to refuse the configuration."""

    @property
    def context_window(self) -> int | None:
        """The model's context size in tokens, once known (the page's context meter)."""
        return None

    @property
    def context_window_source(self) -> str | None:
        """Where `context_window` came from (shown in /api/health; docs/runtimes.md)."""
        return None

    async def list_models(self) -> list[dict[str, Any]]:
        """The models a session may pick (`GET /api/models`), each `{id, context_window?}`:
        by default the one this runtime was configured with. Raises ProviderError when the
        endpoint that knows the list cannot say (the route then answers the default alone)."""
        card: dict[str, Any] = {"id": self.model}
        if self.context_window is not None:
            card["context_window"] = self.context_window
        return [card]

    def accepts(self, mime: str) -> bool:
        """Whether an attachment of this type can go to the model."""
        return False

    def stream(self, turn: TurnInput) -> RuntimeStream:
        """Run the turn. Cancelling the consuming task must stop it promptly, closing any
        model request in flight. Raises ProviderError for provider failures."""
        raise NotImplementedError

    async def summarize(self, messages: list[dict[str, Any]], model: str | None) -> str:
        """A handoff summary of `messages` (for rotation between turns)."""
        raise ProviderError("internal", f"The {self.name} runtime cannot summarize.")

    async def start(self) -> None:
        """Called once when the server starts, on its event loop, before it serves: start
        what should be warm before the first turn (without waiting for it: the first turn
        that needs it waits). A failure here must not stop the server."""
        return None

    def prepare(self, session_id: str) -> None:
        """A session was just created: a runtime with per-session state may start building
        it in the background, so its first turn finds it ready (`open_handle` takes it).
        Never awaited, never failing the caller; by default nothing."""
        return None

    async def open_handle(self, session_id: str) -> RuntimeHandle | None:
        """A handle of the session's own, for a runtime with per-session state; None: the
        engine drives `stream` directly."""
        return None

    def agent_history(self) -> AgentHistory | None:
        """For a runtime whose agent keeps its own history (capability `agent_sync`)."""
        return None

    async def aclose(self) -> None:
        return None
