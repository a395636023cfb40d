"""Server-added latency per streamed delta: fake model -> Tether -> SSE client, p50 and p99.

What is measured: for every text delta, the time from the moment the model server writes it
to the moment a client holds it, once through Tether (`tether serve --runtime openai` in a
subprocess, read from `GET /api/sessions/{id}/events`) and once straight from the model (a
streaming `POST /v1/chat/completions` to the fake). The difference of the two distributions
is what Tether adds: the OpenAI SDK's parsing, the run engine's inbox and coalescing window,
the durable append (WAL, synchronous=FULL: an fsync per flush, grouped across runs), the
fan-out hub and the SSE encoding.

How the emission time is known exactly: the fake model (`tests/fake_openai/`) runs in this
process, in a thread. Its scripted replies here are `Stamp, text, delay, Stamp, text, ...`;
the fake hands any step it does not know to its `_control` hook, which the small subclass
below overrides to record `time.monotonic()` for each `Stamp` just before the next text chunk
is written to the socket. Clients run in this process too, so arrival and emission times are
read from the same monotonic clock and no drift of the delay schedule enters the figures.

Every delta's text is a marker `<r:k>` (reply r, delta k). Tether may coalesce deltas (several
markers in one `text.delta` event); each marker is attributed to the arrival of the event that
holds it, so coalescing counts as latency, as a reader sees it. The fake serves replies in
request order, so which reply a session got is read from its markers; each run must show all
markers of exactly one reply, each once and in order, or the script exits with status 1.

Scenarios, each at 1 run and at `--concurrency` (20) runs started at once (20 sessions, each
with its own SSE subscriber that is connected before the run starts); the direct baseline
uses the same concurrency, so the harness's own contention (one Python process hosts the fake
and all clients) is in both paths. The replies are scripted alike, so concurrent runs emit in
step, as from a batching inference server: the worst case for one server process. Rounds of
the two paths alternate. Reported `added` = tether percentile - direct percentile; the target
is p99 added < 25 ms at 20 runs. Everything here is CPU-bound, so the share of the machine's
CPU that other processes used meanwhile is printed (Linux) and warned about above 5%.

    python bench/stream_latency.py            # full run, about 45 s on 2 cores
    python bench/stream_latency.py --quick    # a few seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from benchkit import (  # noqa: E402 - puts tests/ on sys.path
    MODEL,
    machine_busy_ticks,
    model_server,
    percentile,
    write_results,
)

from fake_openai import FakeOpenAI, Reply, delay, reply, text  # noqa: E402

DEFAULT_DELTAS = 60
QUICK_DELTAS = 15
DEFAULT_INTERVAL_MS = 20.0
DEFAULT_CONCURRENCY = 20
DEFAULT_SINGLE_ROUNDS = 10
DEFAULT_CONCURRENT_ROUNDS = 4
QUICK_SINGLE_ROUNDS = 2
QUICK_CONCURRENT_ROUNDS = 1
TARGET_P99_ADDED_MS = 25.0
FOREIGN_WARN = 0.05  # share of the machine's CPU used by other processes worth a warning
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "stream_latency.json"

MARKER = re.compile(r"<(\d+):(\d+)>")
MARKERS_ONLY = re.compile(r"(?:<\d+:\d+>)+")
TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class SanityError(Exception):
    """A run did not deliver exactly the deltas the model sent."""


# -- the fake model, stamping each delta as it is written -------------------------------------


@dataclass(frozen=True)
class Stamp:
    """A control step: record when the next chunk (delta k of reply r) is written."""

    reply_id: int
    index: int


class StampingFake(FakeOpenAI):
    """The test suite's fake, plus emission times: `emitted[(r, k)] = time.monotonic()`."""

    def __init__(self) -> None:
        super().__init__(model=MODEL)
        self.emitted: dict[tuple[int, int], float] = {}
        self.default_reply = reply(text("unexpected extra request"))

    async def _control(self, step: Any) -> None:
        if isinstance(step, Stamp):
            self.emitted[(step.reply_id, step.index)] = time.monotonic()
            return
        await super()._control(step)


def scripted_reply(reply_id: int, deltas: int, interval: float) -> Reply:
    steps: list[Any] = []
    for k in range(deltas):
        if k:
            steps.append(delay(interval))
        steps += [Stamp(reply_id, k), text(f"<{reply_id}:{k}>")]
    return reply(*steps)


# -- one run, as a client sees it -------------------------------------------------------------


@dataclass
class RunResult:
    reply_id: int = -1
    events: int = 0  # delivered delta-carrying events (SSE frames or model chunks)
    arrivals: list[tuple[int, int, float]] = field(default_factory=list)  # (r, k, monotonic)


def take_markers(run: RunResult, chunk: str, now: float, where: str) -> None:
    if not MARKERS_ONLY.fullmatch(chunk):
        raise SanityError(f"{where}: unexpected delta text {chunk!r}")
    run.events += 1
    for match in MARKER.finditer(chunk):
        run.arrivals.append((int(match[1]), int(match[2]), now))


def check_run(run: RunResult, deltas: int, where: str) -> None:
    reply_ids = {r for r, _, _ in run.arrivals}
    if len(reply_ids) != 1:
        raise SanityError(f"{where}: markers of {len(reply_ids)} replies in one run")
    run.reply_id = reply_ids.pop()
    got = [k for _, k, _ in run.arrivals]
    if got != list(range(deltas)):
        raise SanityError(
            f"{where}: expected markers 0..{deltas - 1} once each in order, got {len(got)} "
            f"({len(set(got))} distinct)"
        )


def latencies(runs: list[RunResult], emitted: dict[tuple[int, int], float]) -> list[float]:
    out = []
    for run in runs:
        for r, k, arrived in run.arrivals:
            if (r, k) not in emitted:
                raise SanityError(f"marker <{r}:{k}> arrived but was never emitted")
            value = arrived - emitted[(r, k)]
            if value < 0:
                raise SanityError(f"marker <{r}:{k}> arrived before it was emitted")
            out.append(value)
    return out


async def direct_run(client: httpx.AsyncClient, url: str, deltas: int) -> RunResult:
    """Read the fake's stream straight: the model's own delivery."""
    run = RunResult()
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "bench"}]}
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise SanityError(f"direct: fake answered {response.status_code}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.monotonic()
            payload = line[6:]
            if payload == "[DONE]":
                break
            for choice in json.loads(payload).get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    take_markers(run, content, now, "direct")
    check_run(run, deltas, "direct")
    return run


async def tether_run(
    client: httpx.AsyncClient, session_id: str, ready: asyncio.Event, deltas: int
) -> RunResult:
    """Follow a fresh session's SSE stream until its run finishes. `ready` is set once the
    replay of seq 1 arrived, i.e. once the server has subscribed this reader to the live tail."""
    run = RunResult()
    last_seq = 0
    event_type = ""
    finished = False
    url = f"/api/sessions/{session_id}/events"
    async with client.stream("GET", url, params={"after": "0"}) as response:
        if response.status_code != 200:
            raise SanityError(f"tether: events stream answered {response.status_code}")
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event_type = line[7:]
            elif line.startswith("data: "):
                now = time.monotonic()
                if event_type in ("heartbeat", ""):
                    continue
                envelope = json.loads(line[6:])
                seq = envelope["seq"]
                if seq != last_seq + 1:
                    raise SanityError(f"tether: seq {seq} after {last_seq} in {session_id}")
                last_seq = seq
                if seq == 1:
                    ready.set()
                if event_type == "text.delta":
                    take_markers(run, envelope["data"]["text"], now, "tether")
                elif event_type == "run.finished":
                    state = envelope["data"].get("state")
                    if state != "completed":
                        raise SanityError(f"tether: run ended {state!r}: {envelope['data']}")
                    finished = True
                    break
            elif line == "":
                event_type = ""
    if not finished:
        raise SanityError(f"tether: the stream of {session_id} ended before run.finished")
    check_run(run, deltas, "tether")
    return run


# -- rounds -----------------------------------------------------------------------------------


class Bench:
    """Rounds of runs started on `server_url`, each followed over SSE on `follow_url` (the
    same server unless another replica is named: bench/pg_replicas.py)."""

    def __init__(
        self,
        fake: StampingFake,
        server_url: str,
        args: argparse.Namespace,
        follow_url: str | None = None,
    ) -> None:
        self.fake = fake
        self.server_url = server_url
        self.follow_url = follow_url or server_url
        self.deltas = args.deltas
        self.interval = args.interval_ms / 1000.0
        self.ids = itertools.count()

    def script(self, runs: int) -> set[int]:
        ids = [next(self.ids) for _ in range(runs)]
        self.fake.script(*(scripted_reply(r, self.deltas, self.interval) for r in ids))
        return set(ids)

    def check_round(self, runs: list[RunResult], expected: set[int], requests: int) -> None:
        if {run.reply_id for run in runs} != expected or len(runs) != len(expected):
            raise SanityError("the runs did not receive one scripted reply each")
        if self.fake.pending or self.fake.requests_count != requests + len(expected):
            raise SanityError(
                f"the fake served {self.fake.requests_count - requests} requests for "
                f"{len(expected)} runs ({self.fake.pending} scripted replies left)"
            )

    async def direct_round(self, client: httpx.AsyncClient, runs: int) -> list[RunResult]:
        expected, requests = self.script(runs), self.fake.requests_count
        url = self.fake.base_url + "/chat/completions"
        results = await asyncio.gather(*(direct_run(client, url, self.deltas) for _ in range(runs)))
        self.check_round(results, expected, requests)
        return results

    async def tether_round(
        self, client: httpx.AsyncClient, runs: int, follow: httpx.AsyncClient | None = None
    ) -> list[RunResult]:
        expected, requests = self.script(runs), self.fake.requests_count
        follow = follow or client
        sessions = []
        for _ in range(runs):
            response = await client.post("/api/sessions", json={"title": "bench"})
            if response.status_code != 201:
                raise SanityError(f"POST /api/sessions answered {response.status_code}")
            sessions.append(response.json()["session"]["session_id"])
        ready = [asyncio.Event() for _ in sessions]
        readers = [
            asyncio.create_task(tether_run(follow, sid, ev, self.deltas))
            for sid, ev in zip(sessions, ready, strict=True)
        ]
        try:
            waiting = asyncio.gather(*(ev.wait() for ev in ready))
            done, _ = await asyncio.wait(
                [*readers, waiting], timeout=20, return_when=asyncio.FIRST_COMPLETED
            )
            if waiting not in done:
                waiting.cancel()
                for task in done:
                    task.result()  # a reader failed before the start: raise its error
                raise SanityError("the SSE readers did not connect within 20 s")

            async def start(session_id: str) -> None:
                response = await client.post(
                    "/api/chat/start", json={"session_id": session_id, "message": "bench"}
                )
                if response.status_code != 200:
                    raise SanityError(
                        f"POST /api/chat/start answered {response.status_code}: {response.text}"
                    )

            await asyncio.gather(*(start(sid) for sid in sessions))
            results = await asyncio.wait_for(asyncio.gather(*readers), timeout=120)
        finally:
            for task in readers:
                task.cancel()
        self.check_round(results, expected, requests)
        return results

    async def scenario(self, runs: int, rounds: int) -> dict[str, list[RunResult]]:
        """Warm up both paths once, then alternate measured direct and tether rounds."""
        limits = httpx.Limits(max_connections=4 * runs + 8, max_keepalive_connections=4 * runs)
        out: dict[str, list[RunResult]] = {"direct": [], "tether": []}
        async with (
            httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as direct,
            httpx.AsyncClient(base_url=self.server_url, timeout=TIMEOUT, limits=limits) as tether,
            httpx.AsyncClient(base_url=self.follow_url, timeout=TIMEOUT, limits=limits) as follow,
        ):
            await self.direct_round(direct, runs)
            await self.tether_round(tether, runs, follow)
            for _ in range(rounds):
                out["direct"] += await self.direct_round(direct, runs)
                out["tether"] += await self.tether_round(tether, runs, follow)
        return out


# -- other work on the machine ----------------------------------------------------------------


def _process_ticks(pid: int) -> int | None:
    """CPU ticks (user + system, all threads) used by process `pid` so far (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


class ForeignCpu:
    """The share of the machine's CPU that neither this process (fake model and clients) nor
    the server used while measuring: other work, which would show up as latency."""

    def __init__(self, server_pid: int) -> None:
        self.pids = (os.getpid(), server_pid)
        self.start = self._sample()

    def _sample(self) -> tuple[float, int | None, list[int | None]]:
        return time.monotonic(), machine_busy_ticks(), [_process_ticks(p) for p in self.pids]

    def share(self) -> float | None:
        (t0, busy0, own0), (t1, busy1, own1) = self.start, self._sample()
        if busy0 is None or busy1 is None or None in own0 or None in own1 or t1 <= t0:
            return None
        ours = sum(b - a for a, b in zip(own0, own1, strict=True))  # type: ignore[operator]
        capacity = (t1 - t0) * (os.cpu_count() or 1) * os.sysconf("SC_CLK_TCK")
        return max(0.0, (busy1 - busy0 - ours) / capacity)


# -- statistics and reporting -----------------------------------------------------------------


def summarize(
    path: str, concurrency: int, runs: list[RunResult], emitted: dict[tuple[int, int], float]
) -> dict[str, Any]:
    ms = [v * 1000.0 for v in latencies(runs, emitted)]
    events = [run.events for run in runs]
    rounds = [runs[i : i + concurrency] for i in range(0, len(runs), concurrency)]
    round_p99 = [
        percentile([v * 1000.0 for v in latencies(chunk, emitted)], 99) for chunk in rounds
    ]
    return {
        "path": path,
        "concurrency": concurrency,
        "runs": len(runs),
        "deltas": len(ms),
        "events": sum(events),
        "events_per_run": statistics.mean(events),
        "events_per_run_min": min(events),
        "events_per_run_max": max(events),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "mean_ms": statistics.mean(ms),
        "round_p99_ms": round_p99,  # the noise: p99 of each measured round on its own
    }


def report(
    rows: list[dict[str, Any]], added: dict[str, dict[str, float]], header: str, deltas: int
) -> str:
    lines = [header, ""]
    lines.append(
        f"{'path':<8} {'concurrent':>10} {'runs':>5} {'deltas':>7} {'events/run':>11} "
        f"{'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}"
    )
    for r in rows:
        lines.append(
            f"{r['path']:<8} {r['concurrency']:>10} {r['runs']:>5} {r['deltas']:>7} "
            f"{r['events_per_run']:>11.1f} {r['p50_ms']:>7.2f} {r['p90_ms']:>7.2f} "
            f"{r['p99_ms']:>7.2f} {r['max_ms']:>7.2f}"
        )
    lines += [
        "",
        f"(the model sent {deltas} deltas per run; events/run below that means "
        "Tether coalesced some)",
    ]
    for r in rows:
        if len(r["round_p99_ms"]) > 1 and r["concurrency"] > 1:
            spread = ", ".join(f"{v:.1f}" for v in r["round_p99_ms"])
            lines.append(f"p99 of each {r['concurrency']}-run round, {r['path']}: {spread} ms")
    lines.append("")
    lines.append(f"{'added by tether (tether - direct)':<40} {'p50 ms':>7} {'p99 ms':>7}  target")
    for key, value in added.items():
        target = ""
        if key == "concurrent":
            verdict = "MET" if value["p99_ms"] < TARGET_P99_ADDED_MS else "NOT MET"
            target = f"p99 < {TARGET_P99_ADDED_MS:g} ms  {verdict}"
        label = f"{value['concurrency']} run{'s' if value['concurrency'] > 1 else ''}"
        lines.append(
            f"{label:<40} {value['p50_ms']:>7.2f} {value['p99_ms']:>7.2f}  {target}".rstrip()
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Latency Tether adds to each streamed delta, against the model's own."
    )
    parser.add_argument("--quick", action="store_true", help="small run for smoke tests")
    parser.add_argument(
        "--deltas",
        type=int,
        help=f"deltas per run (default {DEFAULT_DELTAS}; {QUICK_DELTAS} with --quick)",
    )
    parser.add_argument(
        "--interval-ms",
        type=float,
        default=DEFAULT_INTERVAL_MS,
        help=f"delay between deltas (default {DEFAULT_INTERVAL_MS:g})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"runs started at once in the concurrent scenario (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--single-rounds",
        type=int,
        help=f"measured rounds of 1 run per path (default {DEFAULT_SINGLE_ROUNDS}; "
        f"{QUICK_SINGLE_ROUNDS} with --quick)",
    )
    parser.add_argument(
        "--concurrent-rounds",
        type=int,
        help=f"measured rounds of --concurrency runs per path (default "
        f"{DEFAULT_CONCURRENT_ROUNDS}; {QUICK_CONCURRENT_ROUNDS} with --quick)",
    )
    parser.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    if args.deltas is None:
        args.deltas = QUICK_DELTAS if args.quick else DEFAULT_DELTAS
    if args.single_rounds is None:
        args.single_rounds = QUICK_SINGLE_ROUNDS if args.quick else DEFAULT_SINGLE_ROUNDS
    if args.concurrent_rounds is None:
        args.concurrent_rounds = (
            QUICK_CONCURRENT_ROUNDS if args.quick else DEFAULT_CONCURRENT_ROUNDS
        )
    if min(args.deltas, args.concurrency, args.single_rounds, args.concurrent_rounds) < 1:
        parser.error("--deltas, --concurrency and the round counts must be at least 1")
    if args.interval_ms < 0:
        parser.error("--interval-ms must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    cpus = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    foreign: float | None = None
    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp,
        StampingFake() as fake,
    ):
        server = model_server(Path(tmp) / "data", fake.base_url)
        try:
            server.start()
            assert server.proc is not None
            watch = ForeignCpu(server.proc.pid)
            bench = Bench(fake, server.base_url, args)
            for concurrency, rounds in (
                (1, args.single_rounds),
                (args.concurrency, args.concurrent_rounds),
            ):
                runs = asyncio.run(bench.scenario(concurrency, rounds))
                for path in ("direct", "tether"):
                    rows.append(summarize(path, concurrency, runs[path], fake.emitted))
            foreign = watch.share()
        except (SanityError, RuntimeError) as exc:
            print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
    elapsed = time.monotonic() - started

    by = {(r["path"], r["concurrency"]): r for r in rows}
    added = {}
    for key, concurrency in (("single", 1), ("concurrent", args.concurrency)):
        direct, tether = by[("direct", concurrency)], by[("tether", concurrency)]
        added[key] = {
            "concurrency": concurrency,
            "p50_ms": tether["p50_ms"] - direct["p50_ms"],
            "p99_ms": tether["p99_ms"] - direct["p99_ms"],
        }
    met = added["concurrent"]["p99_ms"] < TARGET_P99_ADDED_MS
    config = {
        "deltas_per_run": args.deltas,
        "interval_ms": args.interval_ms,
        "concurrency": args.concurrency,
        "single_rounds": args.single_rounds,
        "concurrent_rounds": args.concurrent_rounds,
        "quick": args.quick,
        "dir": args.dir or tempfile.gettempdir(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": cpus,
        "foreign_cpu_share": None if foreign is None else round(foreign, 3),
        "seconds": round(elapsed, 1),
    }
    header = (
        f"Streamed-delta latency, model write -> client: {args.deltas} deltas per run every "
        f"{args.interval_ms:g} ms; 1 run x {args.single_rounds} rounds, {args.concurrency} runs "
        f"x {args.concurrent_rounds} rounds per path; Python {config['python']}, {cpus} CPUs"
    )
    print(report(rows, added, header, args.deltas))
    if foreign is not None:
        print(f"\nother processes used {foreign:.0%} of the machine's CPU while measuring")
        if foreign > FOREIGN_WARN:
            print(
                f"warning: other work on this machine ({foreign:.0%} of its CPU) shows up as "
                "latency here; rerun on an idle machine",
                file=sys.stderr,
            )
    print(
        f"\nsanity: every run delivered its {args.deltas} markers exactly once, in order, and "
        f"every Tether stream had gap-free seqs ({elapsed:.0f} s in all)"
    )

    payload = {
        "benchmark": "stream_latency",
        "config": config,
        "scenarios": rows,
        "added": added,
        "target": {
            "metric": "added p99 at concurrency",
            "max_ms": TARGET_P99_ADDED_MS,
            "value_ms": added["concurrent"]["p99_ms"],
            "met": met,
        },
        "sanity": "ok",
    }
    write_results(args.out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
