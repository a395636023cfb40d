"""The log side against its floor: replay, resume, replay memory and the sidebar.

Every figure is a ratio measured in this one run against a baseline on the same machine:

- **replay**: a full replay (`GET /api/sessions/{id}/events?after=0`) of a 20,000-event session
  against the suite's fake model (`tests/fake_openai/`) streaming as many SSE frames of the
  same size (`POST /v1/chat/completions`, a reply of 20,000 text deltas with no delay). Both are
  read by the same client, raw bytes with frames counted, from sending the request to the last
  frame. Target: at most 1.5x.
- **resume**: the last 100 events of a 100,000-event session against the same from a
  1,000-event session (`bench/resume_cost.py`'s method). Target: at most 1.2x.
- **memory**: the server's RSS (`/proc/<pid>/status`, sampled every 20 ms) during a full
  replay of the 100,000-event session, against the size of what it sent. The replay reads the
  log in pages, so the growth stays a small constant, not a share of the log.
- **sidebar**: `GET /api/sessions` (the JSON decoded by the client) at 1,000 and 10,000
  sessions against reading the same rows straight from the database (`SELECT state FROM
  session_index`, each state decoded) in this process. Target: at most 3x at both sizes.

    python bench/floor_log.py            # medians of 7 (replay) and 21 (resume, sidebar)
    python bench/floor_log.py --quick    # smaller sessions, fewer repeats, for tests
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
from pathlib import Path
from typing import Any

import httpx
import resume_cost
from benchkit import machine_busy_ticks, write_results  # noqa: E402 - puts tests/ on sys.path

from tether.events import SESSION_CREATED, SESSION_UPDATED
from tether.log import Draft
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

from fake_openai import FakeOpenAI, reply, text  # noqa: E402
from helpers import ServerProcess  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "floor_log.json"
TARGETS = {"replay": 1.5, "resume": 1.2, "sidebar_small": 3.0, "sidebar_large": 3.0}
TITLE_PAD = 100  # title characters per replayed event: frames of ~250 bytes, above the fake's least
BATCH = 500
TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class SanityError(Exception):
    pass


# -- building the database --------------------------------------------------------------------


async def _fill(store: SQLiteEventStore, sid: str, events: int) -> None:
    await store.create_session(sid, [Draft(SESSION_CREATED, {"title": "x"})])
    seq = 1
    while seq < events:
        count = min(BATCH, events - seq)
        drafts = [
            Draft(SESSION_UPDATED, {"title": f"t{seq + i + 1}".ljust(TITLE_PAD, "~")})
            for i in range(count)
        ]
        await store.append(sid, drafts)
        seq += count


async def _sessions(store: SQLiteEventStore, first: int, count: int) -> None:
    for start in range(first, first + count, BATCH):
        await asyncio.gather(
            *(
                store.create_session(f"side_{n}", [Draft(SESSION_CREATED, {"title": f"s{n}"})])
                for n in range(start, min(start + BATCH, first + count))
            )
        )


def build(db: Path, logs: dict[str, int], sidebar_from: int, sidebar_count: int) -> None:
    store = SQLiteEventStore(db, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)
    try:
        for sid, events in logs.items():
            asyncio.run(_fill(store, sid, events))
        asyncio.run(_sessions(store, sidebar_from, sidebar_count))
    finally:
        store.close()


# -- replay -----------------------------------------------------------------------------------


def read_frames(
    client: httpx.Client, method: str, url: str, frames: int, sep: bytes, **kw: Any
) -> tuple[float, int]:
    """Seconds from sending the request until `frames` frames were read, and bytes read."""
    count = 0
    size = 0
    tail = b""
    start = time.perf_counter()
    with client.stream(method, url, **kw) as response:
        if response.status_code != 200:
            raise SanityError(f"{url} answered {response.status_code}")
        for chunk in response.iter_raw():
            size += len(chunk)
            count += (tail + chunk).count(sep) - tail.count(sep)
            tail = chunk[-len(sep) + 1 :] if len(sep) > 1 else b""
            if count >= frames:
                break
    elapsed = time.perf_counter() - start
    if count < frames:
        raise SanityError(f"{url}: {count} frames instead of {frames}")
    return elapsed, size


def check_replay(client: httpx.Client, sid: str, events: int) -> float:
    """Parse one full replay: seqs 1..events once each, in order. Returns the mean frame size."""
    seqs: list[int] = []
    size = 0
    with client.stream("GET", f"/api/sessions/{sid}/events", params={"after": "0"}) as response:
        for line in response.iter_lines():
            size += len(line) + 2
            if line.startswith("id: "):
                seqs.append(int(line[4:]))
                if seqs[-1] >= events:
                    break
    if seqs != list(range(1, events + 1)):
        raise SanityError(f"{sid}: replay was not seqs 1..{events} once each ({len(seqs)} ids)")
    return (size + 2) / events


class RssWatch:
    """Peak VmRSS of a process while a block runs, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def __enter__(self) -> RssWatch:
        self.before = self.rss()
        self.peak = self.before
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def replay_scenario(
    server: ServerProcess, fake: FakeOpenAI, events: int, big: int, repeat: int
) -> dict[str, Any]:
    sid, big_sid = f"replay_{events}", resume_cost.session_id(big)
    with (
        httpx.Client(base_url=server.base_url, timeout=TIMEOUT) as tether,
        httpx.Client(timeout=TIMEOUT) as direct,
    ):
        frame = check_replay(tether, sid, events)
        url, empty = fake.base_url + "/chat/completions", {"model": "m", "stream": True}
        fake.script(reply(), reply(*(text("x") for _ in range(10))))  # the fake's frame size
        _, bare = read_frames(direct, "POST", url, 3, b"\n\n", json={**empty, "messages": []})
        _, ten = read_frames(direct, "POST", url, 13, b"\n\n", json={**empty, "messages": []})
        overhead = (ten - bare) / 10 - 1
        content = "y" * max(1, round(frame - overhead))
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "r"}]}
        tether_s: list[float] = []
        direct_s: list[float] = []
        sizes = {}
        for i in range(repeat + 1):  # the first round of each warms up
            fake.script(reply(*(text(content) for _ in range(events))))
            t, sizes["direct"] = read_frames(
                direct, "POST", fake.base_url + "/chat/completions", events + 3, b"\n\n", json=body
            )
            if i:
                direct_s.append(t)
            t, sizes["tether"] = read_frames(
                tether,
                "GET",
                f"/api/sessions/{sid}/events",
                events,
                b"\r\n\r\n",
                params={"after": "0"},
            )
            if i:
                tether_s.append(t)
        assert server.proc is not None
        with RssWatch(server.proc.pid) as watch:
            _, big_bytes = read_frames(
                tether,
                "GET",
                f"/api/sessions/{big_sid}/events",
                big,
                b"\r\n\r\n",
                params={"after": "0"},
            )
    t_med, d_med = statistics.median(tether_s), statistics.median(direct_s)
    return {
        "events": events,
        "frame_bytes": {
            "tether": sizes["tether"] / events,
            "direct": sizes["direct"] / (events + 3),
        },
        "tether_ms": t_med * 1000,
        "direct_ms": d_med * 1000,
        "tether_frames_per_s": events / t_med,
        "direct_frames_per_s": (events + 3) / d_med,
        "ratio": t_med / d_med,
        "memory": {
            "events": big,
            "bytes_sent": big_bytes,
            "rss_before": watch.before,
            "rss_peak": watch.peak,
            "growth": watch.peak - watch.before,
        },
    }


# -- sidebar ----------------------------------------------------------------------------------


def sidebar_scenario(server: ServerProcess, db: Path, repeat: int) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    try:
        tether_s, raw_s = [], []
        rows = 0
        with httpx.Client(base_url=server.base_url, timeout=TIMEOUT) as client:
            for i in range(repeat + 3):
                start = time.perf_counter()
                got = [json.loads(s) for (s,) in conn.execute("SELECT state FROM session_index")]
                raw = time.perf_counter() - start
                start = time.perf_counter()
                response = client.get("/api/sessions")
                listed = response.json()["sessions"]
                elapsed = time.perf_counter() - start
                if response.status_code != 200 or len(listed) != len(got):
                    raise SanityError(f"GET /api/sessions: {len(listed)} rows, SQLite {len(got)}")
                rows = len(got)
                if i >= 3:
                    raw_s.append(raw)
                    tether_s.append(elapsed)
    finally:
        conn.close()
    t_med, r_med = statistics.median(tether_s), statistics.median(raw_s)
    return {
        "sessions": rows,
        "tether_ms": t_med * 1000,
        "sqlite_ms": r_med * 1000,
        "ratio": t_med / r_med,
    }


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Replay, resume and the sidebar against raw floors.")
    p.add_argument("--quick", action="store_true", help="small sessions and repeats, for tests")
    p.add_argument("--events", type=int, help="events in the replayed session (default 20000)")
    p.add_argument("--large", type=int, help="events in the long resume session (default 100000)")
    p.add_argument(
        "--sidebar",
        type=int,
        nargs=2,
        metavar=("SMALL", "LARGE"),
        help="sidebar sizes (default 1000 10000)",
    )
    p.add_argument("--repeat", type=int, help="measured rounds (default 7; 3 with --quick)")
    p.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = p.parse_args(argv)
    quick = args.quick
    args.events = args.events or (3000 if quick else 20_000)
    args.large = args.large or (20_000 if quick else 100_000)
    args.sidebar = args.sidebar or ([200, 2000] if quick else [1000, 10_000])
    args.repeat = args.repeat or (3 if quick else 7)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    busy0 = machine_busy_ticks()
    results: dict[str, Any] = {}
    small_sidebar, large_sidebar = args.sidebar
    logs = {
        f"replay_{args.events}": args.events,
        "bench_1000": 1000,
        f"bench_{args.large}": args.large,
    }
    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp,
        FakeOpenAI() as fake,
    ):
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        db = data_dir / "tether.db"
        build(db, logs, 0, small_sidebar - len(logs))
        server = ServerProcess(data_dir, "--heartbeat-seconds", "5")
        try:
            server.start(timeout=120)  # a loaded machine starts slowly
            results["replay"] = replay_scenario(server, fake, args.events, args.large, args.repeat)
            last = {"bench_1000": 1000, f"bench_{args.large}": args.large}
            times = resume_cost.measure(
                server.base_url, last, [1000, args.large], args.repeat * 3, 100
            )
            small_ms = statistics.median(times[1000]) * 1000
            large_ms = statistics.median(times[args.large]) * 1000
            results["resume"] = {
                "small": 1000,
                "large": args.large,
                "small_ms": small_ms,
                "large_ms": large_ms,
                "ratio": large_ms / small_ms,
            }
            results["sidebar_small"] = sidebar_scenario(server, db, args.repeat * 3)
            server.stop()
            build(db, {}, small_sidebar, large_sidebar - small_sidebar)
            server.start(timeout=120)  # a loaded machine starts slowly
            results["sidebar_large"] = sidebar_scenario(server, db, args.repeat * 3)
        except (SanityError, resume_cost.SanityError, RuntimeError) as exc:
            print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
    busy1 = machine_busy_ticks()
    elapsed = time.monotonic() - started
    load = None
    if busy0 is not None and busy1 is not None:
        load = (busy1 - busy0) / (elapsed * (os.cpu_count() or 1) * os.sysconf("SC_CLK_TCK"))
    r = results
    rep, mem = r["replay"], r["replay"]["memory"]
    print(
        f"Log floor: Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, machine busy {load:.0%} (this bench included)"
        if load
        else ""
    )
    print(
        f"\nreplay {rep['events']:,} events: tether {rep['tether_ms']:.0f} ms "
        f"({rep['tether_frames_per_s']:,.0f} frames/s, {rep['frame_bytes']['tether']:.0f} B), "
        f"fake {rep['direct_ms']:.0f} ms ({rep['direct_frames_per_s']:,.0f} frames/s, "
        f"{rep['frame_bytes']['direct']:.0f} B)"
    )
    print(
        f"resume last 100: {r['resume']['small']:,} events {r['resume']['small_ms']:.2f} ms, "
        f"{r['resume']['large']:,} events {r['resume']['large_ms']:.2f} ms"
    )
    print(
        f"replay memory, {mem['events']:,} events ({mem['bytes_sent'] / 2**20:.1f} MiB sent): "
        f"RSS {mem['rss_before'] / 2**20:.1f} -> peak {mem['rss_peak'] / 2**20:.1f} MiB "
        f"(+{mem['growth'] / 2**20:.1f} MiB)"
    )
    for key in ("sidebar_small", "sidebar_large"):
        s = r[key]
        print(
            f"sidebar {s['sessions']:,} sessions: GET {s['tether_ms']:.2f} ms, "
            f"SQLite {s['sqlite_ms']:.2f} ms"
        )
    print(f"\n{'ratio':<34} {'value':>6}  target")
    targets = {}
    for key, limit in TARGETS.items():
        value = r[key]["ratio"]
        targets[key] = {"max": limit, "value": value, "met": value <= limit}
        verdict = "MET" if value <= limit else "NOT MET"
        print(f"{key:<34} {value:>6.2f}  <= {limit:g}  {verdict}")
    write_results(
        args.out,
        {
            "benchmark": "floor_log",
            "config": {
                "events": args.events,
                "large": args.large,
                "sidebar": args.sidebar,
                "repeat": args.repeat,
                "quick": args.quick,
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
