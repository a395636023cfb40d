"""The read side of the PostgreSQL event log (log/postgres.py): every read goes to the
database through the pool, never to process memory alone, since another replica may have
written since the last read. The one thing kept is decoded sidebar states, each checked
against its row's version in the database on every read (`index_states`)."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether.events import QUEUE_ADDED, TURN_SUBMITTED, Event
from tether.log import pg_owners, pg_search
from tether.log.pg_rows import COLUMNS, row_to_event, storage_error
from tether.log.store import OpenStream, SearchFold, SearchHit, search_hits

# Every fan-out read (each replica, each commit of another). As a plain join the planner cannot
# see the cursors inside the arrays, guesses that a third of each session is past them and
# scans the whole events table: O(log) per read, a full scan per commit per replica. The
# OFFSET 0 keeps the LATERAL subquery unflattened, so each session is one range of the
# primary key, (session_id, seq) > cursor: O(events read). tests/log/test_pg_read_plans.py.
READ_AFTER_SQL = (
    f"SELECT {', '.join('e.' + c for c in COLUMNS.split(', '))} "
    "FROM unnest(%b::text[], %b::bigint[]) AS c(sid, after) CROSS JOIN LATERAL "
    "(SELECT * FROM events WHERE session_id = c.sid AND seq > c.after OFFSET 0) AS e "
    "ORDER BY e.session_id, e.seq"
)

_UNFINISHED_SQL = (
    "SELECT t.session_id, t.stream_id, t.turn_id FROM events t WHERE t.type=%s "
    "AND t.stream_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM closed_streams c "
    "WHERE c.stream_id=t.stream_id) "
)
_OPEN_RUN_SQL = (
    "SELECT t.session_id, t.stream_id, t.turn_id FROM sessions s JOIN events t "
    "ON t.stream_id = s.open_stream AND t.session_id = s.session_id "
    "WHERE s.session_id = %s AND t.type = %s"
)


_LIKE_SPECIAL = re.compile(r"[%_\\]")
SEARCH_TEXT_SQL = (  # m011's trigram index: its expression, and its predicate as a literal
    "SELECT DISTINCT session_id FROM events WHERE type = 'turn.submitted' "  # (a generic plan
    "AND lower(search_text) LIKE lower(%s)"  # must be able to use the partial index)
)

RowVersion = tuple[int, str]  # a sessions row's (state_seq, xmin)


class PostgresReads:
    """Mixed into PostgresEventStore, which owns the pool and starts it (`_start`)."""

    _pool: AsyncConnectionPool
    _search_fold: SearchFold | None
    # Decoded sidebar states by session: (the row's version, state). Shared with callers,
    # which only read them (as the SQLite log's own are).
    _decoded_states: dict[str, tuple[RowVersion, dict[str, Any]]]

    async def _start(self) -> None:
        raise NotImplementedError  # PostgresEventStore._start opens the pool and the writer

    async def search(
        self, terms: list[str], limit: int, owner: str | None = None
    ) -> list[SearchHit]:
        if not terms or self._search_fold is None:
            return []
        sql = pg_search.SEARCH_SQL if owner is None else pg_search.OWNED_SEARCH_SQL
        rows = await self._rows(sql, pg_search.search_params(terms, limit, owner))
        return search_hits(pg_search.marked_rows(rows, terms))

    async def session_owner(self, session_id: str) -> str | None:
        rows = await self._rows(pg_owners.OWNER_SQL, (session_id.replace("\x00", ""),))
        return rows[0][0] if rows else None

    async def _rows(self, sql: str, params: tuple) -> list[tuple]:
        await self._start()
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(sql, params)
                return await cur.fetchall()
        except psycopg.Error as exc:
            raise storage_error("read", exc) from exc

    async def read(self, session_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        rows = await self._rows(
            f"SELECT {COLUMNS} FROM events WHERE session_id=%s AND seq>%s ORDER BY seq LIMIT %s",
            (session_id, after, limit),
        )
        return [row_to_event(row) for row in rows]

    async def _read_after(self, cursors: dict[str, int]) -> list[Event]:
        """What follows each session's cursor, in one query (the fan-out's catch-up)."""
        rows = await self._rows(READ_AFTER_SQL, (list(cursors), list(cursors.values())))
        return [row_to_event(row) for row in rows]

    async def _all_last_seqs(self) -> dict[str, int]:
        return dict(await self._rows("SELECT session_id, last_seq FROM sessions", ()))

    async def last_seq(self, session_id: str) -> int | None:
        rows = await self._rows("SELECT last_seq FROM sessions WHERE session_id=%s", (session_id,))
        return rows[0][0] if rows else None

    async def index_state(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._rows("SELECT state FROM sessions WHERE session_id=%s", (session_id,))
        return json.loads(rows[0][0]) if rows and rows[0][0] is not None else None

    async def index_states(self) -> dict[str, dict[str, Any]]:
        """Every session's state, decoding only those whose row changed since this replica
        last decoded them: decoding them all was most of a session list's cost (4.6 of
        6.6 ms at 1,300 sessions), paid on every `GET /api/sessions`. A row's version is its
        `state_seq` and its `xmin` (the transaction that wrote it): a session deleted and
        created again with the same id, or a state rebuilt by a new fold version, can come
        back at the same `state_seq`, never from the same transaction."""
        versions = await self._rows(
            "SELECT session_id, state_seq, xmin::text FROM sessions WHERE state IS NOT NULL", ()
        )
        cache = self._decoded_states
        stale = [
            sid for sid, seq, xmin in versions if sid not in cache or cache[sid][0] != (seq, xmin)
        ]
        if stale:
            fresh = await self._rows(
                "SELECT session_id, state_seq, xmin::text, state FROM sessions "
                "WHERE session_id = ANY(%s) AND state IS NOT NULL",
                (stale,),
            )
            for sid, seq, xmin, state in fresh:
                cache[sid] = ((seq, xmin), json.loads(state))
        if len(cache) > len(versions):  # deleted sessions leave the cache
            listed = {sid for sid, _, _ in versions}
            for sid in [sid for sid in cache if sid not in listed]:
                del cache[sid]
        return {sid: cache[sid][1] for sid, _, _ in versions if sid in cache}

    async def search_text(self, needle: str) -> set[str]:
        """By the trigram index of migration m011 where the server has `pg_trgm` (a LIKE
        pattern it can read; the needle's own `%`, `_` and `\\` escaped), else by a scan."""
        pattern = "%" + _LIKE_SPECIAL.sub(r"\\\g<0>", needle.replace("\x00", "")) + "%"
        rows = await self._rows(SEARCH_TEXT_SQL, (pattern,))
        return {row[0] for row in rows}

    async def unfinished_streams(self) -> list[OpenStream]:
        rows = await self._rows(_UNFINISHED_SQL + "ORDER BY t.id", (TURN_SUBMITTED,))
        return [OpenStream(*row) for row in rows]

    async def unfinished_stream(
        self, *, stream_id: str | None = None, session_id: str | None = None
    ) -> OpenStream | None:
        """A stream by `events_by_stream`; a session's by its counter row's `open_stream`
        (the run the writer admitted, cleared in its `run.finished`'s transaction). Scanning
        every turn of the log cost a Stop through another replica about 100 ms at 200,000
        turns."""
        if stream_id is not None:
            sql = _UNFINISHED_SQL + "AND t.stream_id=%s ORDER BY t.id DESC LIMIT 1"
            params = (TURN_SUBMITTED, stream_id.replace("\x00", ""))
        elif session_id is not None:
            sql, params = _OPEN_RUN_SQL, (session_id.replace("\x00", ""), TURN_SUBMITTED)
        else:
            return None
        rows = await self._rows(sql, params)
        return OpenStream(*rows[0]) if rows else None

    async def queue_session(self, queue_id: str) -> str | None:
        rows = await self._rows(
            "SELECT session_id FROM events WHERE queue_id=%s AND type=%s LIMIT 1",
            (queue_id.replace("\x00", ""), QUEUE_ADDED),
        )
        return rows[0][0] if rows else None

    async def attachment(self, attachment_id: str, session_id: str | None) -> dict[str, Any] | None:
        columns = "SELECT session_id, id, blob, name, mime, size FROM attachments WHERE id=%s"
        attachment_id = attachment_id.replace("\x00", "")
        if session_id is None:
            rows = await self._rows(columns + " LIMIT 2", (attachment_id,))
        else:
            rows = await self._rows(
                columns + " AND session_id=%s", (attachment_id, session_id.replace("\x00", ""))
            )
        if len(rows) != 1:
            return None
        return dict(zip(("session_id", "id", "blob", "name", "mime", "size"), rows[0], strict=True))

    async def blob_in_use(self, blob: str) -> bool:
        rows = await self._rows("SELECT 1 FROM attachments WHERE blob=%s LIMIT 1", (blob,))
        return bool(rows)

    async def session_blobs(self, session_id: str) -> set[str]:
        rows = await self._rows(
            "SELECT DISTINCT blob FROM attachments WHERE session_id=%s", (session_id,)
        )
        return {row[0] for row in rows}
