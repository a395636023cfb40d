"""The SQLite backend's numbered schema migrations, recorded in the database and applied in
order at start (the habit of llm's migrations.py). Never edit a released migration: add the
next one. Another backend keeps its own list beside its code (docs/architecture.md)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable

from tether.log.errors import NewerSchema

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_events(db: sqlite3.Connection) -> None:
    db.execute(
        """
        CREATE TABLE events (
            id INTEGER PRIMARY KEY,          -- physical append order
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            at REAL NOT NULL,
            stream_id TEXT,
            turn_id TEXT,
            data TEXT NOT NULL,
            UNIQUE (session_id, seq)
        )
        """
    )
    db.execute("CREATE INDEX events_by_stream ON events(stream_id) WHERE stream_id IS NOT NULL")


@migration
def m002_session_index(db: sqlite3.Connection) -> None:
    db.execute(
        """
        CREATE TABLE session_index (
            session_id TEXT PRIMARY KEY,
            last_seq INTEGER NOT NULL,
            state TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


@migration
def m003_attachment_owners(db: sqlite3.Connection) -> None:
    """Attachments become per upload (log/owners.py). Until now an attachment's id was the
    SHA-256 of its bytes and its name and type lived in a file beside them, shared by every
    session that uploaded the same bytes. Each existing reference becomes a row of the
    session that made it, with the name and type that session gave; the old ids keep
    working, and the shared files of names are deleted by the attachment store."""
    db.execute(
        """
        CREATE TABLE attachments (
            session_id TEXT NOT NULL,
            id TEXT NOT NULL,
            blob TEXT NOT NULL,              -- the SHA-256 the bytes are stored under
            name TEXT NOT NULL,
            mime TEXT NOT NULL,
            size INTEGER NOT NULL,
            PRIMARY KEY (session_id, id)
        )
        """
    )
    db.execute("CREATE INDEX attachments_by_id ON attachments(id)")
    db.execute("CREATE INDEX attachments_by_blob ON attachments(blob)")
    rows = db.execute(
        "SELECT session_id, data FROM events WHERE type IN ('turn.submitted', 'queue.added') "
        "ORDER BY id"
    )
    for session_id, data in rows.fetchall():
        for ref in json.loads(data).get("attachments") or []:
            db.execute(
                "INSERT OR IGNORE INTO attachments VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, ref["id"], ref["id"], ref["name"], ref["mime"], ref["size"]),
            )


@migration
def m004_search(db: sqlite3.Connection) -> None:
    """The full-text search index (docs/api.md §13): one row per transcript row's text, and
    an FTS5 index over it kept by triggers, written by the log writer in the transaction that
    appends the events. It starts empty; the store fills it from the existing log when it
    opens (log/sqlite_search.py: a search fold version it has not indexed with)."""
    db.execute(
        """
        CREATE TABLE search_rows (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            row_id TEXT NOT NULL,
            role TEXT NOT NULL,
            position INTEGER NOT NULL,       -- index in the visible transcript
            at REAL NOT NULL,
            text TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX search_rows_by_session ON search_rows(session_id, position)")
    db.execute(
        "CREATE VIRTUAL TABLE search_fts USING fts5(text, content='search_rows', "
        "content_rowid='id', tokenize='unicode61 remove_diacritics 2')"
    )
    db.execute(
        "CREATE TRIGGER search_rows_added AFTER INSERT ON search_rows BEGIN "
        "INSERT INTO search_fts(rowid, text) VALUES (new.id, new.text); END"
    )
    db.execute(
        "CREATE TRIGGER search_rows_removed AFTER DELETE ON search_rows BEGIN "
        "INSERT INTO search_fts(search_fts, rowid, text) VALUES ('delete', old.id, old.text); "
        "END"
    )


@migration
def m005_accounts(db: sqlite3.Connection) -> None:
    """Accounts (docs/api.md §15): users, their API tokens (hashed) and who owns each
    session. Sessions already in the log get no owner row: they are unowned until the first
    admin exists, who then owns them (`claim_unowned`), so a single-user data directory
    upgraded to accounts stays its first admin's."""
    db.execute(
        """
        CREATE TABLE users (
            user_id TEXT PRIMARY KEY,
            username TEXT NOT NULL,
            username_key TEXT NOT NULL UNIQUE, -- casefolded: names are unique ignoring case
            admin INTEGER NOT NULL,
            password_hash TEXT,                -- argon2id; NULL: signs in through a proxy/OIDC
            epoch INTEGER NOT NULL DEFAULT 0,  -- grows at each logout-everywhere
            created_at REAL NOT NULL,
            external_id TEXT UNIQUE            -- who the OIDC provider says it is: issuer|sub
        )
        """
    )
    db.execute(
        """
        CREATE TABLE api_tokens (
            token_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            name TEXT NOT NULL,
            token_hash TEXT NOT NULL UNIQUE,   -- SHA-256 of the secret, never the secret
            created_at REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX api_tokens_by_user ON api_tokens(user_id)")
    db.execute("CREATE TABLE session_owners (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL)")


@migration
def m006_turn_texts(db: sqlite3.Connection) -> None:
    """The text of every submitted turn, for the session list's `q` (docs/api.md §3): a
    compact copy with a trigram FTS5 index over it, so that a piece of text is found
    without reading every event of the log (that scan took about 250 ms at 1,000,000
    events). Filled here from the log; the writer adds a turn's text in the transaction that
    appends it and removes a session's with its log (log/sqlite_search.py)."""
    db.execute(
        "CREATE TABLE turn_texts (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, "
        "text TEXT NOT NULL)"
    )
    db.execute("CREATE INDEX turn_texts_by_session ON turn_texts(session_id)")
    if sqlite3.sqlite_version_info >= (3, 34, 0):  # FTS5's trigram tokenizer (sqlite_search)
        db.execute(
            "CREATE VIRTUAL TABLE turn_texts_fts USING fts5(text, content='turn_texts', "
            "content_rowid='id', tokenize='trigram')"
        )
        db.execute(
            "CREATE TRIGGER turn_texts_added AFTER INSERT ON turn_texts BEGIN "
            "INSERT INTO turn_texts_fts(rowid, text) VALUES (new.id, new.text); END"
        )
        db.execute(
            "CREATE TRIGGER turn_texts_removed AFTER DELETE ON turn_texts BEGIN "
            "INSERT INTO turn_texts_fts(turn_texts_fts, rowid, text) "
            "VALUES ('delete', old.id, old.text); END"
        )
    db.execute(
        "INSERT INTO turn_texts (session_id, text) SELECT session_id, "
        "json_extract(data, '$.text') FROM events WHERE type = 'turn.submitted' "
        "AND json_type(data, '$.text') = 'text' ORDER BY id"
    )


@migration
def m007_search_words_with_marks(db: sqlite3.Connection) -> None:
    """Combining marks (Unicode M*: Devanagari vowel signs and viramas, Arabic harakat, Thai
    vowel marks, an accent typed as a mark after its letter) are part of a word in the search
    index, as letters and digits are: m004's tokenizer took only `L* N* Co` and cut such
    words at every mark. `remove_diacritics 2` still folds Latin accents, precomposed or
    typed as marks. The query's words are read by the same categories (sessions/search.py).
    FTS5 cannot change a table's tokenizer: the index is made again and rebuilt from the rows
    it indexes (their text is unchanged, so the triggers of m004 keep it)."""
    db.execute("DROP TABLE search_fts")
    db.execute(
        "CREATE VIRTUAL TABLE search_fts USING fts5(text, content='search_rows', "
        "content_rowid='id', tokenize=\"unicode61 remove_diacritics 2 categories 'L* N* Co M*'\")"
    )
    db.execute("INSERT INTO search_fts(search_fts) VALUES ('rebuild')")


def apply_migrations(db: sqlite3.Connection, where: str = "") -> list[str]:
    """Apply what is missing, each in its own transaction; return the names applied. A
    database holding a migration this version lacks is refused first (NewerSchema, naming
    `where`), before anything is written.

    `db` is in autocommit mode (isolation_level=None): transactions are explicit.
    """
    db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    done = {row[0] for row in db.execute("SELECT name FROM migrations")}
    unknown = done - {name for name, _ in MIGRATIONS}
    if unknown:
        raise NewerSchema(where, sorted(unknown))
    applied = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            fn(db)
            db.execute("INSERT INTO migrations VALUES (?, ?)", (name, time.time()))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        applied.append(name)
    return applied
