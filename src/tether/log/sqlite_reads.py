"""The read side of the SQLite event log (log/sqlite.py): each reading thread has its own
connection, which never writes; the last seqs and index states come from what the writer
published after its last commit, so a reader never learns of a seq it cannot read yet."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

from tether.events import QUEUE_ADDED, RUN_FINISHED, TURN_SUBMITTED, Event
from tether.log import sqlite_search
from tether.log.errors import StorageError
from tether.log.sqlite_open import connect, row_to_event
from tether.log.store import OpenStream, SearchFold, SearchHit, search_hits

_UNFINISHED_SQL = (
    "SELECT t.session_id, t.stream_id, t.turn_id FROM events t WHERE t.type=? "
    "AND t.stream_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM events f WHERE "
    "f.stream_id=t.stream_id AND f.type=?) "
)


class SQLiteReads:
    """Mixed into SQLiteEventStore, which opens the file and publishes what readers see."""

    path: Path
    _search_fold: SearchFold | None
    _reader_local: threading.local
    _readers: list[sqlite3.Connection]
    _readers_lock: threading.Lock
    _visible_seq: dict[str, int]
    _visible_index: dict[str, dict[str, Any]]

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = connect(self.path)
            conn.execute("PRAGMA query_only=1")
            self._reader_local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def _query(self, sql: str, params: tuple) -> list[tuple]:
        """Rows of a read, fetched here so that a damaged page surfaces as StorageError.

        Fault found by tests/faults/test_corrupted_database.py: a database cut short inside
        its last page opened fine and then failed in start-up recovery with a bare
        `sqlite3.DatabaseError` ("database disk image is malformed") that did not name the
        file; at run time the same read was an anonymous 500.
        """
        try:
            return self._reader().execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StorageError(
                f"Cannot read the Tether database {self.path}: {exc}. "
                "The file was left as it is; restore it from a backup or move it aside."
            ) from exc

    def read_sync(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        rows = self._query(
            "SELECT session_id, seq, type, at, stream_id, turn_id, data FROM events "
            "WHERE session_id=? AND seq>? ORDER BY seq LIMIT ?",
            (session_id, after, -1 if limit is None else limit),
        )
        return [row_to_event(row) for row in rows]

    async def read(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        return await asyncio.to_thread(self.read_sync, session_id, after, limit)

    async def last_seq(self, session_id: str) -> int | None:
        return self._visible_seq.get(session_id)

    async def index_state(self, session_id: str) -> dict[str, Any] | None:
        return self._visible_index.get(session_id)

    async def index_states(self) -> dict[str, dict[str, Any]]:
        return dict(self._visible_index)

    async def search_text(self, needle: str) -> set[str]:
        return await asyncio.to_thread(sqlite_search.sessions_with_text, self._query, needle)

    async def search(
        self, terms: list[str], limit: int, owner: str | None = None
    ) -> list[SearchHit]:
        if not terms or self._search_fold is None:
            return []
        rows = await asyncio.to_thread(sqlite_search.search, self._query, terms, limit, owner)
        return search_hits(rows)

    async def unfinished_streams(self) -> list[OpenStream]:
        return await asyncio.to_thread(self._unfinished_sync)

    def _unfinished_sync(self) -> list[OpenStream]:
        rows = self._query(_UNFINISHED_SQL + "ORDER BY t.id", (TURN_SUBMITTED, RUN_FINISHED))
        return [OpenStream(*row) for row in rows]

    async def unfinished_stream(
        self, *, stream_id: str | None = None, session_id: str | None = None
    ) -> OpenStream | None:
        if stream_id is not None:
            where, key = "AND t.stream_id=? ORDER BY t.id DESC LIMIT 1", stream_id
        elif session_id is not None:
            where, key = "AND t.session_id=? ORDER BY t.seq DESC LIMIT 1", session_id
        else:
            return None
        rows = await asyncio.to_thread(
            self._query, _UNFINISHED_SQL + where, (TURN_SUBMITTED, RUN_FINISHED, key)
        )
        return OpenStream(*rows[0]) if rows else None

    async def queue_session(self, queue_id: str) -> str | None:
        return await asyncio.to_thread(self._queue_session_sync, queue_id)

    def _queue_session_sync(self, queue_id: str) -> str | None:
        rows = self._query(
            "SELECT session_id FROM events WHERE type=? AND json_extract(data, '$.queue_id')=? "
            "LIMIT 1",
            (QUEUE_ADDED, queue_id),
        )
        return rows[0][0] if rows else None

    async def attachment(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._attachment_sync, attachment_id, session_id)

    def _attachment_sync(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        columns = "SELECT session_id, id, blob, name, mime, size FROM attachments WHERE id=?"
        if session_id is None:
            rows = self._query(columns + " LIMIT 2", (attachment_id,))
        else:
            rows = self._query(columns + " AND session_id=?", (attachment_id, session_id))
        if len(rows) != 1:
            return None
        return dict(zip(("session_id", "id", "blob", "name", "mime", "size"), rows[0], strict=True))

    async def blob_in_use(self, blob: str) -> bool:
        rows = await asyncio.to_thread(
            self._query, "SELECT 1 FROM attachments WHERE blob=? LIMIT 1", (blob,)
        )
        return bool(rows)

    async def session_blobs(self, session_id: str) -> set[str]:
        return await asyncio.to_thread(self._session_blobs_sync, session_id)

    def _session_blobs_sync(self, session_id: str) -> set[str]:
        rows = self._query(
            "SELECT DISTINCT blob FROM attachments WHERE session_id=?", (session_id,)
        )
        return {row[0] for row in rows}
