"""Append throughput of the PostgreSQL log: Tether with 50 appenders across 3 replicas against a
raw psycopg insert loop with the same durability and batching, on the same server.

Why these numbers: every event Tether acknowledges is durable (COMMIT with the default
`synchronous_commit=on`, a WAL flush per transaction), so the cost that matters is commits.
Each Tether replica groups whatever its appenders queued into one transaction (group commit).
The fair baseline does the same with none of Tether's work: three connections (the
"replicas"), each draining its queue of rows into one `executemany` and one COMMIT, with seqs
handed out in memory, so no counter row is locked, no index folded, no NOTIFY sent and no
other replica's events read back. Tether does all of that: it locks the session's counter
row (the three replicas take turns on it when they share one session), folds the sidebar row
and the search rows (as `tether serve` opens the log), notifies, and every replica's fan-out
reads what the others wrote. The target (issue 17): at
50 appenders across 3 replicas, Tether reaches at least 0.5x the raw group-commit loop, with
one session per appender (50 runs each write their own session). With all 50 on one session
the three replicas take turns on its counter row, which each holds until its commit's WAL
flush: that row is what keeps the seqs contiguous, so that figure is printed as the cost of
contention, with no target.
A raw loop committing every row on its own is printed too, to show what grouping buys.

Every scenario appends the same number of `text.delta` events into a fresh database (the real
schema, from `tether.log.pg_schema`), created on the server TETHER_TEST_POSTGRES names (the
test suite's; default the local one) and dropped afterwards. After each Tether run the
sessions' seqs must be exactly 1..N, or the script exits with status 1.

    python bench/pg_append.py            # full run, about a minute on 2 cores
    python bench/pg_append.py --quick    # a few seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import benchkit  # first: puts tests/ on sys.path
import pg  # tests/pg.py: a throwaway database per scenario
import psycopg

from tether.events import SESSION_CREATED, TEXT_DELTA
from tether.log import Draft, Hub
from tether.log.pg_schema import apply_migrations
from tether.log.postgres import PostgresEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change

DEFAULT_EVENTS = 5000
DEFAULT_REPEAT = 3
QUICK_EVENTS = 600
APPENDERS = 50
REPLICAS = 3
TARGET_RATIO = 0.5
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pg_append.json"

DATA: dict[str, Any] = {"stream_id": None, "item_id": "t1", "text": "The quick brown fox " * 3}
DRAFT = Draft(TEXT_DELTA, DATA)
INSERT = (
    "INSERT INTO events (session_id, seq, type, at, stream_id, turn_id, data) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s)"
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


def split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def fresh_schema(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        apply_migrations(db)


def check_seqs(url: str, sessions: dict[str, int]) -> None:
    with psycopg.connect(url, autocommit=True) as db:
        for sid, count in sessions.items():
            rows = db.execute("SELECT seq FROM events WHERE session_id=%s ORDER BY id", (sid,))
            if [seq for (seq,) in rows] != list(range(1, count + 1)):
                raise SanityError(f"{sid}: the seqs are not exactly 1..{count}")


# -- one replica: a child process ---------------------------------------------------------------
#
# Each replica is its own process, as in a deployment (on one event loop the three would
# share one core's worth of Python). The parent starts REPLICAS children, waits until each is
# connected and ready, releases them together and times from then until the last is done.


def _replica(kind: str, url: str, replica: int, counts: list[int], sessions: int, ready, go, out):  # noqa: ANN001
    asyncio.run(_replica_main(kind, url, replica, counts, sessions, ready, go, out))


async def _replica_main(kind, url, replica, counts, sessions, ready, go, out) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    if kind == "tether":
        store = PostgresEventStore(  # folds as served: the sidebar row and the search rows
            url,
            index_fold=fold_row,
            index_version=SIDEBAR_FOLD_VERSION,
            replica_id=f"r{replica}",
            search_fold=search_change,
            search_version=SEARCH_FOLD_VERSION,
        )
        store.attach_hub(Hub(loop))  # the fan-out reads the other replicas' events, as served
        await store.wait_listening()
        await store.last_seq("s0")  # the pool is open

        async def append_one(index: int) -> None:
            await store.append(f"s{index % sessions}", [DRAFT])

        async def close() -> None:
            await store.aclose()

    else:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        queue: asyncio.Queue = asyncio.Queue()
        grouped = kind == "raw_grouped"

        async def committer() -> None:
            while True:
                batch = [await queue.get()]
                while grouped and not queue.empty():
                    batch.append(queue.get_nowait())
                async with conn.transaction(), conn.cursor() as cur:
                    await cur.executemany(INSERT, [row for row, _ in batch])
                for _, done in batch:
                    done.set_result(None)

        task = loop.create_task(committer())
        seqs = iter(range(replica * 10_000_000 + 1, (replica + 1) * 10_000_000))

        async def append_one(index: int) -> None:
            done = loop.create_future()
            row = ("bench", next(seqs), TEXT_DELTA, time.time(), None, None, _dumps(DATA))
            queue.put_nowait((row, done))
            await done

        async def close() -> None:
            task.cancel()
            await conn.close()

    async def appender(index: int, count: int) -> None:
        for _ in range(count):
            await append_one(index)

    ready.set()
    await loop.run_in_executor(None, go.wait)
    await asyncio.gather(*(appender(i, c) for i, c in counts))
    out.put(time.perf_counter())
    await close()


def scenario(kind: str, url: str, events: int, sessions: int) -> float:
    fresh_schema(url)
    if kind == "tether":

        async def create() -> None:
            store = PostgresEventStore(
                url,
                index_fold=fold_row,
                index_version=SIDEBAR_FOLD_VERSION,
                search_fold=search_change,
                search_version=SEARCH_FOLD_VERSION,
            )
            for n in range(sessions):
                await store.create_session(f"s{n}", [Draft(SESSION_CREATED, {"title": "bench"})])
            await store.aclose()

        asyncio.run(create())
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    counts = list(enumerate(split(events, APPENDERS)))  # appender i on replica i % REPLICAS
    children = []
    readies = []
    for replica in range(REPLICAS):
        ready = ctx.Event()
        mine = [(i, c) for i, c in counts if i % REPLICAS == replica]
        child = ctx.Process(
            target=_replica, args=(kind, url, replica, mine, sessions, ready, go, out)
        )
        child.start()
        children.append(child)
        readies.append(ready)
    try:
        for ready in readies:
            if not ready.wait(60):
                raise SanityError("a replica did not start")
        start = time.perf_counter()
        go.set()
        ends = [out.get(timeout=600) for _ in children]
        for child in children:
            child.join(30)
            if child.exitcode != 0:
                raise SanityError(f"a replica exited with {child.exitcode}")
    finally:  # a replica that failed or hangs must not keep the script (and the database)
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(5)
    elapsed = max(ends) - start
    if kind == "tether":
        expected = {f"s{n}": 1 for n in range(sessions)}
        for index, count in counts:
            expected[f"s{index % sessions}"] += count
        check_seqs(url, expected)
    else:
        with psycopg.connect(url, autocommit=True) as db:
            (rows,) = db.execute("SELECT count(*) FROM events").fetchone() or (0,)
        if rows != events:
            raise SanityError(f"raw baseline: {rows} rows, not {events}")
    return elapsed


SCENARIOS: list[tuple[str, str, Callable[[str, int], float]]] = [
    ("raw_per_row", "raw psycopg, commit per row", lambda u, n: scenario("raw_per_row", u, n, 1)),
    (
        "raw_grouped",
        "raw psycopg, group commit (baseline)",
        lambda u, n: scenario("raw_grouped", u, n, 1),
    ),
    ("tether_one", "tether, one session", lambda u, n: scenario("tether", u, n, 1)),
    ("tether_many", "tether, 50 sessions", lambda u, n: scenario("tether", u, n, APPENDERS)),
]


def run_one(fn: Callable[[str, int], float], events: int) -> float:
    name, url = pg.create_database()
    try:
        return fn(url, events)
    finally:
        pg.drop_database(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, help=f"events per scenario ({DEFAULT_EVENTS})")
    parser.add_argument("--repeat", type=int, help=f"runs per scenario ({DEFAULT_REPEAT})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS} events, 1 run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args()
    events = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    repeat = args.repeat or (1 if args.quick else DEFAULT_REPEAT)
    reason = pg.unavailable()
    if reason is not None:
        print(reason)
        return 2
    results: list[Result] = []
    try:
        for key, label, fn in SCENARIOS:
            times = [run_one(fn, events) for _ in range(repeat)]
            results.append(Result(key, label, APPENDERS, events, statistics.median(times)))
    except SanityError as exc:
        print(f"SANITY CHECK FAILED: {exc}")
        return 1
    print(f"{'scenario':<42} {'appenders':>9} {'events':>7} {'seconds':>8} {'events/s':>9}")
    for r in results:
        print(
            f"{r.label:<42} {r.appenders:>9} {r.events:>7} {r.seconds:>8.3f} {r.events_per_s:>9.0f}"
        )
    by_key = {r.key: r for r in results}
    base = by_key["raw_grouped"].events_per_s
    ratios = {
        k: by_key[k].events_per_s / base for k in ("tether_one", "tether_many", "raw_per_row")
    }
    for key, ratio in ratios.items():
        print(f"{by_key[key].label} / raw group commit: {ratio:.2f}x")
    passed = ratios["tether_many"] >= TARGET_RATIO
    print(
        f"target (50 sessions, one per appender, as 50 runs write) tether / raw group commit "
        f">= {TARGET_RATIO}: {'met' if passed else 'NOT met'}; one session is informational "
        "(the replicas take turns on its counter row, held through each commit's WAL flush)"
    )
    benchkit.write_results(
        args.out,
        {
            "machine": {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
            },
            "events": events,
            "repeat": repeat,
            "results": [asdict(r) | {"events_per_s": r.events_per_s} for r in results],
            "ratios": ratios,
            "target": TARGET_RATIO,
            "met": passed,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
