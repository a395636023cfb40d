"""Request bodies and query parameters, validated strictly: a wrong type is a 400, never a
silent coercion, and text must be valid Unicode (no lone surrogates). Unknown fields are
ignored so newer clients keep working. The response models below document the API only."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from tether.events import ID_PATTERN
from tether.sessions.defaults import SYSTEM_PROMPT_MAX_CHARS
from tether.visible_text import holds_half_pair

Id = Annotated[StrictStr, Field(pattern=ID_PATTERN)]
# A transcript row's id: a turn or stream id, or an imported answer's `<turn id>.reply`.
RowId = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.-]{1,80}$")]
SessionIdQuery = Annotated[str, Query(pattern=ID_PATTERN, description="A session id")]
QueueIdQuery = Annotated[str, Query(pattern=ID_PATTERN, description="A queued message id")]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if holds_half_pair(data):
            raise ValueError("text must be valid Unicode (a lone surrogate such as \\ud800 is not)")
        return data


class CreateSession(Body):
    title: StrictStr | None = None


ModelId = Annotated[StrictStr, Field(min_length=1, max_length=200)]


class PatchSession(Body):
    session_id: Id
    title: StrictStr | None = None
    pinned: StrictBool | None = None
    archived: StrictBool | None = None
    model: ModelId | None = Field(
        default=None, description="The session's model id; `null`: the server default"
    )
    system_prompt: Annotated[StrictStr, Field(max_length=SYSTEM_PROMPT_MAX_CHARS)] | None = Field(
        default=None, description="The session's system prompt; `null`: the server default"
    )


class PatchSettings(Body):
    default_model: ModelId | None = Field(
        default=None, description="The default model id; `null`: the command line's (`--model`)"
    )
    default_system_prompt: (
        Annotated[StrictStr, Field(max_length=SYSTEM_PROMPT_MAX_CHARS)] | None
    ) = Field(
        default=None,
        description="The default system prompt (blank: none); `null`: `--system-prompt`",
    )


class TruncateSession(Body):
    session_id: Id
    keep_count: Annotated[StrictInt, Field(ge=0, le=10_000_000)]


class AttachmentUpload(Body):
    name: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    mime: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    data_base64: StrictStr


# The position a client's view of the transcript was folded to (the `last_seq` of its
# snapshot, or the seq of the last event it folded): a start or a regenerate from a view
# whose rows were hidden since is 409 `transcript_changed` (docs/api.md §4, §10).
AfterSeq = Annotated[
    StrictInt | None,
    Field(
        ge=0,
        description="The seq the sender's view of the transcript was folded to: refused (409 "
        "`transcript_changed`) when a branch switch, an edit, a regenerate or a truncate hid "
        "rows of that view since",
    ),
]


class StartTurn(Body):
    session_id: Id
    message: StrictStr
    attachments: list[AttachmentUpload] = []
    model: ModelId | None = None
    edit_of: RowId | None = Field(
        default=None,
        description="A visible user row: the message replaces it as a new branch (the old "
        "branch is kept)",
    )
    keep_attachments: Annotated[list[Id], Field(max_length=100)] | None = Field(
        default=None,
        description="With `edit_of`: the attachments of the edited message to keep "
        "(default: all of them)",
    )
    after_seq: AfterSeq = None


class RegenerateTurn(Body):
    session_id: Id
    row_id: RowId | None = Field(
        default=None, description="The answer to regenerate (default: the last one)"
    )
    model: ModelId | None = None
    after_seq: AfterSeq = None


class SwitchBranch(Body):
    session_id: Id
    row_id: RowId = Field(description="A visible row that carries `branch`")
    index: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = Field(
        description="The branch to show, 1-based"
    )


class CancelRun(Body):
    stream_id: Id | None = None
    session_id: Id | None = None


class SteerRun(Body):
    stream_id: Id
    text: StrictStr


class ApproveRun(Body):
    stream_id: Id
    approval_id: Id
    choice: Literal["once", "session", "always", "deny"] = Field(
        description="`once`: run this command this time; `session`: allow its kind for the rest "
        "of this session; `always`: add it to the agent's permanent allowlist; `deny`: refuse "
        "it. Only the prompt's `choices` are accepted"
    )


class QueueMessage(Body):
    session_id: Id
    message: StrictStr
    attachments: list[AttachmentUpload] = []
    after_seq: AfterSeq = None  # checked when it starts at once (an idle session)


class EditQueued(Body):
    text: StrictStr


class StartQueued(Body):
    queue_id: Id
    after_seq: AfterSeq = None


# -- Responses: documentation only (routes return plain dicts, so a field added here is never
# filtered out); the fuzz suite checks real responses against them. Extra fields are allowed.


class RenderRequest(Body):
    texts: Annotated[list[StrictStr], Field(max_length=500)]


class Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(Out):
    """Every error: a stable snake_case `code`, a `message` for people, and per-error fields
    (`active_stream_id`, `continuation_session_id`, `limit_bytes`, ...)."""

    code: str = Field(description="Stable snake_case error code, e.g. `invalid_request`")
    message: str = Field(description="What went wrong, for people")


class SessionRow(Out):
    """A sidebar row (docs/api.md §3)."""

    session_id: str
    title: str
    created_at: float
    updated_at: float
    last_message_at: float | None
    pinned: bool
    archived: bool
    message_count: int
    activity_count: int
    transcript_generation: int
    transcript_generation_baseline: int
    busy: bool
    active_stream_id: str | None
    parent_session_id: str | None
    continuation_session_id: str | None
    last_run_state: str | None = Field(
        default=None, description="How the last run ended (`completed`, `error`, ...), or null"
    )
    model: str | None = Field(default=None, description="The session's model; null: the default")
    system_prompt: str | None = Field(
        default=None, description="The session's own system prompt; null: the server default"
    )


class ModelCard(Out):
    id: str
    label: str = Field(
        description="The id as shown: visible text (docs/api.md §3), no two alike; send `id`"
    )
    context_window: int | None = None


class ModelListOut(Out):
    """`GET /api/models` (docs/api.md): what a session may pick, and the server default."""

    models: list[ModelCard]
    default: str
    default_label: str = Field(description="`default` as shown")
    default_system_prompt: str | None = None
    error: dict | None = Field(
        default=None, description="Why the endpoint's own list could not be read, if it could not"
    )


class SessionRowOut(Out):
    session: SessionRow


class SessionList(Out):
    sessions: list[SessionRow]


class SessionView(SessionRow):
    """A row plus the visible transcript, the pending turn and the live run's scene."""

    messages: list[dict]
    pending_user_message: str | None
    pending_attachments: list[dict]
    pending_started_at: float | None
    last_seq: int = Field(description="The session log position this projection reflects")
    live: dict | None = Field(description="The active run's scene, or null")
    queued: list[dict] = Field(description="Messages queued behind the running turn")
    branches: dict | None = Field(
        default=None,
        description="`{order, shown, hidden}`: the rows of the branches not shown and where "
        "each fork stands (docs/api.md §10); null while no row is hidden",
    )


class SessionViewOut(Out):
    session: SessionView


class SessionContext(Out):
    context_messages: list[dict] = Field(description="OpenAI-shaped messages of the next call")
    excluded: list[dict]
    compressions: int
    compressed_at: dict | None = Field(
        default=None,
        description="`{turn_id, tokens_before, tokens_after}`: where the model's view starts",
    )


class SessionStatus(Out):
    busy: bool
    active_stream_id: str | None
    phase: str = Field(description="`idle`, `starting`, `running` or `cancelling`")
    last_seq: int


class Ok(Out):
    ok: bool


class TurnStarted(Out):
    session_id: str
    stream_id: str
    turn_id: str
    pending_started_at: float


class CancelResult(Out):
    ok: bool
    cancelled: bool = Field(description="False for an unknown or already finished run")
    stream_id: str | None


class AnswerQuestion(Body):
    stream_id: Id
    question_id: Id
    text: StrictStr = Field(description="The answer: free text, or one of the question's choices")


class SteerResult(Out):
    accepted: bool
    reason: str | None = None
    steer_id: str | None = None


class ApproveResult(Out):
    accepted: bool = Field(description="False when the prompt or the run is no longer open")
    stream_id: str
    approval_id: str


class AnswerResult(Out):
    accepted: bool = Field(description="False when the question or the run is no longer open")
    stream_id: str
    question_id: str


class Queued(Out):
    queue_id: str
    started: str | None = Field(description="The stream id when the message started at once")


class QueueChanged(Out):
    ok: bool
    queue_id: str


class Rendered(Out):
    html: list[str]


class SnippetPart(Out):
    text: str
    match: bool = Field(description="Whether this part is (part of) the match")


class SearchResult(Out):
    session_id: str
    title: str
    row_id: str = Field(description="The transcript row (`messages[].id`) that matched")
    role: Literal["user", "assistant"]
    shown: bool = Field(
        description="Whether the row is on the branch the session shows now (false: a "
        "hidden branch of an edit, regenerate or undo)"
    )
    snippet: str = Field(description="Plain text around the match")
    snippet_parts: list[SnippetPart] = Field(
        description="`snippet` cut into parts, the matched words marked: render each part "
        "as text (never as HTML)"
    )
    at: float


class SearchResults(Out):
    """`GET /api/search` (docs/api.md): best matches first."""

    results: list[SearchResult]


class CommandLineDefaults(Out):
    model: str
    system_prompt: str | None


class ServerSettingsOut(Out):
    """`GET/PATCH /api/settings` (docs/api.md): the defaults in effect, what the settings
    panel saved (a key absent: the command line's applies), and the command line's."""

    default_model: str
    default_system_prompt: str | None
    saved: dict
    command_line: CommandLineDefaults


class ImportResult(Out):
    """`POST /api/sessions/import`: the file's sessions, in its order, once each."""

    sessions: list[SessionRow]
    created: int
    existing: int
    skipped: dict[str, int]


class ImportProgress(Out):
    """`GET /api/imports/{import_id}`."""

    import_id: str
    phase: str
    done: int
    total: int | None
    created: int
    existing: int
    error: dict | None
