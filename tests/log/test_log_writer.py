"""Layer: the log, SQLite's own behaviour: its thread-safe `submit_append`, its migrations, a
commit that fails, a damaged file. What every backend must do (contiguous seqs, disk order,
publication after commit, the stream fence, durability, the index fold) is proved for SQLite
by the backend contract suite in tests/log/backend_contract/."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from tether.log import Draft, StorageError
from tether.log.migrations import MIGRATIONS, apply_migrations
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row


def open_store(path: Path) -> SQLiteEventStore:
    return SQLiteEventStore(path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)


def created(title: str = "t") -> list[Draft]:
    return [Draft("session.created", {"title": title})]


def test_threads_appending_through_submit_append_never_interleave_a_batch(tmp_path: Path) -> None:
    store = open_store(tmp_path / "t.db")
    asyncio.run(store.create_session("s1", created()))
    results: list[list[int]] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(20):
            events = store.submit_append("s1", [Draft("a"), Draft("b"), Draft("c")]).result()
            with lock:
                results.append([e.seq for e in events])

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    for batch in results:  # an atomic multi-event append stays contiguous
        assert batch == list(range(batch[0], batch[0] + 3))
    assert sorted(s for b in results for s in b) == list(range(2, 602))


def test_a_failed_commit_changes_nothing_and_the_log_recovers(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store(tmp_path / "t.db")
        await store.create_session("s1", created())
        blocker = sqlite3.connect(tmp_path / "t.db", timeout=0)
        blocker.execute("BEGIN EXCLUSIVE")  # the writer cannot get its lock
        store._db.execute("PRAGMA busy_timeout=50")
        with pytest.raises(StorageError):
            await store.append("s1", [Draft("x")])
        assert await store.last_seq("s1") == 1
        blocker.rollback()
        blocker.close()
        events = await store.append("s1", [Draft("y")])
        assert [e.seq for e in events] == [2]
        assert [e.type for e in await store.read("s1")] == ["session.created", "y"]
        store.close()

    asyncio.run(main())


def test_an_old_database_is_migrated_forward(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    first_name, first = MIGRATIONS[0]
    first(conn)
    conn.execute("INSERT INTO migrations VALUES (?, 0)", (first_name,))
    conn.execute(
        "INSERT INTO events (session_id, seq, type, at, data) VALUES "
        "('old', 1, 'session.created', 1.0, '{\"title\": \"From v0\"}')"
    )
    conn.close()
    store = open_store(db)
    assert asyncio.run(store.index_state("old"))["title"] == "From v0"
    store.close()
    conn = sqlite3.connect(db, isolation_level=None)
    assert apply_migrations(conn) == []  # nothing left to apply, and applying is idempotent
    conn.close()


def test_a_corrupted_database_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    db = tmp_path / "tether.db"
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError) as info:
        open_store(db)
    assert str(db) in str(info.value)
    assert db.read_bytes().startswith(b"this is not a database")  # left untouched


def test_unstorable_data_fails_only_its_own_append_and_the_writer_lives_on(tmp_path: Path) -> None:
    """Found by fuzzing: a lone surrogate used to kill the writer thread, freezing all writes."""
    from tether.log.errors import InvalidEvent

    async def main() -> None:
        store = open_store(tmp_path / "t.db")
        await store.create_session("s1", created())
        bad = store.submit_append("s1", [Draft("a"), Draft("x", {"text": "\ud800"})])
        good = store.submit_append("s1", [Draft("b")])
        with pytest.raises(InvalidEvent):
            await asyncio.wrap_future(bad)
        assert [e.seq for e in await asyncio.wrap_future(good)] == [2]
        assert [e.type for e in await store.read("s1")] == ["session.created", "b"]
        assert [e.seq for e in await store.append("s1", [Draft("c")])] == [3]
        store.close()

    asyncio.run(main())


def test_an_append_queued_behind_the_close_is_answered_not_left_waiting(tmp_path: Path) -> None:
    """An append that reaches the queue after the close's marker (the writer busy with a
    batch meanwhile) fails with 'the log is closed'; before, its caller waited forever."""

    async def main() -> None:
        store = open_store(tmp_path / "t.db")
        await store.create_session("s1", created())
        holder = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the writer's next batch waits for the lock
        first = asyncio.create_task(store.append("s1", [Draft("first")]))
        await asyncio.sleep(0.3)
        closing = asyncio.create_task(asyncio.to_thread(store.close))
        await asyncio.sleep(0.1)  # the close's marker is queued behind the waiting batch
        late = asyncio.create_task(store.append("s1", [Draft("late")]))
        await asyncio.sleep(0.1)
        holder.execute("ROLLBACK")
        holder.close()
        assert [e.seq for e in await asyncio.wait_for(first, 10)] == [2]
        with pytest.raises(StorageError, match="closed"):
            await asyncio.wait_for(late, 10)
        await asyncio.wait_for(closing, 10)
        with pytest.raises(StorageError, match="closed"):
            await store.append("s1", [Draft("after")])

    asyncio.run(main())
