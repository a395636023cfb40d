"""Latency added per streamed delta as clients unlike the bench's own see it.

`bench/stream_latency.py` measures with one asyncio client that shares its process with the
fake model. Here the same deltas (20 runs at once, 60 deltas each, 20 ms apart, every delta
stamped by the model just before it is written) are read by two other kinds of client:

- **threads**: one OS thread per stream, each with its own blocking `httpx.Client` (the way a
  script or a test harness typically reads SSE). Baseline: the same threads reading the model
  directly (`POST /v1/chat/completions`).
- **chromium**: Debian's Chromium through Playwright: `--tabs` (5) of the 20 runs are read by a
  tab of the real page (`/s/<id>`), each in its own browser context (its own connection pool:
  HTTP/1.1 allows six connections per origin per profile), the other runs by thread readers,
  so the machine does not also host 20 renderers (`--tabs 20` does); the page's own
  `EventSource` carries the deltas. A wrapper installed
  before the page's scripts notes when each `text.delta` message is dispatched, before the
  page renders it. Baseline: the same tabs reading the model directly with `fetch` (a tab on
  the model's origin, since `EventSource` cannot POST). The thread readers beside the tabs are
  measured too (`threads beside chromium`, no target): a delay both see is the server's or
  the machine's, one only the tabs see is the browser's.

The fake model runs in its own process here (the clients' threads and tabs would otherwise
compete with it for one GIL), stamping deltas with `time.monotonic()`; the clients note
arrivals on the same clock (CLOCK_MONOTONIC is system-wide; the browser's epoch times are
converted with an offset measured once). Added = Tether percentile - baseline percentile,
per client, over all deltas of the measured rounds; the target is p99 added < 25 ms.

    python bench/outside_latency.py                 # 3 measured rounds per path and client
    python bench/outside_latency.py --quick         # 1 round, 10 runs x 15 deltas
    python bench/outside_latency.py --clients threads
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from benchkit import (  # noqa: E402 - tests/ on path
    MODEL,
    machine_busy_ticks,
    model_server,
    percentile,
    write_results,
)
from stream_latency import MARKER, MARKERS_ONLY, StampingFake, scripted_reply

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "outside_latency.json"
TARGET_P99_ADDED_MS = 25.0
SETTLE_SECONDS = 0.5
BESIDE = "threads beside "  # the thread readers of a Chromium round: no target of their own


class SanityError(Exception):
    pass


# -- the fake model in a child process --------------------------------------------------------


class AutoFake(StampingFake):
    """Every request gets the next stamped reply: request i streams markers <i:0>..<i:n-1>."""

    def __init__(self, deltas: int, interval: float) -> None:
        super().__init__()
        self.ids = itertools.count()
        self.deltas, self.interval = deltas, interval

    def _next_reply(self) -> Any:
        return scripted_reply(next(self.ids), self.deltas, self.interval)


def fake_child(deltas: int, interval_ms: float) -> int:
    """Serve until stdin closes; `dump` prints the emission stamps as JSON."""
    with AutoFake(deltas, interval_ms / 1000.0) as fake:
        print(fake.base_url, flush=True)
        for line in sys.stdin:
            if line.strip() == "dump":
                stamps = {f"{r}:{k}": t for (r, k), t in fake.emitted.items()}
                print(json.dumps(stamps), flush=True)
    return 0


class FakeProcess:
    def __init__(self, deltas: int, interval_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--fake-child", str(deltas), str(interval_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the fake model did not start")

    def stamps(self) -> dict[tuple[int, int], float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        raw = json.loads(self.proc.stdout.readline())
        return {(int(k.split(":")[0]), int(k.split(":")[1])): v for k, v in raw.items()}

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


# -- samples ----------------------------------------------------------------------------------

Arrivals = list[tuple[str, float]]  # (delta-carrying text, monotonic arrival)


def markers(arrivals: Arrivals, deltas: int, where: str) -> list[tuple[int, int, float]]:
    """Each marker with its arrival; exactly one reply's markers 0..deltas-1, in order."""
    out = []
    for chunk, at in arrivals:
        if not MARKERS_ONLY.fullmatch(chunk):
            raise SanityError(f"{where}: unexpected delta text {chunk!r}")
        out += [(int(m[1]), int(m[2]), at) for m in MARKER.finditer(chunk)]
    replies = {r for r, _, _ in out}
    if len(replies) != 1 or [k for _, k, _ in out] != list(range(deltas)):
        raise SanityError(f"{where}: not one reply's {deltas} markers once each, in order")
    return out


def latencies_ms(runs: list[Arrivals], stamps: dict, deltas: int, where: str) -> list[float]:
    values = []
    for run in runs:
        for r, k, at in markers(run, deltas, where):
            values.append((at - stamps[(r, k)]) * 1000.0)
    return values


# -- the thread-per-stream client -------------------------------------------------------------


def thread_direct(url: str) -> Arrivals:
    arrivals: Arrivals = []
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "b"}]}
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.monotonic()
                for choice in json.loads(line[6:]).get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        arrivals.append((content, now))
    return arrivals


def thread_tether(base: str, sid: str, ready: threading.Event) -> Arrivals:
    arrivals: Arrivals = []
    kind = ""
    with (
        httpx.Client(base_url=base, timeout=60) as client,
        client.stream("GET", f"/api/sessions/{sid}/events", params={"after": "0"}) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                now = time.monotonic()
                if kind == "session.created":
                    ready.set()
                elif kind == "text.delta":
                    arrivals.append((json.loads(line[6:])["data"]["text"], now))
                elif kind == "run.finished":
                    break
    return arrivals


def new_sessions(base: str, n: int) -> list[str]:
    with httpx.Client(base_url=base) as client:
        return [
            client.post("/api/sessions", json={}).json()["session"]["session_id"] for _ in range(n)
        ]


def start_runs(base: str, sessions: list[str], pool: concurrent.futures.Executor) -> None:
    def start(sid: str) -> None:
        deadline = time.monotonic() + 10
        with httpx.Client(base_url=base, timeout=30) as client:
            while True:
                r = client.post("/api/chat/start", json={"session_id": sid, "message": "bench"})
                if r.status_code == 200:
                    return
                if r.status_code != 409 or time.monotonic() > deadline:  # busy: unwinding
                    raise SanityError(f"POST /api/chat/start answered {r.status_code}")
                time.sleep(0.02)

    list(pool.map(start, sessions))


def threads_round(base: str, fake_url: str, runs: int) -> tuple[list[Arrivals], list[Arrivals]]:
    with concurrent.futures.ThreadPoolExecutor(2 * runs) as pool:
        url = fake_url + "/chat/completions"
        direct = list(pool.map(lambda _: thread_direct(url), range(runs)))
        sessions = new_sessions(base, runs)
        ready = [threading.Event() for _ in sessions]
        readers = [
            pool.submit(thread_tether, base, s, e) for s, e in zip(sessions, ready, strict=True)
        ]
        for event in ready:
            if not event.wait(20):
                raise SanityError("a thread reader did not connect")
        start_runs(base, sessions, pool)
        tether = [f.result(120) for f in readers]
    return direct, tether


# -- Chromium ---------------------------------------------------------------------------------

WRAP_EVENTSOURCE = """
(() => {
  const Native = window.EventSource;
  window.__arrivals = []; window.__open = false; window.__finished = false;
  const now = () => performance.timeOrigin + performance.now();
  window.EventSource = class extends Native {
    constructor(url, init) {
      super(url, init);
      this.addEventListener("open", () => { window.__open = true; });
      this.addEventListener("text.delta", (e) => window.__arrivals.push([e.data, now()]));
      this.addEventListener("run.finished", () => { window.__finished = true; });
    }
  };
})();
"""

FETCH_DIRECT = """
async (url) => {
  window.__direct = null;
  const res = await fetch(url, {method: "POST", headers: {"content-type": "application/json"},
    body: JSON.stringify({model: "fake-model", stream: true,
                          messages: [{role: "user", content: "b"}]})});
  const reader = res.body.getReader(); const dec = new TextDecoder(); let buf = "";
  const got = [];
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    const t = performance.timeOrigin + performance.now();
    buf += dec.decode(value, {stream: true});
    const lines = buf.split("\\n"); buf = lines.pop();
    for (const line of lines) if (line.startsWith("data: {")) {
      for (const c of JSON.parse(line.slice(6)).choices || [])
        if (c.delta && c.delta.content) got.push([c.delta.content, t]);
    }
  }
  window.__direct = got;
}
"""


def wait_all(pages: list[Any], expr: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for page in pages:
        while not page.evaluate(expr):
            if time.monotonic() > deadline:
                raise SanityError(f"timed out waiting for {expr}")
            time.sleep(0.05)


def chromium_rounds(
    base: str, fake_url: str, runs: int, tabs: int, rounds: int, warmup: int
) -> tuple[list[Arrivals], list[Arrivals], list[Arrivals], list[Arrivals]]:
    """`tabs` of the `runs` streams are read by Chromium tabs, the others by thread readers,
    so that 20 runs at once need not mean 20 renderers on the cores the server uses (`--tabs
    20` reads them all in the browser). Returns the tabs' direct and Tether arrivals, then
    the thread readers' beside them: what those see in the same rounds tells a stall of the
    server or the machine (both clients) from one of the browser (the tabs only)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    if executable is None:
        raise RuntimeError("Debian's chromium is required for --clients chromium")
    offset = time.time() - time.monotonic()  # browser epoch ms -> this machine's monotonic

    def mono(rows: list) -> Arrivals:
        return [(text, at / 1000.0 - offset) for text, at in rows]

    direct_all: list[Arrivals] = []
    tether_all: list[Arrivals] = []
    direct_beside: list[Arrivals] = []
    tether_beside: list[Arrivals] = []
    others = runs - tabs
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-dev-shm-usage"]
    with (
        sync_playwright() as pw,
        concurrent.futures.ThreadPoolExecutor(2 * runs) as pool,
    ):
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=args)
        try:
            contexts = [browser.new_context() for _ in range(tabs)]
            pages = [ctx.new_page() for ctx in contexts]
            for page in pages:
                page.add_init_script(WRAP_EVENTSOURCE)
            url = fake_url + "/chat/completions"
            for i in range(warmup + rounds):
                for page in pages:  # a tab on the model's origin: same-origin fetch
                    page.goto(fake_url + "/models")
                background = [pool.submit(thread_direct, url) for _ in range(others)]
                for page in pages:
                    page.evaluate("(u) => { window.__p = (" + FETCH_DIRECT + ")(u); }", url)
                wait_all(pages, "window.__direct !== null", 120)
                direct = [mono(page.evaluate("window.__direct")) for page in pages]
                threads_direct = [future.result(120) for future in background]
                sessions = new_sessions(base, runs)
                for page, sid in zip(pages, sessions, strict=False):
                    page.goto(f"{base}/s/{sid}")
                wait_all(pages, "window.__open", 30)
                # A fresh tab's first answer also loads and compiles the page's Markdown and
                # highlighting code (a few hundred ms here): one unmeasured turn first, as a
                # reader's tab has long done that when a run starts.
                start_runs(base, sessions[:tabs], pool)
                wait_all(pages, "window.__finished", 120)
                for page in pages:
                    page.evaluate("window.__arrivals = []; window.__finished = false")
                ready = [threading.Event() for _ in sessions[tabs:]]
                background = [
                    pool.submit(thread_tether, base, sid, event)
                    for sid, event in zip(sessions[tabs:], ready, strict=True)
                ]
                for event in ready:
                    if not event.wait(30):
                        raise SanityError("a thread reader did not connect")
                time.sleep(SETTLE_SECONDS)  # the warm-up run's worker unwinds
                start_runs(base, sessions, pool)
                wait_all(pages, "window.__finished", 120)
                threads_tether = [future.result(120) for future in background]
                tether = []
                for page in pages:
                    rows = page.evaluate("window.__arrivals")
                    tether.append(mono([(json.loads(d)["data"]["text"], t) for d, t in rows]))
                if i >= warmup:
                    direct_all += direct
                    tether_all += tether
                    direct_beside += threads_direct
                    tether_beside += threads_tether
        finally:
            browser.close()
    return direct_all, tether_all, direct_beside, tether_beside


# -- main -------------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": percentile(values, q) for q in (50, 90, 99)} | {"max_ms": max(values)}


def figures(
    label: str, direct: list[Arrivals], tether: list[Arrivals], stamps: dict, deltas: int
) -> dict[str, Any]:
    d_sum = summary(latencies_ms(direct, stamps, deltas, f"{label} direct"))
    t_sum = summary(latencies_ms(tether, stamps, deltas, f"{label} tether"))
    return {
        "direct": d_sum,
        "tether": t_sum,
        "events_per_run": sum(len(r) for r in tether) / len(tether),
        "added_p50_ms": t_sum["p50_ms"] - d_sum["p50_ms"],
        "added_p99_ms": t_sum["p99_ms"] - d_sum["p99_ms"],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Per-delta latency seen by threads and Chromium.")
    p.add_argument("--quick", action="store_true", help="10 runs x 15 deltas, 1 round")
    p.add_argument("--runs", type=int, help="runs at once (default 20)")
    p.add_argument("--deltas", type=int, help="deltas per run (default 60)")
    p.add_argument("--interval-ms", type=float, default=20.0, help="model's delta interval")
    p.add_argument("--rounds", type=int, help="measured rounds per client (default 3)")
    p.add_argument(
        "--tabs", type=int, help="runs read by Chromium tabs, the rest by threads (default 5)"
    )
    p.add_argument("--clients", default="threads,chromium", help="threads, chromium or both")
    p.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    p.add_argument("--fake-child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.runs = args.runs or (10 if args.quick else 20)
    args.deltas = args.deltas or (15 if args.quick else 60)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.tabs = min(args.runs, args.tabs or (3 if args.quick else 5))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fake_child:
        return fake_child(int(args.fake_child[0]), float(args.fake_child[1]))
    started = time.monotonic()
    busy0 = machine_busy_ticks()
    clients = args.clients.split(",")
    results: dict[str, Any] = {}
    fake = FakeProcess(args.deltas, args.interval_ms)
    with tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp:
        server = model_server(Path(tmp) / "data", fake.base_url)
        try:
            server.start(timeout=120)  # a loaded machine starts slowly
            for client in clients:
                sets: dict[str, tuple[list[Arrivals], list[Arrivals]]] = {}
                if client == "threads":
                    threads_round(server.base_url, fake.base_url, args.runs)  # warm-up
                    direct: list[Arrivals] = []
                    tether: list[Arrivals] = []
                    for _ in range(args.rounds):
                        d, t = threads_round(server.base_url, fake.base_url, args.runs)
                        direct += d
                        tether += t
                    sets[client] = (direct, tether)
                elif client == "chromium":
                    direct, tether, d_beside, t_beside = chromium_rounds(
                        server.base_url, fake.base_url, args.runs, args.tabs, args.rounds, 1
                    )
                    sets[client] = (direct, tether)
                    if d_beside:
                        sets[f"{BESIDE}{client}"] = (d_beside, t_beside)
                else:
                    raise SystemExit(f"unknown client {client!r}")
                stamps = fake.stamps()
                for label, (direct, tether) in sets.items():
                    results[label] = figures(label, direct, tether, stamps, args.deltas)
        except (SanityError, RuntimeError) as exc:
            print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
            fake.stop()
    elapsed = time.monotonic() - started
    busy1 = machine_busy_ticks()
    load = None
    if busy0 is not None and busy1 is not None:
        load = (busy1 - busy0) / (elapsed * (os.cpu_count() or 1) * os.sysconf("SC_CLK_TCK"))
    print(
        f"Outside latency: {args.runs} runs x {args.deltas} deltas every {args.interval_ms:g} ms, "
        f"{args.rounds} rounds; Python {platform.python_version()}, {os.cpu_count()} CPUs"
        + (f", machine busy {load:.0%}" if load is not None else "")
    )
    print(f"\n{'client':<24} {'path':<7} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}")
    for client, r in results.items():
        for path in ("direct", "tether"):
            s = r[path]
            print(
                f"{client:<24} {path:<7} {s['p50_ms']:>7.2f} {s['p90_ms']:>7.2f} "
                f"{s['p99_ms']:>7.2f} {s['max_ms']:>7.2f}"
            )
    print(f"\n{'added by tether':<24} {'p50 ms':>7} {'p99 ms':>7}  target")
    targets = {}
    for client, r in results.items():
        verdict = "(none: the load beside the tabs)"
        if not client.startswith(BESIDE):
            met = r["added_p99_ms"] < TARGET_P99_ADDED_MS
            targets[client] = {
                "max_ms": TARGET_P99_ADDED_MS,
                "value_ms": r["added_p99_ms"],
                "met": met,
            }
            verdict = f"p99 < {TARGET_P99_ADDED_MS:g} ms  {'MET' if met else 'NOT MET'}"
        print(f"{client:<24} {r['added_p50_ms']:>7.2f} {r['added_p99_ms']:>7.2f}  {verdict}")
    write_results(
        args.out,
        {
            "benchmark": "outside_latency",
            "config": {
                "runs": args.runs,
                "deltas": args.deltas,
                "interval_ms": args.interval_ms,
                "rounds": args.rounds,
                "tabs": args.tabs,
                "clients": clients,
                "machine_busy": load,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "seconds": round(elapsed, 1),
            },
            "results": results,
            "targets": targets,
            "sanity": "ok",
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
