"""Resume cost: a client that reconnects pays for what it missed, not for the session's length.

What is measured: the wall time for an SSE client to resume a session stream with
`GET /api/sessions/{id}/events?after=<last_seq - 100>` and receive the 100 missing events,
up to and including `seq == last_seq`, from a 20,000-event session and from a 1,000-event
session, on one `tether serve` subprocess over real HTTP. The timer starts before the request
is sent (so it includes the TCP connect and the server's handling of the cursor) and stops
when the frame with the last seq has been read. The target (from the issue): the median for
the 20,000-event session is within 2x of the median for the 1,000-event session. Tether reads
the missing events by `(session_id, seq)` through the log's unique index, page by page, so
the expected ratio is about 1.

How the sessions are built: straight into the log, before the server starts, with the real
`SQLiteEventStore` (sidebar fold and index included), so 20,000 events take a second instead
of 20,000 requests: seq 1 is `session.created`, then `session.updated` title changes appended
in atomic batches of 500. Both sessions live in the same database, the two sizes are measured
alternately (after a few unmeasured warm-up resumes), and each resume must deliver exactly
the seqs `last_seq - 99 .. last_seq`, each once and in order, or the script exits with
status 1.

    python bench/resume_cost.py            # full run, a few seconds
    python bench/resume_cost.py --quick    # a few seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchkit import write_results  # noqa: E402 - puts tests/ on sys.path

from tether.events import SESSION_CREATED, SESSION_UPDATED
from tether.log import Draft
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

from helpers import ServerProcess  # noqa: E402

SMALL = 1_000
LARGE = 20_000
MISSING = 100
BATCH = 500
DEFAULT_REPEAT = 20
QUICK_REPEAT = 5
WARMUP = 3
TARGET_RATIO = 2.0
RESUME_TIMEOUT = 20.0  # seconds; a resume that takes longer is a failure, not a timing
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "resume_cost.json"


class SanityError(Exception):
    """A resume did not deliver exactly the missing events."""


# -- building the sessions --------------------------------------------------------------------


def session_id(events: int) -> str:
    return f"bench_{events}"


async def _fill(store: SQLiteEventStore, sid: str, events: int) -> None:
    await store.create_session(sid, [Draft(SESSION_CREATED, {"title": "x"})])
    seq = 1
    while seq < events:
        count = min(BATCH, events - seq)
        drafts = [Draft(SESSION_UPDATED, {"title": f"t{seq + i + 1}"}) for i in range(count)]
        await store.append(sid, drafts)
        seq += count


def build(db_path: Path, sizes: list[int]) -> dict[str, int]:
    """One session of each size (total events, seq 1 included); returns {session_id: last_seq}."""
    store = SQLiteEventStore(db_path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)
    try:
        for events in sizes:
            asyncio.run(_fill(store, session_id(events), events))
        last = {session_id(n): asyncio.run(store.last_seq(session_id(n))) for n in sizes}
    finally:
        store.close()
    for events in sizes:
        if last[session_id(events)] != events:
            raise SanityError(f"built {last[session_id(events)]} events instead of {events}")
    return last  # type: ignore[return-value]


# -- one resume -------------------------------------------------------------------------------


def resume(client: httpx.Client, sid: str, last_seq: int, missing: int) -> float:
    """Seconds from sending the request until the frame with `last_seq` was read."""
    after = last_seq - missing
    got: list[int] = []
    start = time.perf_counter()
    with client.stream("GET", f"/api/sessions/{sid}/events", params={"after": str(after)}) as r:
        if r.status_code != 200:
            raise SanityError(f"{sid}: events stream answered {r.status_code}")
        for line in r.iter_lines():  # heartbeats arrive every 5 s even when nothing else does
            if time.perf_counter() - start > RESUME_TIMEOUT:
                raise SanityError(
                    f"{sid}: seq {last_seq} did not arrive within "
                    f"{RESUME_TIMEOUT:g} s ({len(got)} frames)"
                )
            if line.startswith("id: "):
                seq = int(line[4:])
                got.append(seq)
                if seq >= last_seq:
                    break
            elif line.startswith("event: session.snapshot"):
                raise SanityError(f"{sid}: a valid cursor {after} got a snapshot")
    elapsed = time.perf_counter() - start
    if got != list(range(after + 1, last_seq + 1)):
        raise SanityError(
            f"{sid}: expected seqs {after + 1}..{last_seq} once each, got {len(got)} frames "
            f"({len(set(got))} distinct)"
        )
    return elapsed


def measure(
    base_url: str, last: dict[str, int], sizes: list[int], repeat: int, missing: int
) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for i in range(WARMUP + repeat):
            order = sizes if i % 2 == 0 else list(reversed(sizes))
            for n in order:
                sid = session_id(n)
                elapsed = resume(client, sid, last[sid], missing)
                if i >= WARMUP:
                    times[n].append(elapsed)
    return times


# -- reporting --------------------------------------------------------------------------------


def summarize(events: int, samples: list[float], missing: int) -> dict[str, Any]:
    ms = sorted(v * 1000.0 for v in samples)
    return {
        "session_events": events,
        "missing": missing,
        "repeat": len(ms),
        "median_ms": statistics.median(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "mean_ms": statistics.mean(ms),
    }


def report(rows: list[dict[str, Any]], ratio: float, header: str) -> str:
    lines = [header, ""]
    lines.append(
        f"{'session events':>14} {'missing':>8} {'repeat':>7} {'median ms':>10} "
        f"{'min ms':>8} {'max ms':>8}"
    )
    for r in rows:
        lines.append(
            f"{r['session_events']:>14,} {r['missing']:>8} {r['repeat']:>7} "
            f"{r['median_ms']:>10.2f} {r['min_ms']:>8.2f} {r['max_ms']:>8.2f}"
        )
    verdict = "MET" if ratio <= TARGET_RATIO else "NOT MET"
    small, large = rows[0]["session_events"], rows[1]["session_events"]
    lines += [
        "",
        f"{'ratio':<44} {'value':>6}  target",
        f"{f'median {large:,} / median {small:,}':<44} {ratio:>6.2f}  "
        f"<= {TARGET_RATIO:g}  {verdict}",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time to resume the last events of a long session against a short one."
    )
    parser.add_argument("--quick", action="store_true", help="small run for smoke tests")
    parser.add_argument(
        "--repeat",
        type=int,
        help=f"measured resumes per session, median reported (default {DEFAULT_REPEAT}; "
        f"{QUICK_REPEAT} with --quick)",
    )
    parser.add_argument(
        "--missing", type=int, default=MISSING, help=f"events missing at resume (default {MISSING})"
    )
    parser.add_argument(
        "--small", type=int, default=SMALL, help=f"events in the short session (default {SMALL})"
    )
    parser.add_argument(
        "--large", type=int, default=LARGE, help=f"events in the long session (default {LARGE})"
    )
    parser.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = QUICK_REPEAT if args.quick else DEFAULT_REPEAT
    if args.repeat < 1 or args.missing < 1:
        parser.error("--repeat and --missing must be at least 1")
    if not args.missing < args.small < args.large:
        parser.error("need --missing < --small < --large")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [args.small, args.large]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        server = ServerProcess(data_dir, "--heartbeat-seconds", "5")  # the default
        try:
            t0 = time.perf_counter()
            last = build(data_dir / "tether.db", sizes)
            build_seconds = time.perf_counter() - t0
            server.start()
            times = measure(server.base_url, last, sizes, args.repeat, args.missing)
        except (SanityError, RuntimeError) as exc:
            print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
    elapsed = time.monotonic() - started

    rows = [summarize(n, times[n], args.missing) for n in sizes]
    ratio = rows[1]["median_ms"] / rows[0]["median_ms"]
    config = {
        "small": args.small,
        "large": args.large,
        "missing": args.missing,
        "repeat": args.repeat,
        "warmup": WARMUP,
        "quick": args.quick,
        "dir": args.dir or tempfile.gettempdir(),
        "sqlite": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "build_seconds": round(build_seconds, 2),
        "seconds": round(elapsed, 1),
    }
    header = (
        f"Resume cost: the last {args.missing} events over SSE, median of {args.repeat} "
        f"(after {WARMUP} warm-ups), sizes measured alternately; SQLite {config['sqlite']}, "
        f"Python {config['python']}, {config['cpus']} CPUs"
    )
    print(report(rows, ratio, header))
    print(
        f"\nsanity: every resume delivered exactly seqs last_seq-{args.missing - 1}..last_seq "
        f"in order, no snapshot (sessions built in {build_seconds:.1f} s, {elapsed:.0f} s "
        "in all)"
    )

    payload = {
        "benchmark": "resume_cost",
        "config": config,
        "sessions": rows,
        "ratio": ratio,
        "target": {
            "ratio": "large_median / small_median",
            "max": TARGET_RATIO,
            "met": ratio <= TARGET_RATIO,
        },
        "sanity": "ok",
    }
    write_results(args.out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
