"""Full-text search (issue 16.6): what `GET /api/search` costs over the index itself, and what
keeping the index costs the log writer.

1. Index cost. The same turn-shaped workload (a user turn, a run start, coalesced text deltas,
   the run's end; every event its own append, as the server does) is appended by concurrent
   sessions to two fresh databases: one store with the search fold, one without. The ratio is
   the append time with the index over the time without it; the target is at most 1.3.
2. Query cost. A database of SESSIONS sessions of EVENTS events in all (by default 10,000 and
   1,000,000) is built through the real store with the search fold, then served by a real
   `tether serve`. Each query is timed as `GET /api/search` over HTTP (keep-alive) and as the
   very same FTS5 statements run directly on the database (sqlite3, warm); the ratio of the
   medians is the target, at most 3. The HTTP floor (`GET /api/health` on the same
   connection) is printed beside it: what any request costs, whatever it asks.

    python bench/search.py            # full run: 1,000,000 events, a few minutes on 2 cores
    python bench/search.py --quick    # 20,000 events, a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchkit import write_results  # noqa: E402 - puts tests/ on sys.path

from tether.log import Draft, sqlite_search
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change

from helpers import ServerProcess

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "search.json"
EVENTS_PER_SESSION = 100  # session.created + 9 turns of 11 events
DELTAS_PER_TURN = 8
QUERY_TARGET = 3.0
INDEX_TARGET = 1.3
REPEAT = 30

# A Zipf-like vocabulary: a few words in most rows, most words in few.
WORDS = [f"w{n}" for n in range(5000)]
COMMON = ["the", "and", "of", "to", "a", "in", "is", "it", "that", "for"]
TOPICS = ["python", "garden", "invoice", "kubernetes", "recipe", "poetry", "tax", "travel"]
QUERIES = {
    "common word": "the",
    "topic word": "kubernetes",
    "two words": "garden recipe",
    "rare word": "w200",
    "prefix": "kube",
}


def sentence(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        roll = rng.random()
        if roll < 0.4:
            out.append(rng.choice(COMMON))
        elif roll < 0.5:
            out.append(rng.choice(TOPICS))
        else:
            out.append(WORDS[min(int(rng.paretovariate(1.1)) - 1, len(WORDS) - 1)])
    return " ".join(out)


def turn_drafts(rng: random.Random, sid: str, n: int) -> list[list[Draft]]:
    """One turn as the server appends it: each event its own append."""
    stream, turn = f"{sid}_s{n}", f"{sid}_t{n}"
    data = {"turn_id": turn, "stream_id": stream, "text": sentence(rng, 12), "submitted_at": 1.0}
    out = [[Draft("turn.submitted", data, stream_id=stream, turn_id=turn)]]
    out.append([Draft("run.started", {"runtime": "bench", "model": "m"}, stream_id=stream)])
    for _ in range(DELTAS_PER_TURN):
        delta = {"item_id": "t1", "text": sentence(rng, 10) + " "}
        out.append([Draft("text.delta", delta, stream_id=stream)])
    out.append([Draft("run.finished", {"state": "completed"}, stream_id=stream)])
    return out


def open_store(path: Path, search: bool) -> SQLiteEventStore:
    if search:
        return SQLiteEventStore(
            path,
            index_fold=fold_row,
            index_version=SIDEBAR_FOLD_VERSION,
            search_fold=search_change,
            search_version=SEARCH_FOLD_VERSION,
        )
    return SQLiteEventStore(path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)


async def fill(store: SQLiteEventStore, sessions: int, seed: int, parallel: int) -> int:
    """`sessions` sessions of EVENTS_PER_SESSION events, `parallel` sessions at a time, each
    appending its events one append after the other. Returns the events appended."""
    rng = random.Random(seed)
    turns = (EVENTS_PER_SESSION - 1) // (DELTAS_PER_TURN + 3)
    count = 0

    async def one(sid: str) -> None:
        nonlocal count
        await store.create_session(sid, [Draft("session.created", {"title": sid})])
        count += 1
        for n in range(turns):
            for drafts in turn_drafts(rng, sid, n):
                await store.append(sid, drafts)
                count += len(drafts)

    ids = [f"s{n:06d}" for n in range(sessions)]
    for start in range(0, len(ids), parallel):
        await asyncio.gather(*(one(sid) for sid in ids[start : start + parallel]))
    return count


def append_time(path: Path, search: bool, sessions: int, parallel: int) -> tuple[float, int]:
    store = open_store(path, search)
    try:
        start = time.perf_counter()
        events = asyncio.run(fill(store, sessions, 7, parallel))
        return time.perf_counter() - start, events
    finally:
        store.close()


def index_cost(base: Path, sessions: int, repeat: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"with": [], "without": []}
    events = 0
    for i in range(repeat):
        for search in (False, True) if i % 2 == 0 else (True, False):
            path = base / f"append-{i}-{search}.db"
            elapsed, events = append_time(path, search, sessions, 50)
            times["with" if search else "without"].append(elapsed)
    with_s, without_s = statistics.median(times["with"]), statistics.median(times["without"])
    return {
        "events": events,
        "seconds_with_index": with_s,
        "seconds_without_index": without_s,
        "events_per_s_with_index": events / with_s,
        "events_per_s_without_index": events / without_s,
        "ratio": with_s / without_s,
    }


def build(data_dir: Path, sessions: int) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(data_dir / "tether.db", True)
    try:
        return asyncio.run(fill(store, sessions, 11, 200))
    finally:
        store.close()


def timed(fn: Any, repeat: int) -> float:
    fn()  # warm
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def query_cost(data_dir: Path, repeat: int, limit: int) -> dict[str, Any]:
    db = sqlite3.connect(data_dir / "tether.db")
    server = ServerProcess(data_dir, "--runtime", "demo").start(timeout=300)
    out: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            floor = timed(lambda: client.get("/api/health").raise_for_status(), repeat)
            out["http floor"] = {"q": "GET /api/health", "http_ms": floor * 1000}
            for label, q in QUERIES.items():
                words = q.split()
                expression = sqlite_search.match_expression(words)

                def direct(terms: list[str] = words) -> int:
                    rows = sqlite_search.search(
                        lambda sql, args: db.execute(sql, args).fetchall(), terms, limit
                    )
                    return len(rows)

                def http(q: str = q) -> int:
                    response = client.get("/api/search", params={"q": q, "limit": limit})
                    response.raise_for_status()
                    return len(response.json()["results"])

                if direct() != http():
                    raise SystemExit(f"{label}: HTTP and direct results differ in number")
                direct_s, http_s = timed(direct, repeat), timed(http, repeat)
                matches = db.execute(
                    "SELECT count(*) FROM search_fts WHERE search_fts MATCH ?", (expression,)
                ).fetchone()[0]
                out[label] = {
                    "q": q,
                    "matching_rows": matches,
                    "direct_ms": direct_s * 1000,
                    "http_ms": http_s * 1000,
                    "ratio": http_s / direct_s,
                }
    finally:
        server.stop()
        db.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 sessions, for smoke tests")
    parser.add_argument("--sessions", type=int, help="sessions in the search database")
    parser.add_argument("--append-sessions", type=int, help="sessions in the append workload")
    parser.add_argument("--dir", help="where the databases go (default: system temp)")
    parser.add_argument(
        "--keep",
        type=Path,
        help="build the search database in this directory and keep it; if it holds one "
        "already, reuse it and skip the append comparison",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    sessions = args.sessions or (200 if args.quick else 10_000)
    append_sessions = args.append_sessions or (50 if args.quick else 300)
    repeat = 5 if args.quick else REPEAT
    with tempfile.TemporaryDirectory(prefix="tether-bench-search-", dir=args.dir) as tmp:
        base = Path(tmp)
        data = args.keep or base / "data"
        reuse = (data / "tether.db").exists()
        index = None if reuse else index_cost(base, append_sessions, 1 if args.quick else 3)
        start = time.perf_counter()
        if reuse:
            db = sqlite3.connect(data / "tether.db")
            events = db.execute("SELECT count(*) FROM events").fetchone()[0]
            sessions = db.execute("SELECT count(DISTINCT session_id) FROM events").fetchone()[0]
            db.close()
        else:
            events = build(data, sessions)
        built_s = time.perf_counter() - start
        queries = query_cost(data, repeat, 20)
    lines = [
        f"Search: {sessions:,} sessions / {events:,} events (built in {built_s:.0f} s), "
        f"SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs",
        "",
        f"{'query':<14} {'q':<14} {'rows':>8} {'direct ms':>10} {'http ms':>9} {'ratio':>6}",
    ]
    floor = queries.pop("http floor")
    for label, row in queries.items():
        lines.append(
            f"{label:<14} {row['q']:<14} {row['matching_rows']:>8} {row['direct_ms']:>10.2f} "
            f"{row['http_ms']:>9.2f} {row['ratio']:>6.2f}"
        )
    worst = max(row["ratio"] for row in queries.values())
    lines += [
        f"{'http floor':<14} {'GET /api/health':<34} {floor['http_ms']:>9.2f}",
        "",
        f"GET /api/search / direct FTS5, worst query: {worst:.2f} (target <= {QUERY_TARGET}: "
        f"{'met' if worst <= QUERY_TARGET else 'NOT MET'})",
    ]
    if index is not None:
        lines.append(
            f"append with the index / without, {index['events']:,} events by 50 sessions at "
            f"once: {index['ratio']:.2f} ({index['events_per_s_without_index']:.0f} -> "
            f"{index['events_per_s_with_index']:.0f} events/s; target <= {INDEX_TARGET}: "
            f"{'met' if index['ratio'] <= INDEX_TARGET else 'NOT MET'})"
        )
    print("\n".join(lines))
    write_results(
        args.out,
        {
            "benchmark": "search",
            "config": {"sessions": sessions, "events": events, "quick": args.quick},
            "queries": queries,
            "http_floor_ms": floor["http_ms"],
            "index": index,
            "met": worst <= QUERY_TARGET and (index is None or index["ratio"] <= INDEX_TARGET),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
