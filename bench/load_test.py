"""Load test: 50 concurrent runs and 200 SSE subscribers for 60 s on one `tether serve`.

What is checked and measured (bounded, loopback only):

- **Zero lost or duplicated events.** Every SSE subscriber (4 per session, connected from
  the start with `?after=0`) must receive exactly the seqs `1..last_seq` of its session, in
  order, where `last_seq` is what `GET /api/session` reports once every run has finished.
  Anything else exits with status 1.
- **Ordinary requests do not stall behind the streams** (contract invariant 7): a prober
  issues `GET /api/sessions` and `GET /api/session` (a random session) every ~50 ms for the
  whole load window; the target is p99 < 100 ms for each. An idle baseline of the same probes
  is taken before the load starts. A missed target is printed as NOT MET, exit status 0.
- **Bounded memory:** the server's VmRSS (`/proc/<pid>/status`) every 250 ms: at start, peak,
  end, and per 10 s slice.
- **Throughput:** events appended per second (growth of the sessions' `last_seq` over the
  load window) and events delivered per second (frames received by all subscribers).
- **Event latency:** for every delivered event, arrival time minus the envelope's `at` (the
  server's `time.time()` when it appended the event; same machine, same clock): p50/p99.
  This includes the durable commit (fsync), the fan-out, the SSE encoding and the client.

How the load is made: the fake model (`tests/fake_openai/`) runs in a thread of this
process; its default reply streams a few reasoning deltas and then text deltas with a small
delay between them (`--deltas` x `--interval-ms`, default 40 x 25 ms, about 1.2 s per reply).
`tether serve --runtime openai` runs as a subprocess on a free loopback port with a temporary
data directory. Each session has a driver that starts a turn (`POST /api/chat/start`), waits
for its `run.finished` on the session's SSE stream and starts the next one, until the deadline
(`--seconds`); then the drivers stop starting turns and the runs in flight finish.

The client side (fake model, 200 SSE readers, 50 drivers, the prober) and the server share the
machine's cores. To tell which side is the bottleneck the script samples the CPU time of the
server process (its event-loop thread and its other threads) and of this process (the fake
model's thread, the prober's thread and the main event loop) and the lag of the client event
loops; all of that is printed with the results. The prober has its own thread and event loop
so that busy SSE readers do not delay its requests (they still share the GIL).

This file is the command line; the parts are `load_traffic.py` (fake model, subscribers,
drivers, prober), `load_run.py` (one run and its resource sampling) and `load_report.py`
(the delivery check, the figures and the printed report).

    python bench/load_test.py            # 50 runs, 200 subscribers, 60 s: about 70 s in all
    python bench/load_test.py --quick    # 10 runs, 40 subscribers, 10 s: about 15 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import httpx
from benchkit import write_results  # noqa: E402 - puts tests/ on sys.path
from load_report import check_delivery, report, summarize
from load_run import load
from load_traffic import LoadFake, SanityError, default_reply

from helpers import ServerProcess  # noqa: E402

DEFAULT_SECONDS = 60.0
DEFAULT_RUNS = 50
DEFAULT_SUBSCRIBERS = 200
QUICK_SECONDS = 10.0
QUICK_RUNS = 10
QUICK_SUBSCRIBERS = 40
DEFAULT_DELTAS = 40
DEFAULT_REASONING_DELTAS = 5
DEFAULT_INTERVAL_MS = 25.0
DEFAULT_PROBE_MS = 50.0
DEFAULT_BASELINE_SECONDS = 2.0
QUICK_BASELINE_SECONDS = 1.0
TARGET_P99_MS = 100.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "load_test.json"

MODEL = "fake-model"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Concurrent runs and SSE subscribers against one tether serve: delivery, "
        "latency, memory."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_RUNS} runs, {QUICK_SUBSCRIBERS} subscribers, "
        f"{QUICK_SECONDS:g} s: for smoke tests",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        help=f"load duration (default {DEFAULT_SECONDS:g}; {QUICK_SECONDS:g} with --quick)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        help=f"concurrent runs = sessions (default {DEFAULT_RUNS}; {QUICK_RUNS} with --quick)",
    )
    parser.add_argument(
        "--subscribers",
        type=int,
        help=f"SSE subscribers, spread over the sessions (default "
        f"{DEFAULT_SUBSCRIBERS}; {QUICK_SUBSCRIBERS} with --quick)",
    )
    parser.add_argument(
        "--deltas",
        type=int,
        default=DEFAULT_DELTAS,
        help=f"text deltas per model reply (default {DEFAULT_DELTAS})",
    )
    parser.add_argument(
        "--reasoning-deltas",
        type=int,
        default=DEFAULT_REASONING_DELTAS,
        help=f"reasoning deltas before the text (default {DEFAULT_REASONING_DELTAS})",
    )
    parser.add_argument(
        "--interval-ms",
        type=float,
        default=DEFAULT_INTERVAL_MS,
        help=f"delay between deltas (default {DEFAULT_INTERVAL_MS:g})",
    )
    parser.add_argument(
        "--probe-ms",
        type=float,
        default=DEFAULT_PROBE_MS,
        help=f"prober period (default {DEFAULT_PROBE_MS:g})",
    )
    parser.add_argument(
        "--baseline-seconds",
        type=float,
        help=f"idle probing before the load (default "
        f"{DEFAULT_BASELINE_SECONDS:g}; {QUICK_BASELINE_SECONDS:g} with "
        "--quick)",
    )
    parser.add_argument(
        "--target-ms",
        type=float,
        default=TARGET_P99_MS,
        help=f"p99 target of the two GETs (default {TARGET_P99_MS:g})",
    )
    parser.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = QUICK_SECONDS if args.quick else DEFAULT_SECONDS
    if args.runs is None:
        args.runs = QUICK_RUNS if args.quick else DEFAULT_RUNS
    if args.subscribers is None:
        args.subscribers = QUICK_SUBSCRIBERS if args.quick else DEFAULT_SUBSCRIBERS
    if args.baseline_seconds is None:
        args.baseline_seconds = QUICK_BASELINE_SECONDS if args.quick else DEFAULT_BASELINE_SECONDS
    if args.runs < 1 or args.subscribers < args.runs:
        parser.error("--runs must be at least 1 and --subscribers at least --runs")
    if args.seconds <= 0 or args.deltas < 1 or args.reasoning_deltas < 0:
        parser.error("--seconds and --deltas must be positive")
    if args.interval_ms < 0 or args.probe_ms <= 0 or args.baseline_seconds < 0:
        parser.error("--interval-ms, --probe-ms and --baseline-seconds must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    cpus = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    if load_before > cpus / 2:
        print(
            f"warning: load average {load_before:.2f} on {cpus} CPUs: other work on this "
            "machine shows up as latency",
            file=sys.stderr,
        )
    with (
        tempfile.TemporaryDirectory(prefix="tether-load-", dir=args.dir) as tmp,
        LoadFake(model=MODEL) as fake,
    ):
        fake.default_reply = default_reply(
            args.deltas, args.reasoning_deltas, args.interval_ms / 1000.0
        )
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        server = ServerProcess(
            data_dir,
            "--runtime",
            "openai",
            "--base-url",
            fake.base_url,
            "--model",
            MODEL,
            "--heartbeat-seconds",
            "5",  # the default; the test helper's 0.3 s is for tests
            # every subscriber comes from this one loopback address
            "--max-streams-per-client",
            str(args.subscribers + 10),
            env={"OPENAI_API_KEY": "load-test"},
        )
        try:
            server.start()
            assert server.proc is not None
            outcome = asyncio.run(load(args, server.base_url, server.proc.pid, fake))
            if server.proc.poll() is not None:
                raise SanityError(f"the server exited with {server.proc.returncode}")
        except (SanityError, RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            traceback.print_exc()
            print(f"LOAD TEST FAILED: {exc!r}", file=sys.stderr)
            tail = server.log()[-3000:]
            if tail:
                print(f"server log (tail):\n{tail}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
        server_log = server.log()
    elapsed = time.monotonic() - started

    delivery = check_delivery(outcome)
    summary = summarize(outcome, args)
    targets = {}
    for path in ("/api/sessions", "/api/session"):
        p99 = summary["probes"][f"load {path}"]["p99_ms"]
        targets[f"GET {path} under load"] = {
            "p99_ms": p99,
            "max_ms": args.target_ms,
            "met": p99 < args.target_ms,
        }
    config = {
        "seconds": args.seconds,
        "runs": args.runs,
        "subscribers": args.subscribers,
        "deltas": args.deltas,
        "reasoning_deltas": args.reasoning_deltas,
        "interval_ms": args.interval_ms,
        "probe_ms": args.probe_ms,
        "baseline_seconds": args.baseline_seconds,
        "quick": args.quick,
        "dir": args.dir or tempfile.gettempdir(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": cpus,
        "loadavg_1min_before": round(load_before, 2),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "total_seconds": round(elapsed, 1),
    }
    header = (
        f"Load test: {args.runs} concurrent runs, {args.subscribers} SSE subscribers, "
        f"{args.seconds:g} s; model replies of {args.reasoning_deltas} reasoning + "
        f"{args.deltas} text deltas every {args.interval_ms:g} ms; Python {config['python']}, "
        f"{cpus} CPUs shared by the server and this client, load average {load_before:.2f} "
        "before"
    )
    print(report(summary, delivery, targets, header))
    errors_in_log = [line for line in server_log.splitlines() if " ERROR " in line]
    if errors_in_log:
        print(f"\nserver log: {len(errors_in_log)} ERROR lines, first: {errors_in_log[0][:300]}")

    payload = {
        "benchmark": "load_test",
        "config": config,
        "results": summary,
        "delivery": delivery,
        "targets": targets,
        "server_log_errors": len(errors_in_log),
        "sanity": "ok" if delivery["ok"] else "failed",
    }
    write_results(args.out, payload)
    if not delivery["ok"]:
        print("SANITY CHECK FAILED: events were lost or duplicated:", file=sys.stderr)
        for problem in delivery["problems"]:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(
        f"sanity: every subscriber received exactly 1..last_seq of its session, in order "
        f"({elapsed:.0f} s in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
