"""The backends the contract suite runs against, and what the suite needs from each.

A backend here is a factory for one database: `open()` returns an `EventStore` on it (call
it again to reopen the same data), and a few inspection hooks look at the database through
a connection of their own, behind the store's back. Adding a backend to Tether means adding
a class like `SQLiteBackend` and its name to `BACKENDS`; every contract test then runs
against it. `spec()` / `from_spec()` let the crash test open the same database in a child
process.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/, for pg.py (also in the crash child)
import pg  # noqa: E402

from tether.events import Event  # noqa: E402
from tether.log.sqlite import SQLiteEventStore  # noqa: E402
from tether.log.sqlite_accounts import SQLiteAccountStore  # noqa: E402
from tether.log.store import AccountStore, EventStore, IndexFold, SearchFold  # noqa: E402

PROBE_FOLD_VERSION = "probe-1"


def probe_fold(state: dict[str, Any] | None, event: Event) -> dict[str, Any]:
    """An index fold that records every seq it was given: the state shows whether each event
    was folded once, in order, and nothing else was."""
    seqs = [] if state is None else state["seqs"]
    return {"session_id": event.session_id, "seqs": [*seqs, event.seq], "last_type": event.type}


def other_probe_fold(state: dict[str, Any] | None, event: Event) -> dict[str, Any]:
    """A different fold (a new version of the index code): counts instead of listing."""
    count = 0 if state is None else state["count"]
    return {"session_id": event.session_id, "count": count + 1}


class Backend(Protocol):
    name: str

    async def open(
        self,
        fold: IndexFold = probe_fold,
        version: str = PROBE_FOLD_VERSION,
        search: tuple[SearchFold, str] | None = None,
    ) -> EventStore:
        """A store on this backend's database (the same data every time); `search` is the
        search fold and its version, when the test searches."""

    async def open_accounts(self) -> AccountStore:
        """The users and tokens on this backend's database (open the log first: it migrates)."""

    def spec(self) -> dict[str, Any]:
        """JSON that `from_spec` turns back into this backend in another process."""

    def physical_order(self, session_id: str) -> list[int]:
        """The session's seqs in the order the rows were physically appended."""

    def committed_last_seq(self, session_id: str) -> int | None:
        """The highest seq of the session that another connection can see committed."""

    def make_index_stale(self, session_id: str) -> None:
        """Overwrite the session's persisted index state with a wrong, older one."""

    def hold_writes(self, session_id: str) -> Any:
        """A context manager: while it is held, no batch writing `session_id` can commit (it
        waits for a lock another connection holds), so appends queue up behind it."""

    def dispose(self) -> None:
        """Drop the database."""


class SQLiteBackend:
    name = "sqlite"

    def __init__(self, path: Path):
        self.path = path
        self._peek: sqlite3.Connection | None = None

    async def open(
        self,
        fold: IndexFold = probe_fold,
        version: str = PROBE_FOLD_VERSION,
        search: tuple[SearchFold, str] | None = None,
    ) -> EventStore:
        search_fold, search_version = search or (None, None)
        return SQLiteEventStore(
            self.path,
            index_fold=fold,
            index_version=version,
            search_fold=search_fold,
            search_version=search_version,
        )

    async def open_accounts(self) -> AccountStore:
        return SQLiteAccountStore(self.path)

    def spec(self) -> dict[str, Any]:
        return {"backend": self.name, "path": str(self.path)}

    def _conn(self) -> sqlite3.Connection:
        if self._peek is None:
            self._peek = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        return self._peek

    def physical_order(self, session_id: str) -> list[int]:
        rows = self._conn().execute(
            "SELECT seq FROM events WHERE session_id=? ORDER BY id", (session_id,)
        )
        return [seq for (seq,) in rows]

    def committed_last_seq(self, session_id: str) -> int | None:
        row = (
            self._conn()
            .execute("SELECT MAX(seq) FROM events WHERE session_id=?", (session_id,))
            .fetchone()
        )
        return row[0]

    def make_index_stale(self, session_id: str) -> None:
        self._conn().execute(
            "UPDATE session_index SET state='{}', last_seq=0 WHERE session_id=?", (session_id,)
        )

    @contextmanager
    def hold_writes(self, session_id: str) -> Iterator[None]:
        holder = sqlite3.connect(self.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the database's one write lock
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    def dispose(self) -> None:
        if self._peek is not None:
            self._peek.close()
            self._peek = None


class PostgresBackend:
    """A database of its own on the test server (tests/pg.py), dropped by `dispose`."""

    name = "postgresql"

    def __init__(self, url: str, dbname: str | None = None):
        self.url = url
        self._dbname = dbname  # set when this backend made the database (and drops it)
        self._peek: Any = None

    @classmethod
    def create(cls) -> PostgresBackend:
        dbname, url = pg.create_database()
        return cls(url, dbname)

    async def open(
        self,
        fold: IndexFold = probe_fold,
        version: str = PROBE_FOLD_VERSION,
        search: tuple[SearchFold, str] | None = None,
    ) -> EventStore:
        from tether.log.postgres import PostgresEventStore

        search_fold, search_version = search or (None, None)
        return PostgresEventStore(
            self.url,
            index_fold=fold,
            index_version=version,
            search_fold=search_fold,
            search_version=search_version,
        )

    async def open_accounts(self) -> AccountStore:
        from tether.log.pg_accounts import PostgresAccountStore

        return PostgresAccountStore(self.url)

    def spec(self) -> dict[str, Any]:
        return {"backend": self.name, "url": self.url}

    def _conn(self) -> Any:
        if self._peek is None:
            import psycopg

            self._peek = psycopg.connect(self.url, autocommit=True)
        return self._peek

    def physical_order(self, session_id: str) -> list[int]:
        rows = self._conn().execute(
            "SELECT seq FROM events WHERE session_id=%s ORDER BY id", (session_id,)
        )
        return [seq for (seq,) in rows]

    def committed_last_seq(self, session_id: str) -> int | None:
        row = (
            self._conn()
            .execute("SELECT MAX(seq) FROM events WHERE session_id=%s", (session_id,))
            .fetchone()
        )
        return row[0]

    def make_index_stale(self, session_id: str) -> None:
        self._conn().execute(
            "UPDATE sessions SET state='{}', state_seq=0 WHERE session_id=%s", (session_id,)
        )

    @contextmanager
    def hold_writes(self, session_id: str) -> Iterator[None]:
        import psycopg

        with psycopg.connect(self.url) as holder:  # the session's counter row, locked
            holder.execute("SELECT 1 FROM sessions WHERE session_id=%s FOR UPDATE", (session_id,))
            try:
                yield
            finally:
                holder.rollback()

    def dispose(self) -> None:
        if self._peek is not None:
            self._peek.close()
            self._peek = None
        if self._dbname is not None:
            pg.drop_database(self._dbname)


BACKENDS = ["sqlite", "postgresql"]


def make_backend(name: str, workdir: Path) -> Backend:
    if name == "sqlite":
        return SQLiteBackend(workdir / "tether.db")
    if name == "postgresql":
        return PostgresBackend.create()
    raise ValueError(f"unknown backend {name!r}")


def from_spec(spec: dict[str, Any]) -> Backend:
    if spec["backend"] == "sqlite":
        return SQLiteBackend(Path(spec["path"]))
    if spec["backend"] == "postgresql":
        return PostgresBackend(spec["url"])
    raise ValueError(f"unknown backend {spec['backend']!r}")
