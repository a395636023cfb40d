"""The event vocabulary of docs/api.md §6 and the envelope every layer speaks.

Each event type is defined once, below: its name, its payload (a TypedDict: the fields, which
are required, their types) and whether it is durable (stored in the log, folded, replayed) or
a transient frame of the event streams. Everything else derives from these definitions or is
checked against them by tests: the log refuses a payload that does not match (the services'
store, `log/checked.py`), the page listens to the durable types the server lists for it
(`GET /static/js/event_types.js`), and docs/api.md's event table names exactly these fields.

Adding an event type: write its payload TypedDict and one `durable(...)` line here, the folds
that use it (projections/, the page's reducer), and its row in docs/api.md.
"""

# No `from __future__ import annotations` here: a TypedDict tells required from NotRequired
# fields (`__required_keys__`) only from annotations evaluated when its class is made.
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NotRequired, get_args, get_type_hints

from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict, is_typeddict

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


class PayloadMismatch(ValueError):
    """An event's data does not match its type's definition (or the type is not defined): a
    bug in whoever wrote it, refused before anything is stored."""


# Strict: no coercion ("1" is not an int), and no field the definition does not name.
_STRICT = ConfigDict(strict=True, extra="forbid")


def _make_strict(hint: Any) -> None:
    """Give the payload TypedDict, and each TypedDict in its fields, the strict config."""
    if is_typeddict(hint):
        hint.__pydantic_config__ = _STRICT
        for inner in get_type_hints(hint).values():
            _make_strict(inner)
    for arg in get_args(hint):
        _make_strict(arg)


@dataclass(frozen=True)
class EventType:
    """One event type: `name` on the wire, its `payload` TypedDict, and `durable` (in the log)
    or not (a transient stream frame such as `heartbeat`)."""

    name: str
    payload: type
    durable: bool = True
    _adapter: TypeAdapter[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _make_strict(self.payload)
        object.__setattr__(self, "_adapter", TypeAdapter(self.payload))

    @property
    def required(self) -> frozenset[str]:
        return frozenset(self.payload.__required_keys__)  # type: ignore[attr-defined]

    @property
    def optional(self) -> frozenset[str]:
        return frozenset(self.payload.__optional_keys__)  # type: ignore[attr-defined]

    def check(self, data: dict[str, Any]) -> None:
        """PayloadMismatch unless `data` has every required field, no other than the defined
        ones, each of its type (a few microseconds: pydantic-core)."""
        try:
            self._adapter.validate_python(data)
        except ValidationError as exc:
            raise PayloadMismatch(f"{self.name}: {exc}") from None


class Vocabulary:
    """The event types a server speaks, in definition order. `VOCABULARY` is Tether's; a test
    may build a larger one (`extended`) and hand it to the services it builds."""

    def __init__(self, types: Iterable[EventType]):
        self._types: dict[str, EventType] = {}
        for event_type in types:
            if event_type.name in self._types:
                raise ValueError(f"event type {event_type.name!r} is defined twice")
            self._types[event_type.name] = event_type

    def __getitem__(self, name: str) -> EventType:
        return self._types[name]

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[EventType]:
        return iter(self._types.values())

    def durable_names(self) -> list[str]:
        return [t.name for t in self if t.durable]

    def check(self, name: str, data: dict[str, Any]) -> None:
        """What the log may store: a defined durable type with a payload that matches."""
        event_type = self._types.get(name)
        if event_type is None or not event_type.durable:
            raise PayloadMismatch(f"{name!r} is not a durable event type (tether/events.py)")
        event_type.check(data)

    def extended(self, *types: EventType) -> "Vocabulary":
        return Vocabulary([*self, *types])


_DEFINED: list[EventType] = []


def durable(name: str, payload: type) -> str:
    """Define a durable event type (stored in the log, folded, replayed); returns its name."""
    _DEFINED.append(EventType(name, payload))
    return name


def transient(name: str, payload: type) -> None:
    """Define a frame the event streams send that is not in the log (no `id`, not folded);
    `http/streams.py` sends each by its name."""
    _DEFINED.append(EventType(name, payload, durable=False))


# -- payload parts ---------------------------------------------------------------------------
class AttachmentRef(TypedDict):
    """An upload as an event carries it (its bytes live beside the log, docs/api.md §5)."""

    id: str
    name: str
    mime: str
    size: int


class Handoff(TypedDict):
    """What a rotated continuation starts from (docs/compression.md)."""

    summary: str
    tokens_before: int
    tokens_after: int


class RunError(TypedDict):
    code: str
    message: str


class TokenUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int


# -- durable events: the log (docs/api.md §6) -------------------------------------------------
class Imported(TypedDict):
    """Where an imported session came from (docs/api.md §12): `key` makes a second import of
    the same file find it; from ChatGPT, `skipped` counts the messages left out, by reason."""

    source: str  # "tether" | "chatgpt"
    key: str
    origin: str | None
    skipped: NotRequired[dict[str, int]]


class SessionCreated(TypedDict):
    title: str | None
    # a rotated continuation (runs/rotation.py) and a session adopted from the agent's store
    parent_session_id: NotRequired[str]
    handoff: NotRequired[Handoff]
    inherited_updated_at: NotRequired[float]
    inherited_last_message_at: NotRequired[float | None]
    agent_session_id: NotRequired[str]
    imported: NotRequired[Imported]


class SessionUpdated(TypedDict):
    """Metadata, not activity: only what changed."""

    title: NotRequired[str | None]
    pinned: NotRequired[bool]
    archived: NotRequired[bool]
    model: NotRequired[str | None]
    system_prompt: NotRequired[str | None]


class SessionRotated(TypedDict):
    continuation_session_id: str


class TurnSubmitted(TypedDict):
    turn_id: str
    stream_id: str
    text: str
    attachments: list[AttachmentRef]
    submitted_at: float
    # a new branch (docs/api.md §10): an edited message replacing row `edit_of`, or a new
    # answer (`regenerate`, no new user row) to the turn whose answer `regenerate_of` was
    edit_of: NotRequired[str]
    regenerate: NotRequired[bool]
    regenerate_of: NotRequired[str | None]


class RunStarted(TypedDict):
    stream_id: str
    turn_id: str
    runtime: str
    model: NotRequired[str]  # a ChatGPT import without `model_slug` does not know it


class Delta(TypedDict):
    """`reasoning.delta` and `text.delta`: deltas of one item concatenate to its text."""

    stream_id: str
    item_id: str
    text: str


class ReasoningTrimmed(TypedDict):
    """An echo cut from a reasoning item: it keeps its first `length` characters."""

    stream_id: str
    item_id: str
    length: int


class ToolStarted(TypedDict):
    stream_id: str
    call_id: str
    name: str
    args: dict[str, Any]


class ToolCompleted(TypedDict):
    stream_id: str
    call_id: str
    name: str
    result_preview: str
    result: str
    is_error: bool
    duration_ms: int


class CompressionStarted(TypedDict):
    stream_id: str
    pass_id: str


class CompressionCompleted(TypedDict):
    """`summary` is for the agent (its model context); the page never shows it."""

    stream_id: str
    pass_id: str
    tokens_before: int
    tokens_after: int
    summary: str
    boundary_turn_id: str


class RunCancelRequested(TypedDict):
    stream_id: str


class SteerAccepted(TypedDict):
    stream_id: str
    steer_id: str
    text: str


class SteerDelivered(TypedDict):
    stream_id: str
    steer_ids: list[str]


class SteerLeftover(TypedDict):
    stream_id: str
    steer_ids: list[str]
    text: str


class ApprovalRequested(TypedDict):
    stream_id: str
    approval_id: str
    command: str
    description: str
    choices: list[str]


class ApprovalResolved(TypedDict):
    stream_id: str
    approval_id: str
    choice: str
    reason: str


class ApprovalAnswered(TypedDict):
    """The user's answer, recorded for the replica that runs the stream (several replicas)."""

    stream_id: str
    approval_id: str
    choice: str


class ClarifyRequested(TypedDict):
    stream_id: str
    question_id: str
    question: str
    choices: list[str]


class ClarifyResolved(TypedDict):
    stream_id: str
    question_id: str
    text: str
    reason: str


class ClarifyAnswered(TypedDict):
    stream_id: str
    question_id: str
    text: str


class QueueAdded(TypedDict):
    queue_id: str
    text: str
    attachments: list[AttachmentRef]


class QueueUpdated(TypedDict):
    queue_id: str
    text: str


class QueueRemoved(TypedDict):
    queue_id: str
    reason: str  # "removed" | "started" | "moved"
    stream_id: NotRequired[str]  # the run a started message became


class RunFinished(TypedDict):
    stream_id: str
    turn_id: str | None  # None only when recovery settles a stream logged without a turn
    state: str  # one of RUN_STATES
    error: NotRequired[RunError]
    reason: NotRequired[str]
    usage: NotRequired[TokenUsage]
    finish_reason: NotRequired[str]
    maintenance: NotRequired[bool]


class TranscriptTruncated(TypedDict):
    keep_count: int
    transcript_generation: int
    # how the last run of the rows kept ended (the sidebar's mark follows the rows shown)
    last_run_state: NotRequired[str | None]


class BranchSwitched(TypedDict):
    """Row `row_id`, branch `index` of its fork, is shown there, with what was shown below it
    last time; `message_count` is the visible row count after it."""

    row_id: str
    index: int
    message_count: int
    transcript_generation: int
    # how the last run of the branch shown ended (the sidebar's mark follows the branch)
    last_run_state: NotRequired[str | None]


class AgentImported(TypedDict):
    """What another client of the agent wrote into its own store (docs/hermes.md); each entry
    `{kind: "turn", turn_id, rows, context}` or `{kind: "compaction", summary, context}`."""

    source: str
    watermark: int
    entries: list[dict[str, Any]]


class AgentSystemPrompt(TypedDict):
    """The agent's own part of the system message of its latest model request (Hermes: its
    identity, tool guidance, skills and memory), recorded when it changes. The model gets
    `(text + "\\n\\n" + the session's system prompt).strip()`, as Hermes composes it."""

    stream_id: str  # the run whose request it was
    text: str


SESSION_CREATED = durable("session.created", SessionCreated)
SESSION_UPDATED = durable("session.updated", SessionUpdated)
SESSION_ROTATED = durable("session.rotated", SessionRotated)
TURN_SUBMITTED = durable("turn.submitted", TurnSubmitted)
RUN_STARTED = durable("run.started", RunStarted)
REASONING_DELTA = durable("reasoning.delta", Delta)
REASONING_TRIMMED = durable("reasoning.trimmed", ReasoningTrimmed)  # extension
TEXT_DELTA = durable("text.delta", Delta)
TOOL_STARTED = durable("tool.started", ToolStarted)
TOOL_COMPLETED = durable("tool.completed", ToolCompleted)
COMPRESSION_STARTED = durable("compression.started", CompressionStarted)
COMPRESSION_COMPLETED = durable("compression.completed", CompressionCompleted)
RUN_CANCEL_REQUESTED = durable("run.cancel_requested", RunCancelRequested)
STEER_ACCEPTED = durable("steer.accepted", SteerAccepted)
STEER_DELIVERED = durable("steer.delivered", SteerDelivered)  # extension: where it was taken in
STEER_LEFTOVER = durable("steer.leftover", SteerLeftover)
# extensions: the agent asked before running something flagged dangerous, and the answer
APPROVAL_REQUESTED = durable("approval.requested", ApprovalRequested)
APPROVAL_RESOLVED = durable("approval.resolved", ApprovalResolved)
# extension, on a log shared by several replicas: the user's answer, recorded once per prompt
# for the replica that runs the stream (runs/controls.py); `approval.resolved` stays the truth
APPROVAL_ANSWERED = durable("approval.answered", ApprovalAnswered)
# extensions: the agent asked the user a question (Hermes' clarify tool), and the answer
CLARIFY_REQUESTED = durable("clarify.requested", ClarifyRequested)
CLARIFY_RESOLVED = durable("clarify.resolved", ClarifyResolved)
CLARIFY_ANSWERED = durable("clarify.answered", ClarifyAnswered)  # extension, as approval's
QUEUE_ADDED = durable("queue.added", QueueAdded)
QUEUE_UPDATED = durable("queue.updated", QueueUpdated)
QUEUE_REMOVED = durable("queue.removed", QueueRemoved)
RUN_FINISHED = durable("run.finished", RunFinished)
TRANSCRIPT_TRUNCATED = durable("transcript.truncated", TranscriptTruncated)
# extension (docs/api.md §10): another branch of the transcript is shown from a fork on.
BRANCH_SWITCHED = durable("branch.switched", BranchSwitched)
# extension: what another client of the agent wrote into the agent's own store (Hermes
# state.db), reconciled into this session: turns to show, and a compaction done elsewhere.
AGENT_IMPORTED = durable("agent.imported", AgentImported)
# extension: the system prompt the agent puts before the session's own (docs/hermes.md), so
# the context view shows the whole system message the model gets (invariant 1).
AGENT_SYSTEM_PROMPT = durable("agent.system_prompt", AgentSystemPrompt)


# -- transient frames of the event streams (docs/api.md §6, not in the log) ------------------
class Heartbeat(TypedDict):
    """The session stream's carries its position; the sidebar stream's only the time."""

    server_time: float
    last_seq: NotRequired[int]
    busy: NotRequired[bool]
    active_stream_id: NotRequired[str | None]


class SessionSnapshot(TypedDict):
    session: dict[str, Any]


class SessionDeleted(TypedDict):
    session_id: str


class SessionChanged(TypedDict):
    session_id: str
    reason: str
    row: dict[str, Any] | None


class Resync(TypedDict):
    reason: str


transient("heartbeat", Heartbeat)
transient("session.snapshot", SessionSnapshot)
transient("session.deleted", SessionDeleted)
transient("session.changed", SessionChanged)
transient("resync", Resync)

VOCABULARY = Vocabulary(_DEFINED)

# Terminal states of a run (docs/api.md §4): every run ends in exactly one of these.
RUN_STATES = (
    "completed",
    "cancelled",
    "interrupted",
    "error",
    "tool_limit_reached",
    "compression_exhausted",
)


# How a compression summary is framed in a model context (contract invariant 6): reference
# material for the agent, never a request from the user. Runtimes and the context projection
# both use it, so what the model saw mid-turn and what the next turn gets read the same.
SUMMARY_PREFIX = (
    "Summary of the earlier conversation (automatic context compression; reference material "
    "for you, not a new request from the user):\n\n"
)


def summary_message(summary: str) -> dict[str, Any]:
    return {"role": "system", "content": SUMMARY_PREFIX + summary}


def new_id(prefix: str) -> str:
    """Opaque, URL-safe and unguessable; the prefix only helps a human reading logs."""
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class Event:
    """One durable entry of a session's log. `seq` is its position: 1, 2, 3, ... per session."""

    session_id: str
    seq: int
    type: str
    at: float
    data: dict[str, Any] = field(default_factory=dict)
    stream_id: str | None = None
    turn_id: str | None = None

    def envelope(self) -> dict[str, Any]:
        env: dict[str, Any] = {
            "seq": self.seq,
            "session_id": self.session_id,
            "type": self.type,
            "at": self.at,
        }
        if self.stream_id is not None:
            env["stream_id"] = self.stream_id
        if self.turn_id is not None:
            env["turn_id"] = self.turn_id
        env["data"] = self.data
        return env

    @classmethod
    def from_envelope(cls, env: dict[str, Any]) -> "Event":
        return cls(
            session_id=env["session_id"],
            seq=env["seq"],
            type=env["type"],
            at=env["at"],
            data=env.get("data") or {},
            stream_id=env.get("stream_id"),
            turn_id=env.get("turn_id"),
        )
