"""The SQLite backend's full-text search (docs/api.md §13): FTS5 over the rows a `SearchFold`
names, written by the log writer on its own connection inside the batch's transaction, so the
index is never behind (nor ahead of) the committed log, whatever crashes when.

`search_rows` holds each row's text once; `search_fts` is an external-content FTS5 index
over it, kept by the triggers of migration m004, tokenized as migration m007 says (letters,
digits and combining marks make a word, as the query's words are read in
sessions/search.py). A deleted session's rows go in the transaction that deletes its log;
nothing else removes a row (a truncation hides rows as a branch).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from tether.events import Event
from tether.log.sqlite_open import row_to_event
from tether.log.store import MATCH_CLOSE, MATCH_OPEN, IndexFold, SearchChange, SearchFold

# The snippet's match markers: control characters no row text keeps (they are blanked out of
# the indexed copy), so the snippet splits into parts without any markup reaching a client.
_OPEN, _CLOSE = MATCH_OPEN, MATCH_CLOSE
_BLANK = str.maketrans({_OPEN: " ", _CLOSE: " "})
SNIPPET_TOKENS = 16


def stream_reader(db: sqlite3.Connection) -> Callable[[str, frozenset[str]], list[Event]]:
    """The fold's view of one stream, through the writer's connection (it sees what the
    open transaction wrote)."""

    def stream_events(stream_id: str, types: frozenset[str]) -> list[Event]:
        marks = ",".join("?" * len(types))
        rows = db.execute(
            "SELECT session_id, seq, type, at, stream_id, turn_id, data FROM events "
            f"WHERE stream_id=? AND type IN ({marks}) ORDER BY id",
            (stream_id, *sorted(types)),
        )
        return [row_to_event(row) for row in rows]

    return stream_events


def apply_change(db: sqlite3.Connection, session_id: str, change: SearchChange) -> None:
    for doc in change.add:
        db.execute(
            "INSERT INTO search_rows (session_id, row_id, role, position, at, text) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, doc.row_id, doc.role, doc.position, doc.at, doc.text.translate(_BLANK)),
        )


def forget(db: sqlite3.Connection, session_id: str) -> None:
    db.execute("DELETE FROM search_rows WHERE session_id=?", (session_id,))
    db.execute("DELETE FROM turn_texts WHERE session_id=?", (session_id,))


# -- the session list's `q`: the text of submitted turns (migration m006) ------------------
TRIGRAM = 3  # characters: a shorter needle has no trigram to look up
# FTS5's trigram tokenizer came with SQLite 3.34; an older library keeps the compact copy
# without the index (m006) and scans it.
TRIGRAMS = sqlite3.sqlite_version_info >= (3, 34, 0)


def record_turn_text(db: sqlite3.Connection, session_id: str, event: Event) -> None:
    """A `turn.submitted`'s text, in the writer's transaction."""
    text = event.data.get("text")
    if isinstance(text, str):
        db.execute("INSERT INTO turn_texts (session_id, text) VALUES (?, ?)", (session_id, text))


def sessions_with_text(
    query: Callable[[str, tuple], list[tuple]], needle: str, *, trigrams: bool = TRIGRAMS
) -> set[str]:
    """Sessions with a submitted turn whose text holds `needle`, ignoring case: through the
    trigram index from three characters on (any letter's case), by a scan of the compact
    copy below that or without the index (ASCII case, as SQLite's `lower`). A NUL, which no
    stored text keeps and FTS5 reads as the query's end, is left out, as PostgreSQL does."""
    needle = needle.replace("\x00", "")
    if trigrams and len(needle) >= TRIGRAM:
        rows = query(
            "SELECT DISTINCT t.session_id FROM turn_texts_fts f JOIN turn_texts t "
            "ON t.id = f.rowid WHERE turn_texts_fts MATCH ?",
            ('"' + needle.replace('"', '""') + '"',),  # one phrase: the needle as written
        )
    else:
        rows = query(
            "SELECT DISTINCT session_id FROM turn_texts WHERE instr(lower(text), lower(?)) > 0",
            (needle,),
        )
    return {row[0] for row in rows}


def ensure_index(
    db: sqlite3.Connection, fold: SearchFold | None, version: str | None, index_fold: IndexFold
) -> None:
    """Rebuild the search rows from the log when they were built by another fold version
    (or by none: the migration that adds them). Without a fold the stored version is
    dropped, so that events appended now are indexed by the next store that has one."""
    stored = db.execute("SELECT value FROM meta WHERE key='search_version'").fetchone()
    if fold is None or version is None:
        if stored is not None:
            db.execute("DELETE FROM meta WHERE key='search_version'")
        return
    if stored is not None and stored[0] == version:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM search_rows")
        db.execute("INSERT INTO search_fts(search_fts) VALUES ('rebuild')")
        stream_events = stream_reader(db)
        states: dict[str, dict[str, Any]] = {}
        # in append order, so rowids grow with the log as they do when written live; read as
        # it goes (the inserts are into another table), never the whole log in memory
        rows = db.execute(
            "SELECT session_id, seq, type, at, stream_id, turn_id, data FROM events ORDER BY id"
        )
        for row in rows:
            event = row_to_event(row)
            state = states.get(event.session_id)
            apply_change(db, event.session_id, fold(state, event, stream_events))
            states[event.session_id] = index_fold(state, event)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('search_version', ?)", (version,))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# A prefix of one or two letters expands to thousands of words in a large index (FTS5 merges
# each word's list: over a second at a million events); such a last word matches whole.
PREFIX_MIN = 3


def match_expression(terms: list[str]) -> str:
    """FTS5 syntax for 'every term, the last (of PREFIX_MIN letters or more) as a prefix
    too': each term a quoted string, so nothing a user typed is read as query syntax."""
    quoted = ['"' + term.replace('"', '""') + '"' for term in terms]
    if len(terms[-1]) >= PREFIX_MIN:
        quoted[-1] += "*"
    return " ".join(quoted)


# BM25 ranks every row it is given before the best `limit` are kept, so a word in most rows
# (or a one-letter prefix, typed on the way to a word) would cost hundreds of ms at a million
# events. Only the newest RANKED_MAX matching rows are ranked: for such a word, the best
# matches among the most recent ones (rowids grow with the log's append order). With an
# owner (accounts, docs/api.md §15) they are the newest of that person's rows: another
# person's newer matches would otherwise fill the window and leave the searcher nothing.
RANKED_MAX = 2000
_ROWS = " JOIN search_rows r ON r.id = search_fts.rowid"
_OWNED = " JOIN session_owners o ON o.session_id = r.session_id AND o.owner = ?"
CUTOFF_SQL = (
    "SELECT search_fts.rowid FROM search_fts{join} WHERE search_fts MATCH ? "
    "ORDER BY search_fts.rowid DESC LIMIT 1 OFFSET ?"
)
SEARCH_SQL = (
    "SELECT r.session_id, r.row_id, r.role, r.at, "
    f"snippet(search_fts, 0, char(2), char(3), '…', {SNIPPET_TOKENS}) "
    "FROM search_fts{join} "
    "WHERE search_fts MATCH ? AND search_fts.rowid >= ? ORDER BY search_fts.rank LIMIT ?"
)


def search(
    query: Callable[[str, tuple], list[tuple]],
    terms: list[str],
    limit: int,
    owner: str | None = None,
) -> list[tuple]:
    """The rows of `SEARCH_SQL` for `terms`, through `query` (a reader's); with `owner`,
    only that person's sessions'."""
    expression = match_expression(terms)
    cutoff_join, join = "", _ROWS
    first: tuple[str, ...] = ()
    if owner is not None:
        cutoff_join = join = _ROWS + _OWNED
        first = (owner,)
    cutoff = query(CUTOFF_SQL.format(join=cutoff_join), (*first, expression, RANKED_MAX - 1))
    return query(
        SEARCH_SQL.format(join=join), (*first, expression, cutoff[0][0] if cutoff else 0, limit)
    )
