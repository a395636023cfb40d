"""The PostgreSQL backend's numbered schema migrations (the habit of log/migrations.py, kept
beside this backend's code as docs/architecture.md §2 asks). Never edit a released migration:
add the next one. Replicas starting at once apply them one at a time, under a transaction
advisory lock, so each runs exactly once.

The shape, and why:
- `sessions` is the per-session counter row: `last_seq` is updated in the transaction that
  inserts the events, under `SELECT ... FOR UPDATE`, so seqs are contiguous whatever the number
  of writers and replicas (a database sequence would commit out of order and readers would skip
  seqs). The index fold state (the sidebar row) lives in the same row, at `state_seq`.
- `events.data` is the event's JSON as text, exactly as written: `jsonb` would refuse `\\u0000`
  and reorder keys. What the queries need from it is copied into columns at insert time.
- `closed_streams` holds each stream's `run.finished`: its primary key is the fence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg

from tether.log.errors import NewerSchema

log = logging.getLogger("tether.log")

Migration = Callable[[psycopg.Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []

# pg_advisory_xact_lock key of the migrations and the index rebuild ("tether" in ASCII).
SCHEMA_LOCK = 0x746574686572


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


def with_extension(db: psycopg.Connection, extension: str, *statements: str) -> None:
    """Create a contrib extension and what uses it, in a savepoint: a server without it, or
    a role that may not create it, goes on without them, and the log says what to run by
    hand (docs/operations.md)."""
    try:
        with db.transaction():
            db.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
            for statement in statements:
                db.execute(statement)
    except psycopg.Error as exc:
        log.warning(
            "PostgreSQL extension %s not set up (%s); Tether works without it. To add it "
            "later, as a role that may: CREATE EXTENSION %s; %s",
            extension,
            str(exc).strip(),
            extension,
            "; ".join(statements),
        )


@migration
def m001_events(db: psycopg.Connection) -> None:
    db.execute(
        """
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            last_seq BIGINT NOT NULL,
            state TEXT,                      -- the IndexFold state at state_seq (JSON)
            state_seq BIGINT NOT NULL DEFAULT 0
        )
        """
    )
    db.execute(
        """
        CREATE TABLE events (
            id BIGSERIAL UNIQUE,             -- physical append order
            session_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            type TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            stream_id TEXT,
            turn_id TEXT,
            data TEXT NOT NULL,
            queue_id TEXT,                   -- queue.*: data.queue_id (old rows: added only)
            search_text TEXT,                -- data.text of a turn.submitted
            PRIMARY KEY (session_id, seq)
        )
        """
    )
    db.execute("CREATE INDEX events_queue ON events (queue_id) WHERE queue_id IS NOT NULL")
    db.execute("CREATE INDEX events_turns ON events (id) WHERE type = 'turn.submitted'")
    db.execute(
        """
        CREATE TABLE closed_streams (
            stream_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX closed_streams_by_session ON closed_streams (session_id)")
    db.execute(
        """
        CREATE TABLE attachments (
            session_id TEXT NOT NULL,
            id TEXT NOT NULL,
            blob TEXT NOT NULL,              -- the SHA-256 the bytes are stored under
            name TEXT NOT NULL,
            mime TEXT NOT NULL,
            size BIGINT NOT NULL,
            PRIMARY KEY (session_id, id)
        )
        """
    )
    db.execute("CREATE INDEX attachments_by_id ON attachments (id)")
    db.execute("CREATE INDEX attachments_by_blob ON attachments (blob)")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


@migration
def m002_open_stream(db: psycopg.Connection) -> None:
    """Admission in the database: the counter row names the session's unfinished run (its
    `turn.submitted` stream until its `run.finished`), kept in the transaction that writes
    them, so one run per session holds whichever replica admits it."""
    db.execute("ALTER TABLE sessions ADD COLUMN open_stream TEXT")
    db.execute(
        """
        UPDATE sessions s SET open_stream = (
            SELECT t.stream_id FROM events t
            WHERE t.session_id = s.session_id AND t.type = 'turn.submitted'
              AND t.stream_id IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM closed_streams c WHERE c.stream_id = t.stream_id)
            ORDER BY t.id DESC LIMIT 1
        )
        """
    )


@migration
def m003_cancel_stream(db: psycopg.Connection) -> None:
    """Stop as durable state, once per run: the counter row names the run whose
    `run.cancel_requested` is logged, so a second one (through another replica) is refused."""
    db.execute("ALTER TABLE sessions ADD COLUMN cancel_stream TEXT")
    db.execute(
        """
        UPDATE sessions s SET cancel_stream = s.open_stream WHERE EXISTS (
            SELECT 1 FROM events e WHERE e.session_id = s.session_id
              AND e.type = 'run.cancel_requested' AND e.stream_id = s.open_stream
        )
        """
    )


@migration
def m004_owners_and_search(db: psycopg.Connection) -> None:
    """Session owners (log/pg_owners.py) and the full-text search rows (log/pg_search.py).
    The search configuration folds accents through `unaccent` when the server offers the
    extension (tried in a savepoint: a server without it, or a role that may not create it,
    gets `simple` alone, where accents count)."""
    db.execute("CREATE TABLE session_owners (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL)")
    db.execute("CREATE TEXT SEARCH CONFIGURATION tether_search (COPY = simple)")
    with_extension(
        db,
        "unaccent",
        "ALTER TEXT SEARCH CONFIGURATION tether_search ALTER MAPPING FOR "
        "hword, hword_part, word WITH unaccent, simple",
    )
    db.execute(
        """
        CREATE TABLE search_rows (
            id BIGSERIAL PRIMARY KEY,        -- grows with the log's append order
            session_id TEXT NOT NULL,
            row_id TEXT NOT NULL,
            role TEXT NOT NULL,
            position BIGINT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            text TEXT NOT NULL,
            tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('tether_search'::regconfig, text))
                STORED
        )
        """
    )
    db.execute("CREATE INDEX search_rows_tsv ON search_rows USING GIN (tsv)")
    db.execute("CREATE INDEX search_rows_by_session ON search_rows (session_id)")


@migration
def m005_accounts(db: psycopg.Connection) -> None:
    """Accounts (docs/api.md §15, log/pg_accounts.py): users and their API tokens (hashed),
    as the SQLite backend's m005; `n` keeps insertion order where SQLite has its rowid."""
    db.execute(
        """
        CREATE TABLE users (
            n BIGSERIAL UNIQUE,
            user_id TEXT PRIMARY KEY,
            username TEXT NOT NULL,
            username_key TEXT NOT NULL UNIQUE, -- casefolded: names are unique ignoring case
            admin BOOLEAN NOT NULL,
            password_hash TEXT,                -- argon2id; NULL: signs in through a proxy/OIDC
            epoch BIGINT NOT NULL DEFAULT 0,   -- grows at each logout-everywhere
            created_at DOUBLE PRECISION NOT NULL,
            external_id TEXT UNIQUE            -- who the OIDC provider says it is: issuer|sub
        )
        """
    )
    db.execute(
        """
        CREATE TABLE api_tokens (
            n BIGSERIAL UNIQUE,
            token_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            name TEXT NOT NULL,
            token_hash TEXT NOT NULL UNIQUE,   -- SHA-256 of the secret, never the secret
            created_at DOUBLE PRECISION NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX api_tokens_by_user ON api_tokens (user_id)")


@migration
def m006_leases(db: psycopg.Connection) -> None:
    """Runs have owners (log/pg_leases.py): each replica heartbeats its lease row; the counter
    row names the replica running the session's open run and an epoch bumped at each takeover.
    Runs open before this migration have no owner (recovery settles them)."""
    db.execute(
        """
        CREATE TABLE replica_leases (
            replica_id TEXT PRIMARY KEY,
            expires_at DOUBLE PRECISION NOT NULL  -- the database's clock, epoch seconds
        )
        """
    )
    db.execute("ALTER TABLE sessions ADD COLUMN open_owner TEXT")
    db.execute("ALTER TABLE sessions ADD COLUMN open_epoch BIGINT NOT NULL DEFAULT 0")


@migration
def m007_answered(db: psycopg.Connection) -> None:
    """Answers as durable state, once per prompt: the counter row lists the open run's prompts
    whose `approval.answered` / `clarify.answered` is logged (JSON), so a second answer
    (through another replica) is refused. The events are new: nothing to backfill."""
    db.execute("ALTER TABLE sessions ADD COLUMN answered TEXT NOT NULL DEFAULT '[]'")


@migration
def m008_shared_state(db: psycopg.Connection) -> None:
    """What every replica must agree on and no longer keeps in its data directory or memory
    (log/pg_shared.py, log/pg_blobs.py): the cookie secret, the login failures, the settings
    panel's defaults and the attachment bytes (by SHA-256)."""
    db.execute("CREATE TABLE server_secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute(
        """
        CREATE TABLE login_failures (
            key TEXT NOT NULL,                      -- a client address, or user:<name>
            expires_at DOUBLE PRECISION NOT NULL    -- the database's clock, epoch seconds
        )
        """
    )
    db.execute("CREATE INDEX login_failures_by_key ON login_failures (key, expires_at)")
    db.execute("CREATE INDEX login_failures_by_expiry ON login_failures (expires_at)")
    db.execute("CREATE TABLE server_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("CREATE TABLE blobs (blob TEXT PRIMARY KEY, data BYTEA NOT NULL)")


@migration
def m009_blob_stored_at(db: psycopg.Connection) -> None:
    """When a blob's bytes were last put (the database's clock), so a replica deleting the
    last session that held them leaves alone bytes another replica has just put for an
    upload whose event is not appended yet (log/pg_blobs.py). Earlier rows read as old; a row
    put without the column (a replica not upgraded yet, during a rolling upgrade) reads as
    put now."""
    db.execute("ALTER TABLE blobs ADD COLUMN stored_at DOUBLE PRECISION NOT NULL DEFAULT 0")
    db.execute(
        "ALTER TABLE blobs ALTER COLUMN stored_at SET DEFAULT extract(epoch FROM clock_timestamp())"
    )


@migration
def m010_events_by_stream(db: psycopg.Connection) -> None:
    """A run's own events by its stream id (the search fold reads a run's text when it
    finishes, log/pg_search.py), as SQLite's `events_by_stream`: without it each
    `run.finished` scanned the whole events table inside the writer's transaction. A plain
    CREATE INDEX (the migration is a transaction): writes wait while it is built."""
    db.execute("CREATE INDEX events_by_stream ON events (stream_id) WHERE stream_id IS NOT NULL")


@migration
def m011_turn_text_trigrams(db: psycopg.Connection) -> None:
    """The session list's `q` (log/pg_reads.py, `search_text`) through a trigram index over
    the turns' text, when the server offers `pg_trgm` (tried in a savepoint, as `unaccent` in
    m004; without it `q` reads every turn's text, as before). A plain CREATE INDEX (the
    migration is a transaction): writes wait while it is built."""
    with_extension(
        db,
        "pg_trgm",
        "CREATE INDEX events_turn_text ON events USING GIN "
        "(lower(search_text) gin_trgm_ops) WHERE type = 'turn.submitted'",
    )


@migration
def m012_continued_in(db: psycopg.Connection) -> None:
    """The session a rotated session continues in (its `session.rotated`), on the counter
    row, so that the database refuses a new turn, a queued message or a change of the
    transcript written there after the rotation (log/pg_batch.py): a replica that checked the
    session before another one rotated it must not write to the rotated parent. Backfilled
    from the log (the latest `session.rotated` of each session)."""
    db.execute("ALTER TABLE sessions ADD COLUMN continued_in TEXT")
    db.execute(
        """
        UPDATE sessions s SET continued_in = (
            SELECT e.data::json->>'continuation_session_id' FROM events e
            WHERE e.session_id = s.session_id AND e.type = 'session.rotated'
            ORDER BY e.seq DESC LIMIT 1
        )
        WHERE EXISTS (
            SELECT 1 FROM events e
            WHERE e.session_id = s.session_id AND e.type = 'session.rotated'
        )
        """
    )


@migration
def m013_search_words(db: psycopg.Connection) -> None:
    """The search vector made from each row's words (log/search_words.py, as SQLite's index
    and the query read them), not from its text: PostgreSQL's parser read `config.yaml`, a
    URL, an address or a path as one token and left HTML tags out, so none of their words
    were found (log/pg_search.py). The rows are made again from the log when the store opens
    (the stored search version is dropped). Words with digits (`café2`) fold their accents
    too, as the other words do."""
    db.execute("ALTER TABLE search_rows ADD COLUMN words TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE search_rows DROP COLUMN tsv")  # and its index
    db.execute(
        "ALTER TABLE search_rows ADD COLUMN tsv TSVECTOR GENERATED ALWAYS AS "
        "(to_tsvector('tether_search'::regconfig, words)) STORED"
    )
    db.execute("CREATE INDEX search_rows_tsv ON search_rows USING GIN (tsv)")
    db.execute("DELETE FROM meta WHERE key='search_version'")
    with_extension(
        db,
        "unaccent",
        "ALTER TEXT SEARCH CONFIGURATION tether_search ALTER MAPPING FOR "
        "hword, hword_part, word, numword WITH unaccent, simple",
    )


def apply_migrations(db: psycopg.Connection, where: str = "") -> list[str]:
    """Apply what is missing, each in its own transaction; return the names applied. A
    database holding a migration this version lacks (a newer replica ran it) is refused
    first (NewerSchema, naming `where`), before anything is written.
    `db` is in autocommit mode: transactions are explicit."""
    applied = []
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        db.execute(
            "CREATE TABLE IF NOT EXISTS tether_migrations "
            "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        recorded = {name for (name,) in db.execute("SELECT name FROM tether_migrations")}
    unknown = recorded - {name for name, _ in MIGRATIONS}
    if unknown:
        raise NewerSchema(where, sorted(unknown))
    for name, fn in MIGRATIONS:
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            done = db.execute("SELECT 1 FROM tether_migrations WHERE name=%s", (name,))
            if done.fetchone() is not None:
                continue
            fn(db)
            db.execute("INSERT INTO tether_migrations VALUES (%s, %s)", (name, time.time()))
            applied.append(name)
    return applied
