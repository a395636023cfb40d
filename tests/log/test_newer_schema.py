"""A database migrated by a newer Tether is refused by an older one (docs/operations.md,
"Upgrading"; layer: the log's schema, log/migrations.py and log/pg_schema.py). Downgrades are
not supported: an older server (or `tether users`) would write rows without what the newer
migrations added and fold the sidebar rows its old way again, so it says which migrations it
does not know and exits, changing nothing, on both backends."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg
import pytest

from tether.log import StorageError
from tether.log.postgres import PostgresEventStore
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

from accounts_kit import tether_users

FUTURE = "m099_from_a_newer_tether"


def _pg_store(url: str) -> PostgresEventStore:
    return PostgresEventStore(url, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)


def test_a_postgresql_database_with_a_migration_this_version_lacks_is_refused(
    url: str, tmp_path: Path
) -> None:
    asyncio.run(_pg_store(url).aclose())
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("INSERT INTO tether_migrations VALUES (%s, 0)", (FUTURE,))
        db.execute("UPDATE meta SET value='sidebar-99' WHERE key='index_version'")
    with pytest.raises(StorageError) as refused:
        _pg_store(url)
    assert FUTURE in str(refused.value) and "newer version of Tether" in str(refused.value)
    with psycopg.connect(url, autocommit=True) as db:  # the newer fold's rows are left alone
        (version,) = db.execute("SELECT value FROM meta WHERE key='index_version'").fetchone()
    assert version == "sidebar-99"
    listed = tether_users(tmp_path, "list", "--database-url", url)
    assert listed.returncode == 1, listed.stdout
    assert FUTURE in listed.stderr and "newer version of Tether" in listed.stderr


def test_a_sqlite_database_with_a_migration_this_version_lacks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tether.db"
    SQLiteEventStore(path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION).close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("INSERT INTO migrations VALUES (?, 0)", (FUTURE,))
    db.execute("UPDATE meta SET value='sidebar-99' WHERE key='index_version'")
    db.close()
    with pytest.raises(StorageError) as refused:
        SQLiteEventStore(path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)
    assert FUTURE in str(refused.value) and str(path) in str(refused.value)
    db = sqlite3.connect(path, isolation_level=None)
    assert db.execute("SELECT value FROM meta WHERE key='index_version'").fetchone() == (
        "sidebar-99",
    )
    db.close()
