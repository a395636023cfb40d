"""Branch switch cost: showing another branch of a 200-turn session costs at most 2x reading it.

What is measured: the wall time of `POST /api/session/branch` (which appends one
`branch.switched` and answers with the whole `GET /api/session` body) against the wall time
of `GET /api/session` of the same session, on one `tether serve` subprocess over real HTTP.
The session has 200 turns (400 rows, each answer about 1,200 characters with a tool call) on
one branch, and a second branch that starts at the first answer (a regenerated answer), so a
switch to the long branch rebuilds the whole visible transcript: the worst case. The target
(issue 16): the median switch to the long branch is within 2x of the median GET with the
long branch shown. Switches back to the short branch are timed too and reported.

How the session is built: straight into the log, before the server starts, with the real
`SQLiteEventStore` (sidebar fold and index included), as the server writes turns: per turn
`turn.submitted`, `run.started`, a tool call, text deltas and `run.finished`; then the fork
(`transcript.truncated` and a regenerated `turn.submitted`, its run). Measured in rounds after
unmeasured warm-ups: GET (long branch shown), switch to the short branch, switch back to the
long one. Each answer is checked: the rows shown and their `branch` labels, or the script
exits with status 1.

    python bench/branch_switch.py            # median of 30 rounds
    python bench/branch_switch.py --quick    # median of 5, for smoke tests
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

from tether import events as ev
from tether.log import Draft
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

from helpers import ServerProcess  # noqa: E402

SID = "bench_branches"
TURNS = 200
DEFAULT_REPEAT = 30
QUICK_REPEAT = 5
WARMUP = 3
TARGET_RATIO = 2.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "branch_switch.json"


class SanityError(Exception):
    """An answer did not show the branch asked for."""


def _run(turn: int, stream: str, turn_id: str, regenerate: bool = False) -> list[Draft]:
    submitted: dict[str, Any] = {
        "turn_id": turn_id,
        "stream_id": stream,
        "text": "" if regenerate else f"Question {turn}: " + "what about this? " * 10,
        "attachments": [],
        "submitted_at": 1000.0 + turn,
    }
    if regenerate:
        submitted.update(regenerate=True, regenerate_of=None)
    say = f"Answer {turn}. " + "A sentence of a plausible answer, in words. " * 27
    return [
        Draft(ev.TURN_SUBMITTED, submitted, stream_id=stream, turn_id=turn_id),
        Draft(ev.RUN_STARTED, {"stream_id": stream, "turn_id": turn_id, "runtime": "demo"}),
        Draft(ev.TEXT_DELTA, {"stream_id": stream, "item_id": "t0", "text": "Looking. "}),
        Draft(
            ev.TOOL_STARTED,
            {"stream_id": stream, "call_id": "c1", "name": "read_file", "args": {"p": turn}},
        ),
        Draft(
            ev.TOOL_COMPLETED,
            {
                "stream_id": stream,
                "call_id": "c1",
                "name": "read_file",
                "result_preview": "x" * 200,
                "is_error": False,
                "duration_ms": 3,
            },
        ),
        *[
            Draft(ev.TEXT_DELTA, {"stream_id": stream, "item_id": "t1", "text": say[i : i + 200]})
            for i in range(0, len(say), 200)
        ],
        Draft(ev.RUN_FINISHED, {"stream_id": stream, "turn_id": turn_id, "state": "completed"}),
    ]


async def _fill(store: SQLiteEventStore, turns: int) -> None:
    await store.create_session(SID, [Draft(ev.SESSION_CREATED, {"title": "branches"})])
    for turn in range(turns):
        await store.append(SID, _run(turn, f"r{turn}", f"u{turn}"))
    fork = Draft(ev.TRANSCRIPT_TRUNCATED, {"keep_count": 1, "transcript_generation": 1})
    await store.append(SID, [fork, *_run(0, "r_again", "u0", regenerate=True)])


def build(db_path: Path, turns: int) -> None:
    store = SQLiteEventStore(db_path, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)
    try:
        asyncio.run(_fill(store, turns))
    finally:
        store.close()


def check(session: dict[str, Any], rows: int, index: int) -> None:
    messages = session["messages"]
    if len(messages) != rows or messages[1].get("branch") != {"index": index, "count": 2}:
        raise SanityError(
            f"expected {rows} rows with branch {index}/2 at row 1, got {len(messages)} rows, "
            f"{messages[1].get('branch') if len(messages) > 1 else None}"
        )


def measure(base_url: str, turns: int, repeat: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"get": [], "to_long": [], "to_short": []}
    long_rows = 2 * turns

    def switch(client: httpx.Client, index: int) -> tuple[float, dict[str, Any]]:
        """Branch `index` of the fork at row 1 (the visible row there: r0 or r_again)."""
        shown = "r_again" if index == 1 else "r0"
        start = time.perf_counter()
        r = client.post(
            "/api/session/branch", json={"session_id": SID, "row_id": shown, "index": index}
        )
        elapsed = time.perf_counter() - start
        if r.status_code != 200:
            raise SanityError(f"switch answered {r.status_code}: {r.text[:200]}")
        return elapsed, r.json()["session"]

    with httpx.Client(base_url=base_url, timeout=30) as client:
        # The regenerated answer is shown after the build: show the long branch first.
        r = client.post(
            "/api/session/branch", json={"session_id": SID, "row_id": "r_again", "index": 1}
        )
        if r.status_code != 200:
            raise SanityError(f"first switch answered {r.status_code}: {r.text[:200]}")
        for i in range(WARMUP + repeat):
            start = time.perf_counter()
            r = client.get("/api/session", params={"session_id": SID})
            got = time.perf_counter() - start
            check(r.json()["session"], long_rows, 1)
            short, body = switch(client, 2)
            check(body, 2, 2)
            long, body = switch(client, 1)
            check(body, long_rows, 1)
            if i >= WARMUP:
                times["get"].append(got)
                times["to_short"].append(short)
                times["to_long"].append(long)
    return times


def summarize(name: str, samples: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000.0 for v in samples)
    return {
        "request": name,
        "repeat": len(ms),
        "median_ms": statistics.median(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "mean_ms": statistics.mean(ms),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small run for smoke tests")
    parser.add_argument("--repeat", type=int, help=f"rounds (default {DEFAULT_REPEAT})")
    parser.add_argument("--turns", type=int, default=TURNS, help=f"turns (default {TURNS})")
    parser.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    repeat = args.repeat or (QUICK_REPEAT if args.quick else DEFAULT_REPEAT)
    if repeat < 1 or args.turns < 2:
        parser.error("--repeat must be at least 1 and --turns at least 2")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        server = ServerProcess(data_dir, "--heartbeat-seconds", "5")
        try:
            build(data_dir / "tether.db", args.turns)
            server.start()
            times = measure(server.base_url, args.turns, repeat)
        except (SanityError, RuntimeError) as exc:
            print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
    rows = [summarize(name, times[name]) for name in ("get", "to_long", "to_short")]
    ratio = rows[1]["median_ms"] / rows[0]["median_ms"]
    config = {
        "turns": args.turns,
        "repeat": repeat,
        "warmup": WARMUP,
        "sqlite": sqlite3.sqlite_version,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        f"Branch switch: a {args.turns}-turn session, median of {repeat} rounds (after "
        f"{WARMUP} warm-ups); SQLite {config['sqlite']}, Python {config['python']}, "
        f"{config['cpus']} CPUs\n"
    )
    labels = {
        "get": f"GET /api/session ({2 * args.turns} rows)",
        "to_long": f"switch to the long branch ({2 * args.turns} rows)",
        "to_short": "switch to the short branch (2 rows)",
    }
    print(f"{'request':<44} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    for r in rows:
        print(
            f"{labels[r['request']]:<44} {r['median_ms']:>10.2f} {r['min_ms']:>8.2f} "
            f"{r['max_ms']:>8.2f}"
        )
    verdict = "MET" if ratio <= TARGET_RATIO else "NOT MET"
    print(f"\n{'ratio':<44} {'value':>10}  target")
    print(
        f"{'median switch to long / median GET':<44} {ratio:>10.2f}  <= {TARGET_RATIO:g}  {verdict}"
    )
    print("\nsanity: every answer showed the branch asked for, with its rows and labels")
    write_results(
        args.out,
        {
            "benchmark": "branch_switch",
            "config": config,
            "requests": rows,
            "ratio": ratio,
            "target": {
                "ratio": "to_long_median / get_median",
                "max": TARGET_RATIO,
                "met": ratio <= TARGET_RATIO,
            },
            "sanity": "ok",
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
