"""What one batch costs the PostgreSQL log's writer: a single appender, one event per batch,
against a raw psycopg INSERT committed on its own (autocommit), on the same server.

Why: runs streaming at once hand their deltas to the writer a little apart, so its batches
are small (about four events each with 20 runs under `pg_replicas.py`), and each batch's
own cost, not the per-event one, is what a delta waits for. `pg_append.py` measures full
batches; this measures the fixed part: the writer's statements (BEGIN, the counter row's
locking SELECT, the events' INSERT with the counter row's UPDATE, COMMIT), its pipeline and
the folds, with the fan-out attached as `tether serve` opens the log. The baseline is the
cheapest durable write of one row: one statement in its own transaction, one round trip.
Both commit every event (`synchronous_commit=on`), so both wait for the same WAL flush.
Figures: wall time per append (median of the rounds' medians) and the process's CPU time
per append; the two sides alternate, and swap which goes first from round to round.

    python bench/pg_batch_cost.py            # 2000 appends per round, 3 rounds each
    python bench/pg_batch_cost.py --quick    # 200 appends, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import benchkit  # first: puts tests/ on sys.path
import pg  # tests/pg.py: a throwaway database per round
import psycopg

from tether.events import SESSION_CREATED, TEXT_DELTA
from tether.log import Draft, Hub
from tether.log.pg_schema import apply_migrations
from tether.log.postgres import PostgresEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pg_batch_cost.json"
WARM_UP = 50
DATA = {"stream_id": None, "item_id": "t1", "text": "The quick brown fox " * 3}
INSERT = (
    "INSERT INTO events (session_id, seq, type, at, stream_id, turn_id, data) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


async def _timed(append, count: int) -> tuple[list[float], float]:  # noqa: ANN001
    """(wall seconds of each append, process CPU seconds per append)."""
    for n in range(WARM_UP):
        await append(n)
    walls = []
    cpu = time.process_time()
    for n in range(WARM_UP, WARM_UP + count):
        start = time.perf_counter()
        await append(n)
        walls.append(time.perf_counter() - start)
    return walls, (time.process_time() - cpu) / count


async def tether_round(url: str, count: int) -> tuple[list[float], float]:
    store = PostgresEventStore(  # opened as served: folds, search rows, the fan-out
        url,
        index_fold=fold_row,
        index_version=SIDEBAR_FOLD_VERSION,
        search_fold=search_change,
        search_version=SEARCH_FOLD_VERSION,
    )
    store.attach_hub(Hub(asyncio.get_running_loop()))
    await store.wait_listening()
    await store.create_session("s0", [Draft(SESSION_CREATED, {"title": "bench"})])
    try:
        return await _timed(lambda n: store.append("s0", [Draft(TEXT_DELTA, DATA)]), count)
    finally:
        await store.aclose()


async def raw_round(url: str, count: int) -> tuple[list[float], float]:
    with psycopg.connect(url, autocommit=True) as db:
        apply_migrations(db)
    payload = json.dumps(DATA, separators=(",", ":"))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def append(n: int) -> None:
            await conn.execute(INSERT, ("s0", n + 1, TEXT_DELTA, time.time(), None, None, payload))

        return await _timed(append, count)


def one_round(kind: str, count: int) -> tuple[list[float], float]:
    name, url = pg.create_database()
    try:
        return asyncio.run((tether_round if kind == "tether" else raw_round)(url, count))
    finally:
        pg.drop_database(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, help="appends per round (2000; 200 quick)")
    parser.add_argument("--rounds", type=int, help="rounds of each, alternating (3; 1 quick)")
    parser.add_argument("--quick", action="store_true", help="small and short")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args()
    count = args.appends or (200 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    reason = pg.unavailable()
    if reason is not None:
        print(reason)
        return 2
    got: dict[str, list[tuple[float, float]]] = {"raw": [], "tether": []}
    for round_ in range(rounds):
        for kind in ("raw", "tether") if round_ % 2 == 0 else ("tether", "raw"):
            walls, cpu = one_round(kind, count)
            got[kind].append((statistics.median(walls), cpu))
    figures = {
        kind: {
            "wall_ms": statistics.median(w for w, _ in rows) * 1000,
            "cpu_ms": statistics.median(c for _, c in rows) * 1000,
        }
        for kind, rows in got.items()
    }
    print(f"{'one event per batch':<36} {'wall ms':>8} {'cpu ms':>7}")
    for kind, label in (
        ("raw", "raw psycopg, one INSERT, autocommit"),
        ("tether", "tether append"),
    ):
        f = figures[kind]
        print(f"{label:<36} {f['wall_ms']:>8.3f} {f['cpu_ms']:>7.3f}")
    ratio = figures["tether"]["wall_ms"] / figures["raw"]["wall_ms"]
    print(f"tether / raw, wall per append: {ratio:.2f}x (information: no target)")
    benchkit.write_results(
        args.out,
        {"appends": count, "rounds": rounds, "figures": figures, "ratio": ratio},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
