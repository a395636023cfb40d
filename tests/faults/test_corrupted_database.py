"""Layer: run journal (the log's store at start-up). The log is the only source of truth, so
a database Tether cannot trust is never reset, repaired or adopted in silence: `tether serve`
exits non-zero with an error that names the file, and leaves the file byte for byte as it
was (no write, and no write-ahead log left that would change it at the next open).

tests/e2e/test_cli.py covers a file of repeated ASCII garbage; these cover garbage behind a
valid SQLite header, real Tether databases cut short at several places, and valid SQLite
files that belong to someone else.

SQLite only: the faults are in the database file itself, which PostgreSQL does not have.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ServerProcess, free_port, new_session, start_turn, wait_idle

pytestmark = pytest.mark.slow

PAGE = 4096


@pytest.fixture(scope="module")
def tether_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real Tether database with a few sessions and runs, closed cleanly."""
    root = tmp_path_factory.mktemp("healthy")
    server = ServerProcess(root / "data", env={"TETHER_DEMO_DELAY": "0.001"}).start()
    with server.client() as client:
        for n in range(4):
            sid = new_session(client, f"session {n}")
            start_turn(client, sid, f"message {n} " * 40)
            wait_idle(client, sid)
    assert server.stop() == 0
    assert not (root / "data" / "tether.db-wal").exists()  # checkpointed into the file
    return (root / "data" / "tether.db").read_bytes()


def damaged(content: bytes, where: Path) -> bool:
    """Does SQLite itself find `content` damaged? (checked on a copy, read-only)"""
    copy = where / "copy.db"
    copy.write_bytes(content)
    try:
        db = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        try:
            return db.execute("PRAGMA integrity_check").fetchone()[0] != "ok"
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return True
    finally:
        for leftover in where.glob("copy.db*"):
            leftover.unlink()


def serve_refuses(data: Path) -> str:
    """Run `tether serve` on `data`; it must exit non-zero at once, naming the database.
    Returns what it printed."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "serve",
            "--data-dir",
            str(data),
            "--port",
            str(free_port()),
            "--no-browser",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert str(data / "tether.db") in output, output
    assert "The file was left as it is" in output
    return output


def assert_untouched(data: Path, before: bytes) -> None:
    assert (data / "tether.db").read_bytes() == before
    wal = data / "tether.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # nothing waits to be applied to it


def put(tmp_path: Path, content: bytes) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "tether.db").write_bytes(content)
    return data


@pytest.mark.parametrize("seed", [7, 8])
def test_random_bytes_behind_a_valid_sqlite_header_are_refused_and_kept(
    tmp_path: Path, seed: int
) -> None:
    content = b"SQLite format 3\x00" + random.Random(seed).randbytes(8 * PAGE - 16)
    data = put(tmp_path, content)
    assert "Cannot open the Tether database" in serve_refuses(data)
    assert_untouched(data, content)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda size: PAGE, id="to-its-first-page"),
        pytest.param(lambda size: size // 2 // PAGE * PAGE, id="to-half-its-pages"),
        pytest.param(lambda size: size - PAGE // 2, id="inside-its-last-page"),
    ],
)
def test_a_tether_database_cut_short_is_refused_and_kept(
    tmp_path: Path, tether_db: bytes, cut: Callable[[int], int]
) -> None:
    content = tether_db[: cut(len(tether_db))]
    assert damaged(content, tmp_path), "the cut must really damage the database"
    data = put(tmp_path, content)
    output = serve_refuses(data)
    assert (
        "Cannot open the Tether database" in output or "Cannot read the Tether database" in output
    )
    assert "malformed" in output
    assert_untouched(data, content)


def test_a_damaged_events_page_that_only_recovery_reads_is_refused_and_kept(
    tmp_path: Path, tether_db: bytes
) -> None:
    """The header, the schema and the indexes opening reads are intact; the events table's
    root page is random bytes, found only when start-up recovery scans the table."""
    copy = tmp_path / "copy.db"
    copy.write_bytes(tether_db)
    db = sqlite3.connect(f"file:{copy}?immutable=1", uri=True)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='events'").fetchone()[0]
    db.close()
    copy.unlink()
    start = (root - 1) * PAGE
    content = tether_db[:start] + random.Random(root).randbytes(PAGE) + tether_db[start + PAGE :]
    assert damaged(content, tmp_path)
    data = put(tmp_path, content)
    output = serve_refuses(data)
    assert "Cannot read the Tether database" in output and "malformed" in output
    assert_untouched(data, content)


def foreign_with_events(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT, happened_at TEXT)")
    db.execute("INSERT INTO events (name, happened_at) VALUES ('launch', '2026-05-16')")
    db.commit()
    db.close()


def foreign_without_conflict(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE contacts (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO contacts (name) VALUES ('Ada')")
    db.commit()
    db.close()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(foreign_with_events, id="with-a-conflicting-events-table"),
        pytest.param(foreign_without_conflict, id="with-its-own-tables-only"),
    ],
)
def test_a_valid_sqlite_file_of_another_program_is_refused_and_kept(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    make(data / "tether.db")
    before = (data / "tether.db").read_bytes()
    assert "is not a Tether database" in serve_refuses(data)
    assert_untouched(data, before)
    db = sqlite3.connect(data / "tether.db")  # still the other program's, as it was
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert "migrations" not in {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    db.close()


def test_a_healthy_database_still_opens_after_the_refusals(
    tmp_path: Path, tether_db: bytes
) -> None:
    """The refusal is not a false alarm: the same checks let an intact database through."""
    data = put(tmp_path, tether_db)
    server = ServerProcess(data).start()
    with server.client() as client:
        sessions = client.get("/api/sessions").json()["sessions"]
        assert sorted(s["title"] for s in sessions) == [f"session {n}" for n in range(4)]
    assert server.stop() == 0
