"""A throwaway PostgreSQL database per test, on the server the suite is given.

TETHER_TEST_POSTGRES names the server (default: the local one on 127.0.0.1:5432, user
postgres, trust auth, as CI and the development machine run it). Each test creates a database
of a unique name and drops it afterwards. Without a reachable server the PostgreSQL tests are
skipped with a printed reason (pytest -rs shows it), never silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

SERVER = os.environ.get("TETHER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _admin():  # noqa: ANN202
    import psycopg

    return psycopg.connect(SERVER, autocommit=True, connect_timeout=3)


def unavailable() -> str | None:
    """Why the PostgreSQL tests cannot run here (None: they can)."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f"PostgreSQL tests skipped: the postgres extra is not installed ({exc})"
    try:
        with _admin():
            return None
    except Exception as exc:
        return f"PostgreSQL tests skipped: no server at {SERVER} ({exc})".strip()


def url_of(name: str) -> str:
    """SERVER's URL with the database `name` (a postgresql:// URL, as --database-url takes)."""
    return urlunsplit(urlsplit(SERVER)._replace(path=f"/{name}"))


def create_database() -> tuple[str, str]:
    """A new empty database: (its name, its URL). Skips the test without a server."""
    reason = unavailable()
    if reason is not None:
        print(reason)
        pytest.skip(reason)
    name = f"tether_test_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name, url_of(name)


def drop_database(name: str) -> None:
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database() -> Iterator[str]:
    """The URL of a database that exists for the `with` block."""
    name, url = create_database()
    try:
        yield url
    finally:
        drop_database(name)
