"""The streaming path against its floor: first token and throughput, Tether against the fake.

Both paths are read by the same kind of client (httpx, asyncio, lines parsed, JSON decoded) in
this process, which also hosts the suite's fake model (`tests/fake_openai/`) in a thread;
`tether serve --runtime openai` runs as a subprocess pointed at that fake.

- **first token**: the model streams 200 text deltas 5 ms apart. Tether: from sending `POST
  /api/chat/start` (the session's SSE reader already connected and subscribed) to the first
  `text.delta` frame on the session stream. Fake: from sending `POST /v1/chat/completions` to
  its first chunk with text. Target: the median Tether adds is at most 3 ms.
- **throughput**: the model streams 2,000 text deltas with no delay. Tether: from sending `POST
  /api/chat/start` to the frame that completes the text on the session stream. Fake: from
  sending the request to its last text chunk. Once with 1 run, once with 10 runs at once (10
  sessions; the fake serving 10 requests at once). Target: at most 1.5x the fake's time at 1
  and at 10.

Every Tether run must deliver the whole text, in order, in gap-free seqs, ending `completed`.

    python bench/floor_stream.py            # medians of 15 (first token) and 7 (throughput)
    python bench/floor_stream.py --quick    # fewer rounds, for tests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchkit import machine_busy_ticks, write_results  # noqa: E402 - puts tests/ on sys.path

from fake_openai import FakeOpenAI, Reply, delay, reply, text  # noqa: E402
from helpers import ServerProcess  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "floor_stream.json"
MODEL = "fake-model"
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
TARGET_FIRST_ADDED_MS = 3.0
TARGET_THROUGHPUT = 1.5


class SanityError(Exception):
    pass


def words(n: int) -> list[str]:
    return [f"w{k} " for k in range(n)]


def scripted(n: int, gap: float) -> Reply:
    steps: list[Any] = []
    for k, w in enumerate(words(n)):
        if k and gap:
            steps.append(delay(gap))
        steps.append(text(w))
    return reply(*steps)


async def direct_run(client: httpx.AsyncClient, url: str, n: int) -> tuple[float, float]:
    """(seconds to the first text chunk, seconds to the last) from sending the request."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "bench"}]}
    got: list[str] = []
    first = last = 0.0
    start = time.perf_counter()
    async with client.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    got.append(content)
    if "".join(got) != "".join(words(n)):
        raise SanityError("direct: the text did not arrive whole")
    return first - start, last - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU that process `pid` has used so far, all threads (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def tether_run(client: httpx.AsyncClient, n: int) -> tuple[float, float]:
    """(seconds to the first text.delta, seconds to the frame completing the text) from
    sending `POST /api/chat/start`, on a fresh session whose reader is already subscribed."""
    response = await client.post("/api/sessions", json={"title": "bench"})
    sid = response.json()["session"]["session_id"]
    ready = asyncio.Event()
    expected = "".join(words(n))
    marks: dict[str, float] = {}

    async def read() -> None:
        got, last_seq, kind = [], 0, ""
        async with client.stream("GET", f"/api/sessions/{sid}/events", params={"after": "0"}) as r:
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind != "heartbeat":
                    envelope = json.loads(line[6:])
                    if envelope["seq"] != last_seq + 1:
                        raise SanityError(f"tether: seq {envelope['seq']} after {last_seq}")
                    last_seq = envelope["seq"]
                    if last_seq == 1:
                        ready.set()
                    if kind == "text.delta":
                        now = time.perf_counter()
                        marks.setdefault("first", now)
                        got.append(envelope["data"]["text"])
                        if len("".join(got)) >= len(expected):
                            marks["last"] = now
                    elif kind == "run.finished":
                        if envelope["data"].get("state") != "completed":
                            raise SanityError(f"tether: run ended {envelope['data']}")
                        break
        if "".join(got) != expected:
            raise SanityError("tether: the text did not arrive whole")

    reader = asyncio.create_task(read())
    await asyncio.wait_for(ready.wait(), 20)
    start = time.perf_counter()
    response = await client.post("/api/chat/start", json={"session_id": sid, "message": "bench"})
    if response.status_code != 200:
        raise SanityError(f"POST /api/chat/start answered {response.status_code}")
    await asyncio.wait_for(reader, 120)
    return marks["first"] - start, marks["last"] - start


async def rounds(
    fake: FakeOpenAI, base: str, n: int, gap: float, runs: int, repeat: int, pid: int
) -> dict[str, list[tuple[float, float]]]:
    """Alternate direct and Tether rounds of `runs` runs at once; one warm-up of each.
    Each round's figure is its slowest run (first token: the median run of the round).
    `cpu` holds the server's CPU seconds per Tether round (load moves it much less)."""
    out: dict[str, list[tuple[float, float]]] = {"direct": [], "tether": [], "cpu": []}
    limits = httpx.Limits(max_connections=4 * runs + 8)
    async with (
        httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as direct,
        httpx.AsyncClient(base_url=base, timeout=TIMEOUT, limits=limits) as tether,
    ):
        url = fake.base_url + "/chat/completions"
        for i in range(repeat + 1):
            fake.script(*(scripted(n, gap) for _ in range(runs)))
            d = await asyncio.gather(*(direct_run(direct, url, n) for _ in range(runs)))
            fake.script(*(scripted(n, gap) for _ in range(runs)))
            cpu = cpu_seconds(pid)
            t = await asyncio.gather(*(tether_run(tether, n) for _ in range(runs)))
            cpu = cpu_seconds(pid) - cpu
            if i:
                out["cpu"].append((cpu, cpu))
                for key, got in (("direct", d), ("tether", t)):
                    out[key].append(
                        (statistics.median(f for f, _ in got), max(last for _, last in got))
                    )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="First token and throughput against the fake.")
    p.add_argument("--quick", action="store_true", help="fewer rounds, for tests")
    p.add_argument("--repeat", type=int, help="throughput rounds (default 7; 3 with --quick)")
    p.add_argument("--first-repeat", type=int, help="first-token rounds (default 15; 5 quick)")
    p.add_argument(
        "--scenarios",
        default="first,single,concurrent",
        help="comma-separated: first, single, concurrent",
    )
    p.add_argument("--dir", help="where the server's data directory goes (default: temp)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = p.parse_args(argv)
    args.repeat = args.repeat or (3 if args.quick else 7)
    args.first_repeat = args.first_repeat or (5 if args.quick else 15)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = set(args.scenarios.split(","))
    started = time.monotonic()
    busy0 = machine_busy_ticks()
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-", dir=args.dir) as tmp,
        FakeOpenAI(model=MODEL) as fake,
    ):
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
            "5",
        )
        try:
            server.start(timeout=120)  # a loaded machine starts slowly
            plan = [
                ("first", 200, 0.005, 1, args.first_repeat),
                ("single", 2000, 0.0, 1, args.repeat),
                ("concurrent", 2000, 0.0, 10, args.repeat),
            ]
            for key, n, gap, runs, repeat in plan:
                if key not in wanted:
                    continue
                assert server.proc is not None
                got = asyncio.run(
                    rounds(fake, server.base_url, n, gap, runs, repeat, server.proc.pid)
                )
                col = 0 if key == "first" else 1
                d = statistics.median(v[col] for v in got["direct"]) * 1000
                t = statistics.median(v[col] for v in got["tether"]) * 1000
                results[key] = {
                    "deltas": n,
                    "gap_ms": gap * 1000,
                    "runs": runs,
                    "rounds": repeat,
                    "direct_ms": d,
                    "tether_ms": t,
                    "added_ms": t - d,
                    "ratio": t / d,
                    "server_cpu_ms_per_round": statistics.median(c for c, _ in got["cpu"]) * 1000,
                    "tether_rounds_ms": [v[col] * 1000 for v in got["tether"]],
                    "direct_rounds_ms": [v[col] * 1000 for v in got["direct"]],
                }
        except (SanityError, RuntimeError, TimeoutError) as exc:
            print(f"SANITY CHECK FAILED: {exc!r}", file=sys.stderr)
            return 1
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.stop()
    elapsed = time.monotonic() - started
    busy1 = machine_busy_ticks()
    load = None
    if busy0 is not None and busy1 is not None:
        load = (busy1 - busy0) / (elapsed * (os.cpu_count() or 1) * os.sysconf("SC_CLK_TCK"))
        print(
            f"Stream floor: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
            f"machine busy {load:.0%} (this bench included)\n"
        )
    targets = {}
    print(
        f"{'scenario':<42} {'fake ms':>8} {'tether ms':>10} {'added':>7} {'ratio':>6} "
        f"{'srv cpu':>8}  target"
    )
    for key, r in results.items():
        label = f"{key}: {r['runs']} x {r['deltas']} deltas, {r['gap_ms']:g} ms apart"
        if key == "first":
            met = r["added_ms"] <= TARGET_FIRST_ADDED_MS
            target = f"added <= {TARGET_FIRST_ADDED_MS:g} ms"
        else:
            met = r["ratio"] <= TARGET_THROUGHPUT
            target = f"ratio <= {TARGET_THROUGHPUT:g}"
        targets[key] = {"target": target, "met": met}
        print(
            f"{label:<42} {r['direct_ms']:>8.2f} {r['tether_ms']:>10.2f} {r['added_ms']:>7.2f} "
            f"{r['ratio']:>6.2f} {r['server_cpu_ms_per_round']:>8.1f}  {target}  "
            f"{'MET' if met else 'NOT MET'}"
        )
    write_results(
        args.out,
        {
            "benchmark": "floor_stream",
            "config": {
                "repeat": args.repeat,
                "first_repeat": args.first_repeat,
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
