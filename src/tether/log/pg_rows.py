"""What the PostgreSQL backend's writer works with (log/postgres.py): a queued write, what
one batch has locked and is about to write, and the conversions between events and rows."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tether.events import Event
from tether.log import compact_json, owners
from tether.log.errors import InvalidEvent, StorageError
from tether.log.pg_schema import SCHEMA_LOCK
from tether.log.store import Draft, IndexFold

COLUMNS = "session_id, seq, type, at, stream_id, turn_id, data"  # an event row, as read
# A batch's events in one statement, as columns (`as_columns`): rows keep their order (and ids).
INSERT_EVENTS_SQL = (
    f"INSERT INTO events ({COLUMNS}, queue_id, search_text) "
    "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[], "
    "%b::float8[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[])"
)


@dataclass(eq=False)
class Op:
    kind: str  # "create" | "append" | "delete" | "delete_idle" | "create_many"
    session_id: str
    drafts: list[Draft]  # create_many: every session's, in order (what _load_closed reads)
    future: asyncio.Future = field(repr=False)
    owner: str | None = None  # create(_many): the new sessions' owner
    many: list[tuple[str, list[Draft]]] = field(default_factory=list)

    def sids(self) -> list[str]:
        return [sid for sid, _ in self.many] if self.kind == "create_many" else [self.session_id]


def take_runnable(waiting: list[Op], held: set[str], limit: int) -> tuple[list[Op], list[Op]]:
    """The next batch from `waiting` (in queue order) and what stays waiting: an operation
    on a session `held` by a batch in flight waits, and so does every later one on a session
    of a waiting operation, so each session's operations keep their order."""
    batch: list[Op] = []
    rest: list[Op] = []
    blocked = set(held)
    for op in waiting:
        sids = op.sids()
        if len(batch) >= limit or not blocked.isdisjoint(sids):
            rest.append(op)
            blocked.update(sids)
        else:
            batch.append(op)
    return batch, rest


dumps = compact_json.dumps


def check_text(what: str, value: Any) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise InvalidEvent(f"{what} contains a NUL character")


def check_ids(session_ids: list[str], drafts: list[Draft]) -> None:
    """InvalidEvent for an id a PostgreSQL text cannot carry (a NUL). Checked before the
    operation is queued: a batch's statements take the ids as parameters (the lock, the
    finished streams) before any row is built, and one that fails there fails every
    operation of the batch."""
    for sid in session_ids:
        check_text("the session id", sid)
    for draft in drafts:
        check_text("the event type", draft.type)
        check_text("the stream id", draft.stream_id)
        check_text("the turn id", draft.turn_id)


def encode(draft: Draft) -> str:
    """The row's JSON, or InvalidEvent for what JSON, UTF-8 or a PostgreSQL text column cannot
    carry (refused before anything of the batch is written, so it fails only its own append;
    the ids were checked as it was queued: `check_ids`)."""
    try:
        payload = dumps(draft.data)
        payload.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # a UnicodeEncodeError is a ValueError
        raise InvalidEvent(f"{draft.type}: {exc}") from exc
    refs = (draft.data.get("attachments") or []) if draft.type in owners.CARRIERS else []
    for ref in refs:
        for key in ("id", "name", "mime"):
            check_text(f"an attachment {key}", ref.get(key) if isinstance(ref, dict) else None)
    check_text("the queue id", draft.data.get("queue_id"))
    return payload


def as_columns(rows: list[tuple]) -> list[list]:
    """Rows as the column arrays an `unnest` statement takes."""
    return [list(column) for column in zip(*rows, strict=True)]


def was_committed(commit: psycopg.AsyncCursor | None) -> bool:
    """Whether a batch's COMMIT answered COMMIT (a failed transaction answers ROLLBACK; one
    the pipeline skipped after an error has no result)."""
    return commit is not None and commit.pgresult is not None and commit.statusmessage == "COMMIT"


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
        self.finished_before: set[str] = set()  # the batch's streams finished before it began
        self.open: dict[str, str | None] = {}  # each session's unfinished run (admission)
        self.cancel: dict[str, str | None] = {}  # the run its Stop was recorded for
        self.answered: dict[str, list[str]] = {}  # the open run's prompts that have an answer
        # the replica running it and its epoch, bumped at each takeover (log/pg_leases.py)
        self.owner: dict[str, tuple[str | None, int]] = {}
        self.continued: dict[str, str | None] = {}  # the session it continues in (rotated)
        self.touched: set[str] = set()
        self.deleted: list[str] = []
        # the transaction's id and its backend's pid, read as it began: what decides, on a
        # new connection, whether a COMMIT whose answer was lost committed (log/postgres.py)
        self.xact: tuple[int, int] | None = None


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the configured database URL"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


def flat(result: list) -> list[Event]:
    """An outcome's events: a create_many's are one list per session."""
    return [ev for item in result for ev in (item if isinstance(item, list) else [item])]


def snapshot(work: Batch) -> dict[str, Any]:
    """What a batch holds, to be put back when an all-or-none creation is refused."""
    return {k: (v.copy() if hasattr(v, "copy") else v) for k, v in vars(work).items()}


def restore(work: Batch, saved: dict[str, Any]) -> None:
    for key, value in saved.items():
        setattr(work, key, value)


def load_index(db: psycopg.Connection, fold: IndexFold, version: str) -> dict[str, int]:
    """Rebuild the index state of every session whose stored state is not at its last seq
    or was folded by other code; return every session's last seq (the fan-out's start)."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        row = db.execute("SELECT value FROM meta WHERE key='index_version'").fetchone()
        same = row is not None and row[0] == version
        stale_sql = "SELECT session_id FROM sessions"
        if same:
            stale_sql += " WHERE state_seq <> last_seq"
        # locked in session-id order, as every writer's batch locks them (pg_counters.py):
        # in any other order, a replica starting while another writes could deadlock with it
        stale = [sid for (sid,) in db.execute(stale_sql + " ORDER BY session_id")]
        for sid in stale:
            locked = db.execute(
                "SELECT last_seq FROM sessions WHERE session_id=%s FOR UPDATE", (sid,)
            ).fetchone()
            if locked is None:  # deleted by another replica meanwhile
                continue
            last = locked[0]
            state = None
            rows = db.execute(
                f"SELECT {COLUMNS} FROM events WHERE session_id=%s AND seq<=%s ORDER BY seq",
                (sid, last),
            )
            for event_row in rows:
                state = fold(state, row_to_event(event_row))
            db.execute(
                "UPDATE sessions SET state=%s, state_seq=%s WHERE session_id=%s",
                (None if state is None else dumps(state), last, sid),
            )
        db.execute(
            "INSERT INTO meta VALUES ('index_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
            (version,),
        )
        return dict(db.execute("SELECT session_id, last_seq FROM sessions").fetchall())
