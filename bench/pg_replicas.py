"""Three `tether serve --database-url` replicas on one PostgreSQL database (issue 17): what a
follower on another replica sees, and what the replicas do under a steady load.

**latency**: 20 runs at once started on replica A, each followed over SSE on replica B; the
model is the suite's fake (tests/fake_openai/) as a real HTTP server in this process,
stamping every delta as it writes it (60 deltas 20 ms apart, bench/stream_latency.py's
method and code). The baseline reads the model directly at the same concurrency; added =
Tether percentile - direct percentile, per delta. A's commit reaches B through the log: the
NOTIFY wake-up, then B's fan-out reads the events back. Target: p99 added < 25 ms.

**load**: 30 sessions (session i created and run on replica i mod 3), each running one turn
after another for `--seconds` (60); 120 SSE subscribers, 4 per session, subscriber k of
session i on replica (i + k) mod 3, all connected from seq 1 before the first run; meanwhile a
poller in a process of its own times `GET /api/sessions` on the replicas in turn. At the end
every subscriber must hold exactly the session's log as the database has it (each seq once,
in order, with its type): 0 lost, 0 duplicated, 0 reordered. Target: `GET /api/sessions`
p99 < 100 ms.

The database is made on the server TETHER_TEST_POSTGRES names (the test suite's; default the
local one) and dropped afterwards. Exit status 1 when a sanity check fails, 2 without a
server.

    python bench/pg_replicas.py                          # both modes, about 2.5 minutes
    python bench/pg_replicas.py --mode load --seconds 20
    python bench/pg_replicas.py --quick                  # smoke test, about 40 s
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit  # first: puts tests/ on sys.path
import httpx
import pg  # tests/pg.py: a throwaway database
from outside_latency import FakeProcess
from stream_latency import TIMEOUT, Bench, SanityError, StampingFake, summarize

REPLICAS = 3
TARGET_LATENCY_P99_MS = 25.0
TARGET_LIST_P99_MS = 100.0
POLL_SECONDS = 0.1  # between two `GET /api/sessions`
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pg_replicas.json"


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


# -- latency: runs on A, followers on B --------------------------------------------------------


def latency(args: argparse.Namespace, url: str, root: Path) -> dict[str, Any]:
    """Followed on B (the target), and on A itself (what the log's commit costs before any
    other replica hears of it), each against its own direct rounds."""
    out: dict[str, Any] = {}
    with StampingFake() as fake, benchkit.replicas(root, REPLICAS, fake.base_url, url) as servers:
        a, b = servers[0], servers[1]
        for where, follower in (("B", b), ("A", a)):
            bench = Bench(fake, a.base_url, args, follow_url=follower.base_url)
            runs = asyncio.run(bench.scenario(args.runs, args.rounds))
            rows = [summarize(p, args.runs, runs[p], fake.emitted) for p in ("direct", "tether")]
            direct, tether = rows
            added = {k: tether[k] - direct[k] for k in ("p50_ms", "p99_ms")}
            out[where] = {"rows": rows, "added": added}
    out["met"] = out["B"]["added"]["p99_ms"] < TARGET_LATENCY_P99_MS
    return out


# -- load: 30 runs, 120 subscribers, the session list ------------------------------------------


class Subscriber:
    """One SSE follower: every (seq, type) it was handed, in arrival order."""

    def __init__(self, sid: str, replica: int) -> None:
        self.sid, self.replica = sid, replica
        self.got: list[tuple[int, str]] = []
        self.connected = asyncio.Event()
        self.finished = 0  # run.finished frames seen
        self.changed = asyncio.Event()
        self.error: str | None = None

    async def follow(self, client: httpx.AsyncClient) -> None:
        kind = ""
        url = f"/api/sessions/{self.sid}/events"
        async with client.stream("GET", url, params={"after": "0"}) as response:
            if response.status_code != 200:
                self.error = f"{url} answered {response.status_code}"
                self.connected.set()
                return
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind not in ("", "heartbeat"):
                    self.got.append((json.loads(line[6:])["seq"], kind))
                    self.connected.set()
                    if kind == "run.finished":
                        self.finished += 1
                        self.changed.set()
                elif line == "":
                    kind = ""


def check(sub: Subscriber, log: list[tuple[int, str]]) -> dict[str, int]:
    """Lost, duplicated and reordered events of one subscriber against the log."""
    seqs = [seq for seq, _ in sub.got]
    logged = dict(log)
    lost = len(set(logged) - set(seqs))
    duplicated = len(seqs) - len(set(seqs))
    reordered = sum(1 for x, y in itertools.pairwise(seqs) if y <= x) - duplicated
    wrong = sum(1 for seq, kind in sub.got if logged.get(seq) != kind)
    return {"lost": lost, "duplicated": duplicated, "reordered": max(0, reordered), "wrong": wrong}


async def drive(client: httpx.AsyncClient, sub: Subscriber, until: float) -> int:
    """Turn after turn in one session until `until`; each next turn once the last finished."""
    turns = 0
    while time.monotonic() < until:
        body = {"session_id": sub.sid, "message": f"turn {turns}"}
        response = await client.post("/api/chat/start", json=body)
        if response.status_code == 409:  # the last run is still unwinding
            await asyncio.sleep(0.05)
            continue
        if response.status_code != 200:
            raise SanityError(f"POST /api/chat/start answered {response.status_code}")
        turns += 1
        while sub.finished < turns:
            sub.changed.clear()
            await asyncio.wait_for(sub.changed.wait(), 60)
    return turns


def poll_list(bases: list[str], seconds: float, go: Any, results: Any) -> None:
    """`GET /api/sessions` on the replicas in turn for `seconds` once `go` is set; the times
    (ms) or an error go to `results`. A process of its own: in the load's process a list's
    answer waited behind 120 subscribers' frames on the same event loop, which counted the
    client's own backlog as the server's latency."""
    clients = [httpx.Client(base_url=b, timeout=TIMEOUT) for b in bases]
    times: list[float] = []
    go.wait()
    until = time.monotonic() + seconds
    try:
        for client in itertools.cycle(clients):
            if time.monotonic() >= until:
                break
            start = time.perf_counter()
            response = client.get("/api/sessions")
            times.append((time.perf_counter() - start) * 1000.0)
            if response.status_code != 200:
                results.put(f"GET /api/sessions answered {response.status_code}")
                return
            time.sleep(POLL_SECONDS)
    except httpx.HTTPError as exc:
        results.put(f"GET /api/sessions failed: {exc!r}")
        return
    results.put(times)


def read_log(url: str) -> dict[str, list[tuple[int, str]]]:
    import psycopg

    out: dict[str, list[tuple[int, str]]] = {}
    with psycopg.connect(url, autocommit=True) as db:
        for sid, seq, kind in db.execute("SELECT session_id, seq, type FROM events ORDER BY id"):
            out.setdefault(sid, []).append((seq, kind))
    return out


async def load_main(args: argparse.Namespace, bases: list[str], url: str) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.subscribers + 64)
    clients = [httpx.AsyncClient(base_url=b, timeout=TIMEOUT, limits=limits) for b in bases]
    try:
        sessions = []
        for i in range(args.load_runs):
            response = await clients[i % REPLICAS].post("/api/sessions", json={"title": f"l{i}"})
            sessions.append(response.json()["session"]["session_id"])
        subs = [
            Subscriber(sessions[n % len(sessions)], (n % len(sessions) + n // len(sessions)) % 3)
            for n in range(args.subscribers)
        ]
        followers = [asyncio.create_task(s.follow(clients[s.replica])) for s in subs]
        await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in subs)), 60)
        errors = [s.error for s in subs if s.error]
        if errors:
            raise SanityError(f"{len(errors)} subscribers could not follow: {errors[0]}")
        context = multiprocessing.get_context("spawn")
        go, results = context.Event(), context.Queue()
        poller = context.Process(
            target=poll_list, args=(bases, args.seconds, go, results), daemon=True
        )
        poller.start()  # its interpreter starts before the load
        await asyncio.to_thread(time.sleep, 2.0)
        until = time.monotonic() + args.seconds
        drivers = [subs[i] for i in range(len(sessions))]  # subscriber i follows session i
        start = time.monotonic()
        go.set()
        driving = (drive(clients[i % REPLICAS], d, until) for i, d in enumerate(drivers))
        turns = await asyncio.gather(*driving)
        elapsed = time.monotonic() - start
        list_ms = await asyncio.to_thread(results.get, True, 60)
        poller.join(10)
        if isinstance(list_ms, str):
            raise SanityError(list_ms)
        log = await asyncio.to_thread(read_log, url)
        deadline = time.monotonic() + 30  # every follower drains to the log's last seq
        while time.monotonic() < deadline and any(
            (s.got[-1][0] if s.got else 0) < log[s.sid][-1][0] for s in subs
        ):
            await asyncio.sleep(0.1)
        failed = [t.exception() for t in followers if t.done() and not t.cancelled()]
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        if any(failed):
            raise SanityError(f"a subscriber failed: {next(e for e in failed if e)!r}")
    finally:
        for client in clients:
            await client.aclose()
    faults = {"lost": 0, "duplicated": 0, "reordered": 0, "wrong": 0}
    for sub in subs:
        for key, value in check(sub, log[sub.sid]).items():
            faults[key] += value
    events = sum(len(v) for v in log.values())
    p99 = benchkit.percentile(list_ms, 99)
    return {
        "seconds": round(elapsed, 1),
        "runs": sum(turns),
        "events": events,
        "delivered": sum(len(s.got) for s in subs),
        "faults": faults,
        "list_requests": len(list_ms),
        "list_p50_ms": benchkit.percentile(list_ms, 50),
        "list_p99_ms": p99,
        "faults_met": not any(faults.values()),
        "list_met": p99 < TARGET_LIST_P99_MS,
    }


def load(args: argparse.Namespace, url: str, root: Path) -> dict[str, Any]:
    fake = FakeProcess(args.deltas, args.interval_ms)
    try:
        streams = ("--max-streams-per-client", str(args.subscribers + 10))  # one address
        with benchkit.replicas(root, REPLICAS, fake.base_url, url, *streams) as servers:
            return asyncio.run(load_main(args, [s.base_url for s in servers], url))
    finally:
        fake.stop()


# -- the report --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("latency", "load", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="smoke test: small and short")
    parser.add_argument("--deltas", type=int, help="deltas per run (60; 15 with --quick)")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="between deltas (20)")
    parser.add_argument("--runs", type=int, default=20, help="latency: runs at once (20)")
    parser.add_argument("--rounds", type=int, help="latency: measured rounds (3; 1 with --quick)")
    parser.add_argument("--load-runs", type=int, default=30, help="load: sessions running (30)")
    parser.add_argument("--subscribers", type=int, default=120, help="load: SSE followers (120)")
    parser.add_argument("--seconds", type=float, help="load: how long (60; 10 with --quick)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    args.deltas = args.deltas or (15 if args.quick else 60)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.seconds = args.seconds or (10.0 if args.quick else 60.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = pg.unavailable()
    if reason is not None:
        print(reason)
        return 2
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    try:
        for mode, fn in (("latency", latency), ("load", load)):
            if args.mode in (mode, "both"):
                name, url = pg.create_database()
                try:
                    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
                        results[mode] = fn(args, url, Path(tmp))
                finally:
                    pg.drop_database(name)
    except (SanityError, RuntimeError, httpx.HTTPError, TimeoutError) as exc:
        print(f"SANITY CHECK FAILED: {exc!r}", file=sys.stderr)
        return 1
    load_after = os.getloadavg()
    print(
        f"{REPLICAS} replicas on one PostgreSQL database; Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (other work on the machine shows up as latency)"
    )
    if "latency" in results:
        r = results["latency"]
        for where in ("A", "B"):
            for row in r[where]["rows"]:
                print(
                    f"  followed on {where}: {row['path']:<7} {row['deltas']:>5} deltas  p50 "
                    f"{row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                    f"({row['events_per_run']:.1f} events/run)"
                )
        same = r["A"]["added"]
        print(
            f"  (informational) followed on A itself: added p50 {same['p50_ms']:.2f} ms, "
            f"p99 {same['p99_ms']:.2f} ms"
        )
        added = r["B"]["added"]
        print(
            f"latency: {args.runs} runs on A, followed on B, {args.deltas} deltas "
            f"{args.interval_ms:g} ms apart: added p50 {added['p50_ms']:.2f} ms, p99 "
            f"{added['p99_ms']:.2f} ms; target p99 < {TARGET_LATENCY_P99_MS:g} ms: "
            f"{verdict(r['met'])}"
        )
    if "load" in results:
        r = results["load"]
        f = r["faults"]
        print(
            f"  {r['runs']} runs in {r['seconds']} s, {r['events']} events logged, "
            f"{r['delivered']} frames delivered to {args.subscribers} subscribers"
        )
        print(
            f"load: {args.load_runs} sessions running, {args.subscribers} subscribers over "
            f"{REPLICAS} replicas: lost {f['lost']}, duplicated {f['duplicated']}, reordered "
            f"{f['reordered']}, wrong type {f['wrong']}; target 0 of each: "
            f"{verdict(r['faults_met'])}"
        )
        print(
            f"load: GET /api/sessions during the load ({r['list_requests']} requests): p50 "
            f"{r['list_p50_ms']:.1f} ms, p99 {r['list_p99_ms']:.1f} ms; target p99 < "
            f"{TARGET_LIST_P99_MS:g} ms: {verdict(r['list_met'])}"
        )
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    benchkit.write_results(
        args.out,
        {
            "benchmark": "pg_replicas",
            "config": config,
            "machine": {"cpus": os.cpu_count(), "load_before": load_before, "after": load_after},
            "results": results,
        },
    )
    faults = results.get("load", {}).get("faults_met", True)
    return 0 if faults else 1


if __name__ == "__main__":
    sys.exit(main())
