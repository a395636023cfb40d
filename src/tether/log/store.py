"""The storage seam: every layer above the log is typed against `EventStore`, never a backend.

A backend is one class implementing this protocol (today `log.sqlite.SQLiteEventStore`). It
owns its schema and its numbered migrations, takes the per-session `IndexFold` and its version
at construction, and proves itself by passing the backend contract suite
(tests/log/backend_contract/). docs/architecture.md §2 (the storage seam) lists what a backend
must guarantee and how to add one.

Everything that may touch the database is a coroutine, so a backend whose state lives in a
server shared by several processes (PostgreSQL: per-session counter rows, LISTEN/NOTIFY) can
answer from there; a backend that keeps it in memory (SQLite's single writer) just returns.
No driver type crosses the seam: events in and out, plain dicts for index states.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from tether.events import Event
from tether.log.subscriptions import Hub

IndexFold = Callable[[dict[str, Any] | None, Event], dict[str, Any]]
"""A pure fold the backend keeps per session in the same transaction as its events (the
sidebar row): `index_state(sid)` always equals this fold over `read(sid)`. The backend is
given the fold and a version naming its code; when the stored version differs, or a session's
stored state is not at its last seq, it rebuilds the state from the log when it opens."""


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before the log gives it a `seq` and a time."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    stream_id: str | None = None
    turn_id: str | None = None
    # New uploads this event refers to: attachment id -> the blob (SHA-256) holding its bytes.
    # Kept beside the event (log/owners.py), never in it.
    blobs: dict[str, str] = field(default_factory=dict)
    # When it happened, for history written elsewhere first (an import keeps its own times,
    # docs/api.md §12); None, as for everything Tether records itself: the commit's time.
    at: float | None = None
    # A `turn.submitted` that starts a run: a backend shared by several processes refuses it
    # with SessionOccupied while the session has an unfinished run (log/postgres.py). The
    # SQLite backend serves one process, whose run registry refuses first (runs/engine.py).
    admits_run: bool = False
    # An event that changes the transcript under a run's feet (a truncate, a branch switch,
    # an import of what another client of the agent wrote):
    # refused with SessionOccupied, like `admits_run`, while the session has an unfinished
    # run. SQLite's one process checks its registry under the session lock first.
    needs_no_run: bool = False
    # The session's last seq when the command that wrote it read the transcript it checked
    # (an edit's or a regenerate's truncate, a branch switch: they name rows by position):
    # a backend shared by several processes refuses it with TranscriptMoved when another
    # process appended to the session since. SQLite's one process checks under the lock.
    after_seq: int | None = None
    # The first draft of a new turn, an edit, a regenerate or a message queued into an idle
    # session sent from a view of the transcript (`after_seq` of `chat/start`,
    # `chat/regenerate`, `chat/queue`): the session's
    # `transcript_generation` (bumped by each truncate and branch switch) when the engine
    # found no row of that view hidden. A backend shared by several processes refuses it
    # with SeenTranscriptChanged when the generation before its append is another (checked
    # before `after_seq`), so a switch through another process between the check and the
    # write cannot slip under it; appends that hide nothing (answers, renames, other
    # messages) do not. SQLite's one process checks under the session lock.
    shown_generation: int | None = None
    # A `queue.updated` or `queue.removed` of a queued message (data.queue_id): the session's
    # last seq when the command read that message. A backend shared by several processes
    # refuses it with QueueItemGone when the message left the queue since (started or removed
    # through another process), and a start (its `queue.removed` "started") also with
    # QueueItemEdited when the message was edited since (it then reads the new text again:
    # runs/engine.py). SQLite's one process checks under the session lock.
    queued_since: int | None = None


class SearchDoc(NamedTuple):
    """One transcript row's text as the search index holds it (docs/api.md §13)."""

    row_id: str
    role: str  # "user" | "assistant"
    position: int  # the row's index in the transcript of the branch it was written on
    at: float
    text: str


class SearchChange(NamedTuple):
    """What one event does to a session's search rows: the rows it adds. None is ever
    removed but with the session (nothing of any branch is lost, docs/api.md §10)."""

    add: tuple[SearchDoc, ...] = ()


StreamEvents = Callable[[str, frozenset[str]], list[Event]]
"""The events of one stream (`stream_id`) of the types named, in seq order, as the writer
sees them inside its transaction (what the batch wrote so far included)."""

SearchFold = Callable[[dict[str, Any] | None, Event, StreamEvents], SearchChange]
"""A pure function the backend calls for every event it appends, in the transaction that
appends it: given the session's `IndexFold` state before the event, the event, and a
way to read the event's stream, it says which rows the search index gains. The
backend is given it and a version naming its code; when the stored version differs it
rebuilds the search index from the log when it opens (so a migration that adds the index
fills it from existing sessions). A deleted session's rows go with its log."""


class SearchHit(NamedTuple):
    """One search result: the row, and its snippet as parts, each `(text, matched)`, so a
    page can mark the match without ever parsing markup."""

    session_id: str
    row_id: str
    role: str
    at: float
    snippet: tuple[tuple[str, bool], ...]


# How a backend marks the match in a snippet its query returns (control characters, which no
# indexed text holds); `search_hits` turns rows carrying them into `SearchHit`s.
MATCH_OPEN, MATCH_CLOSE = "\x02", "\x03"


def snippet_parts(snippet: str) -> tuple[tuple[str, bool], ...]:
    parts: list[tuple[str, bool]] = []
    head, *marked = snippet.split(MATCH_OPEN)
    if head:
        parts.append((head, False))
    for chunk in marked:
        text, _, rest = chunk.partition(MATCH_CLOSE)
        if text:
            parts.append((text, True))
        if rest:
            parts.append((rest, False))
    return tuple(parts)


def search_hits(rows: list[tuple]) -> list[SearchHit]:
    """Rows of `(session_id, row_id, role, at, marked snippet)` as search results."""
    return [
        SearchHit(session_id, row_id, role, at, snippet_parts(snippet))
        for session_id, row_id, role, at, snippet in rows
    ]


class OpenStream(NamedTuple):
    """A run the log shows started (`turn.submitted` with a stream) and not finished."""

    session_id: str
    stream_id: str
    turn_id: str | None


class EventStore(Protocol):
    """One durable, append-only log per session.

    Writes: the backend allocates `seq` (1, 2, ... per session, contiguous, no gaps, whatever
    the number of concurrent appenders or processes) in the transaction that makes the events
    durable, and an append returns only once they are. Every event carrying a `stream_id` is
    refused with StreamClosed once that stream has its `run.finished` (so exactly one
    terminal event per stream, and a late worker's output never lands). An append is atomic:
    all its drafts are written with consecutive seqs, or none is.

    Publication: committed events reach the attached Hub after commit, in seq order per
    session, each once (events committed by another process too, for a shared backend).

    Reads never write, and never see past what is committed: once `last_seq` reports a seq,
    `read` returns it.
    """

    def attach_hub(self, hub: Hub | None) -> None:
        """Committed batches go to `hub` from now on (None: nobody is listening)."""

    async def create_session(
        self, session_id: str, drafts: list[Draft], owner: str | None = None
    ) -> list[Event]:
        """Start a new log whose first events are `drafts` (seq 1, 2, ...); SessionExists
        when the session has a log already. `owner` (a user id, docs/api.md §15) is recorded
        in the same transaction; None leaves the session unowned."""

    async def create_sessions(
        self, sessions: list[tuple[str, list[Draft]]], owner: str | None = None
    ) -> list[list[Event]]:
        """Start several new logs at once, all or none: one transaction (an import, docs/api.md
        §12), each owned by `owner` as `create_session` records it. SessionExists or
        InvalidEvent for any of them writes none of them."""

    async def append(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        """Append atomically, contiguous seqs; raises SessionNotFound, StreamClosed,
        InvalidEvent (data JSON cannot carry) or StorageError, and then writes nothing."""

    async def delete_session(self, session_id: str, *, only_idle: bool = False) -> None:
        """Remove the session's log and index state; SessionNotFound when there is none.
        Subscribers are told through `Hub.publish_deleted`. `only_idle`: a backend shared by
        several processes refuses with SessionOccupied while the session has an unfinished
        run (another replica's run needs its log); SQLite's one process checks its registry
        under the session lock first (sessions/service.py)."""

    async def read(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > after, in seq order, at most `limit`."""

    async def last_seq(self, session_id: str) -> int | None:
        """The last committed seq; None when the session does not exist."""

    async def index_state(self, session_id: str) -> dict[str, Any] | None:
        """The `IndexFold` state of one session at its last committed seq."""

    async def index_states(self) -> dict[str, dict[str, Any]]:
        """The `IndexFold` state of every session, by session id. A state handed out is
        never changed in place (the fold returns a new one), so what a reader derived from
        it holds while it is the same object (sessions/row_texts.py)."""

    # -- event queries: what a scan of every log would answer, from the backend's indexes --
    async def search_text(self, needle: str) -> set[str]:
        """Sessions with a `turn.submitted` whose `text` contains `needle`, ignoring case."""

    async def search(
        self, terms: list[str], limit: int, owner: str | None = None
    ) -> list[SearchHit]:
        """Rows (from the `SearchFold`) whose text holds every term as a word, the last term
        also as a word prefix when it has 3 characters or more, ignoring case and accents;
        best matches first, at most `limit`. Terms are plain words (no query syntax reaches
        the backend); a backend without a search fold finds nothing. With `owner`, only the
        rows of that person's sessions are matched and ranked (`None`: everyone's)."""

    async def unfinished_streams(self) -> list[OpenStream]:
        """Every `turn.submitted` stream without a `run.finished`, in append order: the runs a
        restart must settle."""

    async def unfinished_stream(
        self, *, stream_id: str | None = None, session_id: str | None = None
    ) -> OpenStream | None:
        """The unfinished stream `stream_id`, or the run `session_id` has open: the run a Stop,
        a steer or an answer through a replica that does not run it acts on. By the indexes,
        at the cost of one session's turns at most, never of the whole log. A session's open
        run is its newest unfinished stream; a backend that records the run it admitted
        (PostgreSQL's counter row) answers that one, and an older stray, which no replica
        runs, is left to recovery."""

    async def queue_session(self, queue_id: str) -> str | None:
        """The session whose `queue.added` carries `queue_id` (None: no such item)."""

    async def attachment(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        """An upload's `{id, session_id, blob, name, mime, size}`: the one of `session_id`,
        or, without a session, the upload if exactly one session holds that id. Uploads are
        recorded from `Draft.blobs` in the transaction that appends their event."""

    async def blob_in_use(self, blob: str) -> bool:
        """Whether any upload still holds these bytes (content is stored once)."""

    async def session_blobs(self, session_id: str) -> set[str]:
        """The blobs the session's uploads hold (what its deletion may free)."""

    # -- ownership (docs/api.md §15; the filter itself is log/ownership.py) --
    async def session_owner(self, session_id: str) -> str | None:
        """The user id owning the session; None when it is unowned or does not exist."""

    async def claim_unowned(self, owner: str) -> int:
        """Give every unowned session (made before accounts, or without one) to `owner`;
        the number given."""

    async def aclose(self) -> None:
        """Finish what is queued and release the database; nothing is accepted after."""


@dataclass(frozen=True, slots=True)
class User:
    """A person who signs in (docs/api.md §15). `password_hash` is argon2id, or None for a
    user who signs in through a trusted proxy or OIDC; `epoch` grows at each logout, and a
    cookie carries the epoch it was issued in."""

    user_id: str
    username: str
    admin: bool
    password_hash: str | None
    epoch: int
    created_at: float


@dataclass(frozen=True, slots=True)
class ApiToken:
    token_id: str
    user_id: str
    name: str
    created_at: float


class AccountStore(Protocol):
    """Users and their API tokens, kept in the same database as the log (one numbered
    migration list per backend). Only hashes are stored: argon2id for passwords, SHA-256
    for tokens (random 256-bit secrets, so a fast hash is enough). User names are unique
    ignoring case. Every method may touch the database, so each is a coroutine; every
    write is durable when it returns, and a read after it, from any process, sees it."""

    async def add_user(
        self,
        username: str,
        password_hash: str | None,
        admin: bool,
        external_id: str | None = None,
    ) -> User:
        """A new user; UserExists when the name (ignoring case) or the external id is taken.
        `external_id` names the person at an identity provider (OIDC: issuer and subject),
        so a later sign-in finds them by it, never by a name they may change there."""

    async def user_by_name(self, username: str) -> User | None: ...

    async def user_by_external_id(self, external_id: str) -> User | None: ...

    async def user_by_id(self, user_id: str) -> User | None: ...

    async def users(self) -> list[User]:
        """Every user, oldest first."""

    async def remove_user(self, username: str) -> User | None:
        """Remove the user and their tokens (their sessions stay, owned by the removed id,
        so nobody else sees them); the removed user, None when there was none."""

    async def set_password(self, user_id: str, password_hash: str) -> None: ...

    async def end_sessions(self, user_id: str) -> None:
        """Log the user out everywhere: their epoch grows, so every earlier cookie fails."""

    async def add_token(self, user_id: str, name: str, token_hash: str) -> ApiToken: ...

    async def tokens(self, user_id: str) -> list[ApiToken]:
        """The user's live tokens, oldest first (never their hash)."""

    async def revoke_token(self, user_id: str, token_id: str) -> bool:
        """Revoke one of the user's tokens; False when they hold no such token."""

    async def token_user(self, token_hash: str) -> tuple[ApiToken, User] | None:
        """The live token with this hash and its user."""

    async def aclose(self) -> None: ...


class SharedLog(Protocol):
    """What a backend shared by several processes adds (log/pg_leases.py): a lease per
    process, the takeover of runs whose owner's lease expired, and work that one process
    at a time may do."""

    def exclusive(self, name: str) -> AbstractAsyncContextManager[None]:
        """Held by one process of those sharing the log at a time (the others wait): for a
        look at the log and the write it decides, which the writer cannot check alone (an
        import's look for the sessions it would create, sessions/transfer/importer.py)."""
        ...

    async def renew_lease(self) -> None: ...

    async def release_lease(self) -> None: ...

    async def claim_orphans(
        self, *, mine: bool = False, strays: bool = False
    ) -> list[OpenStream]: ...
