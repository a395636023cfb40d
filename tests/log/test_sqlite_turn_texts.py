"""Layer: the log's SQLite backend, the session list's `q` (docs/api.md §3; log/sqlite_search.py,
migration m006). The text of every submitted turn is kept in the writer's transaction in a
compact table with a trigram index, so `q` never reads the events: at 1,000,000 events that
scan took about 250 ms a keystroke. What it finds is what the scan found (the backend
contract suite checks both backends against a scan of the logs)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from tether.events import Event
from tether.log import Draft
from tether.log.migrations import apply_migrations
from tether.log.sqlite import SQLiteEventStore
from tether.log.sqlite_search import sessions_with_text


def probe_fold(state: dict | None, event: Event) -> dict:
    return {"n": (state or {"n": 0})["n"] + 1}


def submit(n: int, text: str) -> Draft:
    return Draft("turn.submitted", {"text": text, "turn_id": f"u{n}"}, f"r{n}", f"u{n}")


def test_q_finds_text_through_the_index_and_forgets_a_deleted_session(tmp_path: Path) -> None:
    async def main() -> list[set[str]]:
        store = SQLiteEventStore(tmp_path / "log.db", index_fold=probe_fold, index_version="p1")
        for sid, text in (
            ("s1", 'Plans for the ÉCOLE trip, "quoted" too'),
            ("s2", "an école nearby"),
            ("s3", "nothing here"),
        ):
            await store.create_session(sid, [Draft("session.created", {})])
            await store.append(sid, [submit(int(sid[1]), text)])
        found = [
            await store.search_text(needle)
            for needle in ("école", '"quoted"', "éc", "no", "HERE", 'trip, "q', "absent")
        ]
        await store.delete_session("s2")
        found.append(await store.search_text("école"))
        await store.aclose()
        return found

    assert asyncio.run(main()) == [
        {"s1", "s2"},  # any letter's case, from three characters on
        {"s1"},  # quotes are text, not query syntax
        {"s2"},  # two characters: ASCII case only, as SQLite's lower() (not "École")
        {"s3"},
        {"s3"},
        {"s1"},
        set(),
        {"s1"},  # a deleted session's texts go with its log
    ]


def test_q_reads_the_compact_copy_never_the_events() -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    apply_migrations(db)
    plans: list[str] = []

    def query(sql: str, params: tuple) -> list[tuple]:
        plans.extend(row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + sql, params))
        return db.execute(sql, params).fetchall()

    assert sessions_with_text(query, "long enough") == set()
    assert sessions_with_text(query, "ab") == set()
    assert plans and not any("events" in step for step in plans), plans
    assert any("VIRTUAL TABLE" in step for step in plans), plans  # the trigram index


def test_a_nul_in_q_is_left_out_and_a_library_without_trigrams_scans(tmp_path: Path) -> None:
    """FTS5 reads a NUL as the end of its query ("unterminated string"): it is left out, as
    the PostgreSQL log does. A SQLite older than 3.34 has no trigram tokenizer: m006 keeps
    the copy without the index, and `q` scans it with the same answers."""

    async def nul() -> set[str]:
        store = SQLiteEventStore(tmp_path / "log.db", index_fold=probe_fold, index_version="p1")
        await store.create_session("s1", [Draft("session.created", {})])
        await store.append("s1", [submit(1, "abc and more")])
        try:
            return await store.search_text("a\x00bc")
        finally:
            await store.aclose()

    assert asyncio.run(nul()) == {"s1"}

    db = sqlite3.connect(":memory:", isolation_level=None)
    apply_migrations(db)
    db.execute("INSERT INTO turn_texts (session_id, text) VALUES ('s1', 'Find the Invoice')")

    def query(sql: str, params: tuple) -> list[tuple]:
        assert "MATCH" not in sql
        return db.execute(sql, params).fetchall()

    assert sessions_with_text(query, "INVOICE", trigrams=False) == {"s1"}
    assert sessions_with_text(query, "receipt", trigrams=False) == set()
