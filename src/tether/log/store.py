"""The narrow storage seam: projections and HTTP see only this, so a PostgreSQL backend can
replace SQLite without touching them (ARCHITECTURE.md §2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether.events import Event

# A pure fold kept per session in the same transaction as the events (the sidebar row).
IndexFold = Callable[[dict[str, Any] | None, Event], dict[str, Any]]


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


class EventStore(Protocol):
    async def create_session(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        """Start a new log whose first events are `drafts` (seq 1, 2, ...)."""

    async def append(self, session_id: str, drafts: list[Draft]) -> list[Event]:
        """Append atomically, contiguous seqs; raises SessionNotFound / StreamClosed."""

    async def delete_session(self, session_id: str) -> None: ...

    async def read(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > after, in seq order."""

    def last_seq(self, session_id: str) -> int | None:
        """None when the session does not exist."""

    def index_state(self, session_id: str) -> dict[str, Any] | None:
        """The persisted fold (sidebar row state) of one session."""

    def index_states(self) -> dict[str, dict[str, Any]]: ...

    async def search_text(self, needle: str) -> set[str]:
        """Sessions whose user messages contain `needle` (case-insensitive)."""

    def attachment(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        """An upload's `{id, session_id, blob, name, mime, size}`: the one of `session_id`,
        or, without a session, the upload if exactly one session holds that id."""

    def blob_in_use(self, blob: str) -> bool: ...

    def session_blobs(self, session_id: str) -> set[str]: ...

    def close(self) -> None: ...
