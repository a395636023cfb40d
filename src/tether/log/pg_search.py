"""The PostgreSQL backend's full-text search (docs/api.md §10): PostgreSQL's own text search
over the rows a `SearchFold` names, written in the transaction that appends their events, so
the index is never behind (nor ahead of) the committed log, whatever crashes when.

`search_rows` (migrations m004 and m013, log/pg_schema.py) holds each row's text once, its
`words` (log/search_words.py: what SQLite's tokenizer and the query call words, joined by
spaces) and a `tsvector` generated from those words under a GIN index, in the
`tether_search` configuration: the `simple` parser and dictionary (no stemming, as SQLite's
FTS5 `unicode61` tokenizer), behind `unaccent` when the server has that extension, so
accents are ignored both ways. Without the extension accents count (documented in
docs/operations.md). The words, not the text, go to the parser: on the text it reads
`config.yaml`, a URL, an address or a path as one token and leaves HTML tags out, so none of
their words would be found. Ranking is `ts_rank` over the newest `RANKED_MAX` matches
(SQLite ranks its newest 2,000 with BM25 for the same reason); the snippet is cut here from
the text around the matched words (`headline`), marked with the control characters SQLite's
`snippet` uses, so it shows the text as written, tags included.

The fold reads a stream's events synchronously (`StreamEvents`) while the writer's connection
is asynchronous: `fold_change` calls the fold with a reader that answers from what was read
already and otherwise asks for the read (`_NeedStream`); the writer flushes its pending rows,
reads the stream in its transaction and calls the pure fold again.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from tether.events import Event
from tether.log.pg_rows import COLUMNS, row_to_event
from tether.log.pg_schema import SCHEMA_LOCK
from tether.log.search_words import word_spans, words
from tether.log.store import MATCH_CLOSE, MATCH_OPEN, IndexFold, SearchChange, SearchFold

# The snippet's match markers: control characters no row text keeps (blanked out of the
# stored copy, with NUL, which a PostgreSQL text column cannot hold).
_OPEN, _CLOSE = MATCH_OPEN, MATCH_CLOSE
_BLANK = str.maketrans({_OPEN: " ", _CLOSE: " ", "\x00": " "})
SNIPPET_WORDS = 16
_LEAD = 2  # words shown before the first match, when the text goes on after the window
PREFIX_MIN = 3  # a last word shorter than this matches whole (as the SQLite backend)
RANKED_MAX = 2000
CONFIG = "tether_search"
STREAM_SQL = f"SELECT {COLUMNS} FROM events WHERE stream_id=%s AND type = ANY(%s) ORDER BY id"


class _NeedStream(Exception):
    def __init__(self, stream_id: str, types: frozenset[str]):
        self.key = (stream_id, types)


def _reader(known: dict[tuple[str, frozenset[str]], list[Event]]):
    def stream_events(stream_id: str, types: frozenset[str]) -> list[Event]:
        key = (stream_id, types)
        if key not in known:
            raise _NeedStream(stream_id, types)
        return known[key]

    return stream_events


async def fold_change(
    conn: psycopg.AsyncConnection,
    fold: SearchFold,
    state: dict[str, Any] | None,
    event: Event,
    flush: Callable[[], Awaitable[None]],
) -> SearchChange:
    """The fold's change for `event`, whose row is already among the writer's pending rows:
    every stream read the fold asks for is answered in the writer's transaction, after the
    pending rows are written (so it sees the batch so far, the event included)."""
    known: dict[tuple[str, frozenset[str]], list[Event]] = {}
    while True:
        try:
            return fold(state, event, _reader(known))
        except _NeedStream as need:
            await flush()
            stream_id, types = need.key
            cur = await conn.execute(STREAM_SQL, (stream_id, sorted(types)))
            known[need.key] = [row_to_event(row) for row in await cur.fetchall()]


# A `tsvector` holds at most 1 MB, and a row past it fails its append (an import of a pasted
# dump was 503). Per distinct word it takes the word's bytes, 4 for its entry, up to 3 of
# padding and count, and 2 per position: under 6 times the bytes of the words indexed, so
# they are kept below 128 KiB (the whole row for any usual one).
WORDS_MAX_BYTES = 128 * 1024


def indexed_words(text: str) -> str:
    """The words of `text` the index holds, joined by spaces: all of them when they fit in
    WORDS_MAX_BYTES, else each distinct word once, in order, as many as fit (a longer row is
    found by the words of its first 128 KiB of distinct ones)."""
    found = words(text)
    joined = " ".join(found)
    if len(joined) * 4 <= WORDS_MAX_BYTES or len(joined.encode()) <= WORDS_MAX_BYTES:
        return joined
    kept: list[str] = []
    size = 0
    for word in dict.fromkeys(found):
        size += len(word.encode()) + 1
        if size > WORDS_MAX_BYTES:
            break
        kept.append(word)
    return " ".join(kept)


def _rows(session_id: str, change: SearchChange) -> list[tuple]:
    rows = []
    for d in change.add:
        text = d.text.translate(_BLANK)
        rows.append((session_id, d.row_id, d.role, d.position, d.at, text, indexed_words(text)))
    return rows


_INSERT = (
    "INSERT INTO search_rows (session_id, row_id, role, position, at, text, words) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


async def apply_change(
    conn: psycopg.AsyncConnection, session_id: str, change: SearchChange
) -> None:
    if change.add:
        async with conn.cursor() as cur:
            await cur.executemany(_INSERT, _rows(session_id, change))


def ensure_index(
    db: psycopg.Connection, fold: SearchFold | None, version: str | None, index_fold: IndexFold
) -> None:
    """Rebuild the search rows from the log when another fold version (or none: the
    migration that adds them) built them; without a fold the stored version is dropped, so
    that the next store with one rebuilds. Runs under the schema lock, so replicas opening
    at once rebuild once."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        row = db.execute("SELECT value FROM meta WHERE key='search_version'").fetchone()
        if fold is None or version is None:
            db.execute("DELETE FROM meta WHERE key='search_version'")
            return
        if row is not None and row[0] == version:
            return
        db.execute("DELETE FROM search_rows")

        def stream_events(stream_id: str, types: frozenset[str]) -> list[Event]:
            rows = db.execute(STREAM_SQL, (stream_id, sorted(types))).fetchall()
            return [row_to_event(r) for r in rows]

        states: dict[str, dict[str, Any]] = {}
        with db.cursor(name="search_rebuild") as events:  # server-side: never all in memory
            events.execute(f"SELECT {COLUMNS} FROM events ORDER BY id")
            for event_row in events:
                event = row_to_event(event_row)
                state = states.get(event.session_id)
                change = fold(state, event, stream_events)
                if change.add:
                    with db.cursor() as cur:
                        cur.executemany(_INSERT, _rows(event.session_id, change))
                states[event.session_id] = index_fold(state, event)
        db.execute(
            "INSERT INTO meta VALUES ('search_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
            (version,),
        )


def query_text(terms: list[str]) -> str:
    """`to_tsquery` syntax for 'every term, the last (of PREFIX_MIN letters or more) as a
    prefix too': each term a quoted lexeme, so nothing a user typed is read as syntax."""
    quoted = [
        "'" + t.replace("\\", "\\\\").replace("'", "''").replace("\x00", "") + "'" for t in terms
    ]
    if len(terms[-1]) >= PREFIX_MIN:
        quoted[-1] += ":*"
    return " & ".join(quoted)


_SEARCH = (
    f"WITH q AS (SELECT to_tsquery('{CONFIG}', %s) AS q), "
    "m AS (SELECT r.id, r.session_id, r.row_id, r.role, r.at, r.text, "
    "ts_rank(r.tsv, q.q) AS rank FROM search_rows r{join}, q WHERE r.tsv @@ q.q "
    "ORDER BY r.id DESC LIMIT %s), "
    "top AS (SELECT * FROM m ORDER BY rank DESC, id DESC LIMIT %s) "
    "SELECT session_id, row_id, role, at, text FROM top ORDER BY rank DESC, id DESC"
)
SEARCH_SQL = _SEARCH.format(join="")
# With an owner (accounts, docs/api.md §15) the RANKED_MAX newest matches are that person's:
# another person's newer matches would otherwise fill the window and leave them nothing.
OWNED_SEARCH_SQL = _SEARCH.format(
    join=" JOIN session_owners o ON o.session_id = r.session_id AND o.owner = %s"
)


def search_params(terms: list[str], limit: int, owner: str | None = None) -> tuple:
    owned = () if owner is None else (owner,)
    return (query_text(terms), *owned, RANKED_MAX, limit)


def _fold(word: str) -> str:
    """A word as the index compares it, near enough to mark it: lower case, without accents
    (what `unaccent` and the `simple` dictionary do), ligatures spelled out."""
    return "".join(
        c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c)
    ).lower()


def headline(text: str, terms: list[str]) -> str:
    """The snippet of a row `terms` found: the SNIPPET_WORDS words around the most matched
    terms, `…` where the text is cut, each matched word between the match markers, the
    text between words as written (SQLite's `snippet` does the same)."""
    spans = word_spans(text)
    folded: dict[str, str] = {}  # a long row says most of its words many times
    keys = [
        folded.get(word) or folded.setdefault(word, _fold(word))
        for word in (text[start:end] for start, end in spans)
    ]
    whole = {_fold(term) for term in terms}
    prefix = _fold(terms[-1]) if terms and len(terms[-1]) >= PREFIX_MIN else None
    matched = [k in whole or (prefix is not None and k.startswith(prefix)) for k in keys]
    last_start = max(0, len(spans) - SNIPPET_WORDS)
    first, best = 0, (-1, -1)
    for at in (i for i, hit in enumerate(matched) if hit):
        start = min(max(0, at - _LEAD), last_start)
        window = [
            keys[i] for i in range(start, start + SNIPPET_WORDS) if i < len(spans) and matched[i]
        ]
        score = (len(set(window)), len(window))
        if score > best:
            first, best = start, score
        if best[0] >= len(whole):  # every word typed in one window: none is better enough
            break
    stop = min(len(spans), first + SNIPPET_WORDS)
    out = ["…"] if first > 0 else []
    at = 0 if first == 0 else spans[first][0]
    for i in range(first, stop):
        start, end = spans[i]
        out.append(text[at:start])
        out.append(f"{_OPEN}{text[start:end]}{_CLOSE}" if matched[i] else text[start:end])
        at = end
    out.append(text[at:] if stop == len(spans) else "…")
    return "".join(out)


def marked_rows(rows: list[tuple], terms: list[str]) -> list[tuple]:
    """The rows of SEARCH_SQL (`text` last) with a marked snippet in place of the text."""
    return [(*row[:4], headline(row[4], terms)) for row in rows]
