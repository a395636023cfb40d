"""What the PostgreSQL backend's writer works with (log/postgres.py): a queued write, what
one batch has locked and is about to write, and the conversions between events and rows."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tether.events import Event
from tether.log import owners
from tether.log.errors import InvalidEvent, StorageError
from tether.log.store import Draft


@dataclass(eq=False)
class Op:
    kind: str  # "create" | "append" | "delete"
    session_id: str
    drafts: list[Draft]
    future: asyncio.Future = field(repr=False)


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def check_text(what: str, value: Any) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise InvalidEvent(f"{what} contains a NUL character")


def encode(session_id: str, draft: Draft) -> str:
    """The row's JSON, or InvalidEvent for what JSON, UTF-8 or a PostgreSQL text column cannot
    carry (refused before anything of the batch is written, so it fails only its own append)."""
    try:
        payload = dumps(draft.data)
        payload.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidEvent(f"{draft.type}: {exc}") from exc
    for what, value in (
        ("the session id", session_id),
        ("the event type", draft.type),
        ("the stream id", draft.stream_id),
        ("the turn id", draft.turn_id),
    ):
        check_text(what, value)
    refs = (draft.data.get("attachments") or []) if draft.type in owners.CARRIERS else []
    for ref in refs:
        for key in ("id", "name", "mime"):
            check_text(f"an attachment {key}", ref.get(key) if isinstance(ref, dict) else None)
    check_text("the queue id", draft.data.get("queue_id"))
    return payload


def row_to_event(row: tuple) -> Event:
    session_id, seq, type_, at, stream_id, turn_id, data = row
    return Event(session_id, seq, type_, at, json.loads(data), stream_id, turn_id)


def storage_error(where: str, exc: Exception) -> StorageError:
    return StorageError(f"could not use the PostgreSQL database ({where}): {exc}")


class Batch:
    """What one transaction has locked and is about to write."""

    def __init__(self) -> None:
        self.last: dict[str, int | None] = {}  # None: no such session (yet, or any more)
        self.state: dict[str, dict[str, Any] | None] = {}
        self.placeholders: set[str] = set()  # counter rows this batch inserted for creates
        self.rows: list[tuple] = []
        self.uploads: dict[tuple[str, str], tuple] = {}
        self.closing: list[tuple[str, str]] = []  # (stream, session) not written yet
        self.closing_written: list[tuple[str, str]] = []
        self.closed: set[str] = set()
        self.open: dict[str, str | None] = {}  # each session's unfinished run (admission)
        self.cancel: dict[str, str | None] = {}  # the run its Stop was recorded for
        # the replica running it and its epoch, bumped at each takeover (log/pg_leases.py)
        self.owner: dict[str, tuple[str | None, int]] = {}
        self.touched: set[str] = set()
        self.deleted: list[str] = []


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the configured database URL"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())
