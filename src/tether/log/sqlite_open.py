"""Opening a SQLite log file (log/sqlite.py): the connection settings every connection
shares, and the refusals that keep a file Tether must not write (someone else's database, a
read-only directory, a file cut short) exactly as it was."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from tether.events import Event
from tether.log.errors import StorageError, StorageReadOnly


def row_to_event(row: tuple) -> Event:
    session_id, seq, type_, at, stream_id, turn_id, data = row
    return Event(session_id, seq, type_, at, json.loads(data), stream_id, turn_id)


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


# Every table a Tether database may hold (log/migrations.py); sqlite_* are SQLite's own.
TETHER_TABLES = frozenset(
    {"migrations", "events", "session_index", "meta", "attachments", "search_rows"}
    | {"turn_texts"}
    | {
        f"{fts}{part}"  # an FTS5 table and its shadow tables
        for fts in ("search_fts", "turn_texts_fts")
        for part in ("", "_data", "_idx", "_docsize", "_config")
    }
    | {"users", "api_tokens", "session_owners"}  # accounts
)


def refuse_foreign(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a valid SQLite file that is not Tether's, before anything writes to it.

    Fault found by tests/faults/test_corrupted_database.py: the store used to switch any
    database to WAL and create its `migrations` table before the first migration failed on a
    conflicting `events` table, so someone else's file was rewritten (WAL header, a new table)
    and, without a conflict, silently adopted. A database is Tether's when it is empty, or
    records Tether's first migration and holds no table Tether does not know. Only reads here.
    """
    tables = {
        name
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    if tables <= {"migrations"} and not (
        tables and db.execute("SELECT 1 FROM migrations LIMIT 1").fetchone()
    ):
        return  # a new database (or one whose first start stopped before m001)
    ours = (
        "migrations" in tables
        and db.execute("SELECT 1 FROM migrations WHERE name='m001_events'").fetchone() is not None
    )
    unknown = sorted(tables - TETHER_TABLES)
    if not ours or unknown:
        raise StorageError(
            f"{path} is not a Tether database (it holds the tables "
            f"{', '.join(sorted(tables))}). The file was left as it is; move it aside or "
            "choose another --data-dir."
        )


def refuse_read_only(path: Path) -> None:
    """Refuse a database Tether could only read. Fault found by
    tests/faults/test_storage_faults.py: a read-only data directory was reported as a broken
    database ("attempt to write a readonly database ... restore it from a backup"). Reads are
    not served instead: in WAL mode even a reader must write the `-shm` index beside the
    file, and a server whose every message would be refused is worse than a clear refusal."""
    directory = path.parent
    for where in (directory, path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if where.exists() and not os.access(where, os.W_OK):
            raise StorageReadOnly(
                f"The data directory {directory} is read-only ({where} cannot be written): "
                "Tether keeps its log there and must be able to write it. Nothing was "
                "changed; make the directory writable or choose another --data-dir."
            )


def refuse_cut_short(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a database file that ends inside a page.

    Fault found by tests/faults/test_corrupted_database.py: SQLite notices a file shorter
    than its header says only by whole pages (it rounds a partial last page up and reads it
    zero-filled), so a database cut inside its last page could start and serve damaged
    pages, or fail later on a read. SQLite writes whole pages, so with no write-ahead log
    left to replay, a size that is not a multiple of the page size means the file was cut.
    With a non-empty log, the last checkpoint may not have finished: SQLite replays the log.
    """
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return
    size = path.stat().st_size
    page = db.execute("PRAGMA page_size").fetchone()[0]  # read from the header by now
    if size % page:
        raise StorageError(
            f"Cannot open the Tether database {path}: the file is cut short (database disk "
            f"image is malformed: {size:,} bytes is not a whole number of {page:,}-byte "
            "pages). The file was left as it is; restore it from a backup or move it aside."
        )
