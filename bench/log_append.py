"""Append throughput of the event log: Tether's group-commit writer against a naive appender.

Why these numbers: every event Tether acknowledges is durable (WAL, synchronous=FULL), so a
commit costs an fsync. The honest baseline is raw sqlite3 at the same durability, committing
every row on its own, as a straightforward appender would: one fsync per event, whether one
thread appends or fifty share a lock. Tether's single writer groups whatever is queued into
one transaction, so with many concurrent appenders it pays one fsync per batch; the target
(from the issue) is tether/raw >= 0.5 at 50 appenders. With one appender there is nothing to
group, so that ratio shows the writer's own per-append cost (queue hop, future, fold and
sidebar-index upsert in the same transaction). Raw SQLite with every row in one transaction
(one fsync in all) is printed as the upper bound nobody can beat.

Every scenario appends the same total number of events to one session in a fresh database in
its own temporary directory; after each Tether run of N appends the session's seqs must be
exactly 1..N+1 (seq 1 is `session.created`) or the script exits with status 1.

    python bench/log_append.py            # full run, well under a minute on 2 cores
    python bench/log_append.py --quick    # a few seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchkit import write_results  # noqa: E402 - puts tests/ on sys.path

from tether.events import SESSION_CREATED, TEXT_DELTA
from tether.log import Draft
from tether.log.migrations import apply_migrations
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

DEFAULT_EVENTS = 5000
DEFAULT_REPEAT = 3
QUICK_EVENTS = 500
CONCURRENT = 50
TARGET_RATIO = 0.5
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "log_append.json"

SESSION = "bench"
# A coalesced text delta of typical size (docs/architecture.md §2: deltas are batched every ~50 ms).
DATA: dict[str, Any] = {"stream_id": None, "item_id": "t1", "text": "The quick brown fox " * 3}
DRAFT = Draft(TEXT_DELTA, DATA)
INSERT = (
    "INSERT INTO events (session_id, seq, type, at, stream_id, turn_id, data) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


class SanityError(Exception):
    """The log did not hold exactly the events that were acknowledged."""


@dataclass(frozen=True)
class Result:
    key: str
    label: str
    appenders: int
    events: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def split(total: int, parts: int) -> list[int]:
    """`total` events shared as evenly as possible among `parts` appenders."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def run_threads(counts: list[int], work: Callable[[int, int], None]) -> float:
    """Start one thread per count, release them together, return the wall time until all end."""
    barrier = threading.Barrier(len(counts) + 1)
    errors: list[BaseException] = []

    def body(index: int, count: int) -> None:
        barrier.wait()
        try:
            work(index, count)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [
        threading.Thread(target=body, args=(i, c), name=f"appender-{i}")
        for i, c in enumerate(counts)
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


# -- raw sqlite3 baselines --------------------------------------------------------------------


def open_raw(path: Path) -> sqlite3.Connection:
    """The same schema (the real migrations), journal mode and durability as the Tether log."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise SanityError(f"{path}: could not switch to WAL (got {mode})")
    conn.execute("PRAGMA synchronous=FULL")
    apply_migrations(conn)
    return conn


def check_raw(conn: sqlite3.Connection, events: int) -> None:
    seqs = [row[0] for row in conn.execute("SELECT seq FROM events ORDER BY id")]
    if seqs != list(range(1, events + 1)):
        raise SanityError(f"raw baseline: expected seqs 1..{events}, got {len(seqs)} rows")


def raw_per_commit(path: Path, appenders: int, events: int) -> float:
    """The naive durable appender: one transaction (one fsync) per row; concurrent appenders
    share one connection behind a lock, as SQLite allows a single writer anyway."""
    conn = open_raw(path)
    lock = threading.Lock()
    last = 0

    def work(_index: int, count: int) -> None:
        nonlocal last
        for _ in range(count):
            data = _dumps(DATA)
            with lock:
                last += 1
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(INSERT, (SESSION, last, TEXT_DELTA, time.time(), None, None, data))
                conn.execute("COMMIT")

    try:
        if appenders == 1:
            start = time.perf_counter()
            work(0, events)
            elapsed = time.perf_counter() - start
        else:
            elapsed = run_threads(split(events, appenders), work)
        check_raw(conn, events)
    finally:
        conn.close()
    return elapsed


def raw_batched(path: Path, events: int) -> float:
    """Every row in one transaction: one fsync in all, the ceiling for any appender."""
    conn = open_raw(path)
    try:
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        for seq in range(1, events + 1):
            conn.execute(INSERT, (SESSION, seq, TEXT_DELTA, time.time(), None, None, _dumps(DATA)))
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        check_raw(conn, events)
    finally:
        conn.close()
    return elapsed


# -- the Tether log ---------------------------------------------------------------------------


def open_store(path: Path) -> SQLiteEventStore:
    return SQLiteEventStore(path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)


async def _create_session(store: SQLiteEventStore) -> None:
    await store.create_session(SESSION, [Draft(SESSION_CREATED, {"title": "bench"})])


def check_tether(store: SQLiteEventStore, acked: list[list[int]], events: int) -> None:
    """The log holds exactly seqs 1..events+1, each append was acknowledged with a distinct
    seq in 2..events+1, and each appender saw its own appends in order."""
    total = events + 1
    got = sorted(seq for seqs in acked for seq in seqs)
    if got != list(range(2, total + 1)):
        raise SanityError(f"tether: acknowledged seqs are not exactly 2..{total}")
    for index, seqs in enumerate(acked):
        if seqs != sorted(seqs):
            raise SanityError(f"tether: appender {index} saw its seqs out of order")
    logged = store.read_sync(SESSION)
    if [ev.seq for ev in logged] != list(range(1, total + 1)):
        raise SanityError(f"tether: the log's seqs are not exactly 1..{total}")
    if logged[0].type != SESSION_CREATED or any(ev.type != TEXT_DELTA for ev in logged[1:]):
        raise SanityError("tether: the log holds unexpected event types")
    row = asyncio.run(store.index_state(SESSION))
    if asyncio.run(store.last_seq(SESSION)) != total or row is None or row["last_seq"] != total:
        raise SanityError(f"tether: last_seq / sidebar index is not {total}")


def tether_tasks(path: Path, appenders: int, events: int) -> float:
    """`appenders` asyncio tasks, each awaiting its appends one after the other (the server's
    shape); with one appender this is plain sequential awaits."""

    async def scenario(store: SQLiteEventStore) -> tuple[float, list[list[int]]]:
        await _create_session(store)
        acked: list[list[int]] = [[] for _ in range(appenders)]

        async def appender(index: int, count: int) -> None:
            for _ in range(count):
                for ev in await store.append(SESSION, [DRAFT]):
                    acked[index].append(ev.seq)

        start = time.perf_counter()
        await asyncio.gather(*(appender(i, c) for i, c in enumerate(split(events, appenders))))
        return time.perf_counter() - start, acked

    store = open_store(path)
    try:
        elapsed, acked = asyncio.run(scenario(store))
        check_tether(store, acked, events)
    finally:
        store.close()
    return elapsed


def tether_threads(path: Path, appenders: int, events: int) -> float:
    """`appenders` plain threads blocking on `submit_append` (the runtime callback shape)."""
    store = open_store(path)
    try:
        asyncio.run(_create_session(store))
        acked: list[list[int]] = [[] for _ in range(appenders)]

        def work(index: int, count: int) -> None:
            for _ in range(count):
                acked[index].extend(ev.seq for ev in store.submit_append(SESSION, [DRAFT]).result())

        elapsed = run_threads(split(events, appenders), work)
        check_tether(store, acked, events)
    finally:
        store.close()
    return elapsed


# -- running and reporting --------------------------------------------------------------------

Scenario = tuple[str, str, int, Callable[[Path, int], float]]


def scenarios() -> list[Scenario]:
    n = CONCURRENT
    return [
        ("raw_commit_1", "raw sqlite3, commit per row", 1, lambda p, e: raw_per_commit(p, 1, e)),
        (
            "raw_commit_50",
            "raw sqlite3, commit per row, shared lock",
            n,
            lambda p, e: raw_per_commit(p, n, e),
        ),
        ("raw_batched", "raw sqlite3, one transaction (ceiling)", 1, raw_batched),
        ("tether_1", "tether, sequential awaits", 1, lambda p, e: tether_tasks(p, 1, e)),
        ("tether_50_tasks", "tether, asyncio tasks", n, lambda p, e: tether_tasks(p, n, e)),
        (
            "tether_50_threads",
            "tether, threads + submit_append",
            n,
            lambda p, e: tether_threads(p, n, e),
        ),
    ]


@contextmanager
def scratch_db(base: str | None) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=base) as tmp:
        yield Path(tmp) / "tether.db"


def filesystem_of(path: str) -> str:
    """The filesystem type holding `path` (Linux only): fsync on tmpfs is free, which would
    make every ratio here meaningless."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    real = os.path.realpath(path)
    best, fstype = "", "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


def ratio(num: Result, den: Result) -> float:
    return num.events_per_s / den.events_per_s


def report(results: dict[str, Result], ratios: dict[str, float], header: str) -> str:
    lines = [header, ""]
    lines.append(f"{'scenario':<42} {'appenders':>9} {'events':>7} {'seconds':>8} {'events/s':>9}")
    for r in results.values():
        lines.append(
            f"{r.label:<42} {r.appenders:>9} {r.events:>7} {r.seconds:>8.3f} {r.events_per_s:>9.0f}"
        )
    lines += ["", f"{'ratio':<52} {'value':>7}  target"]
    labels = {
        "tether_over_raw_1": ("tether / raw commit-per-row, 1 appender", ""),
        "tether_over_raw_50": (
            f"tether / raw commit-per-row, {CONCURRENT} appenders (tasks)",
            f">= {TARGET_RATIO}",
        ),
        "tether_threads_over_raw_50": (
            f"tether / raw commit-per-row, {CONCURRENT} appenders (threads)",
            f">= {TARGET_RATIO}",
        ),
        "tether_over_raw_batched_50": (f"tether ({CONCURRENT} tasks) / raw one-transaction", ""),
    }
    for key, value in ratios.items():
        label, target = labels[key]
        verdict = ""
        if target:
            verdict = f"  {'met' if value >= TARGET_RATIO else 'NOT MET'}"
        lines.append(f"{label:<52} {value:>7.2f}  {target}{verdict}".rstrip())
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Append throughput of the Tether event log against raw sqlite3."
    )
    parser.add_argument(
        "--events",
        type=int,
        help=f"events per scenario (default {DEFAULT_EVENTS}; {QUICK_EVENTS} with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="small run for smoke tests")
    parser.add_argument(
        "--repeat",
        type=int,
        help=f"runs per scenario, median reported (default {DEFAULT_REPEAT}; 1 with --quick)",
    )
    parser.add_argument("--dir", help="where the temporary databases go (default: system temp)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    if args.events is None:
        args.events = QUICK_EVENTS if args.quick else DEFAULT_EVENTS
    if args.repeat is None:
        args.repeat = 1 if args.quick else DEFAULT_REPEAT
    if args.events < 1 or args.repeat < 1:
        parser.error("--events and --repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = args.dir or tempfile.gettempdir()
    fstype = filesystem_of(base)
    if fstype in {"tmpfs", "ramfs"}:
        print(f"warning: {base} is on {fstype}; fsync is free there, use --dir", file=sys.stderr)

    results: dict[str, Result] = {}
    try:
        for key, label, appenders, run in scenarios():
            times: list[float] = []
            for _ in range(args.repeat):
                with scratch_db(args.dir) as db:
                    times.append(run(db, args.events))
            results[key] = Result(key, label, appenders, args.events, statistics.median(times))
    except SanityError as exc:
        print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
        return 1

    ratios = {
        "tether_over_raw_1": ratio(results["tether_1"], results["raw_commit_1"]),
        "tether_over_raw_50": ratio(results["tether_50_tasks"], results["raw_commit_50"]),
        "tether_threads_over_raw_50": ratio(results["tether_50_threads"], results["raw_commit_50"]),
        "tether_over_raw_batched_50": ratio(results["tether_50_tasks"], results["raw_batched"]),
    }
    config = {
        "events": args.events,
        "repeat": args.repeat,
        "quick": args.quick,
        "concurrent_appenders": CONCURRENT,
        "dir": base,
        "filesystem": fstype,
        "sqlite": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    header = (
        f"Event-log append throughput: {args.events} events per scenario, median of "
        f"{args.repeat}, {base} ({fstype}), SQLite {config['sqlite']}, "
        f"Python {config['python']}, {config['cpus']} CPUs"
    )
    print(report(results, ratios, header))
    print(f"\nsanity: after every tether run the session's seqs were exactly 1..{args.events + 1}")

    payload = {
        "benchmark": "log_append",
        "config": config,
        "scenarios": [{**asdict(r), "events_per_s": r.events_per_s} for r in results.values()],
        "ratios": ratios,
        "target": {
            "ratio": "tether_over_raw_50",
            "min": TARGET_RATIO,
            "met": ratios["tether_over_raw_50"] >= TARGET_RATIO,
        },
        "sanity": "ok",
    }
    write_results(args.out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
