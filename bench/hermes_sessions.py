"""Many Hermes sessions on one warm sidecar: first turns, idle memory, concurrent streams.

Everything runs against `tether serve --runtime hermes` in a subprocess, driving the real
hermes-agent 0.19.0 (the test suite's virtualenv, `tests/hermes/hermes_venv.py`) offline
against the suite's fake model (`tests/fake_openai/`, in this process). Three scenarios,
each with its baseline measured in the same run, so only ratios are claimed:

- `first-token`: the first token of the **first** turn of a new session against the first
  token of a later turn of the same session (both from `POST /api/chat/start` to the first
  `text.delta` a subscriber holds), over `--sessions` new sessions after one warm-up
  session; medians. Target: ratio <= 2. Also printed: the very first turn after the
  server said it was ready (the sidecar may still be warming up then).
- `memory`: the RSS of the server and all its descendants (the sidecar) once one session
  ran one turn and sits idle, and once `--idle` sessions did. Target: the difference is at
  most 150 MB.
- `concurrency`: `--streams` sessions each streaming `--deltas` deltas at once, against one
  session streaming `--deltas` deltas in `--streams` turns one after the other. Target:
  ratio <= 1.5.

    python bench/hermes_sessions.py                 # all three, about 2 minutes on 2 cores
    python bench/hermes_sessions.py --quick         # smaller, for smoke tests
    python bench/hermes_sessions.py --only memory
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "hermes"))
from hermes_venv import build_hermes_venv, write_home  # noqa: E402

from fake_openai import FakeOpenAI, reply, text  # noqa: E402
from helpers import ServerProcess  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "hermes_sessions.json"
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
TARGET_FIRST_RATIO = 2.0
TARGET_IDLE_MB = 150.0
TARGET_CONCURRENT_RATIO = 1.5


class SanityError(Exception):
    pass


# -- the server --------------------------------------------------------------------------------


def start_server(root: Path, fake: FakeOpenAI, python: Path, *extra: str) -> ServerProcess:
    home = write_home(root / "hermes-home", fake)
    env = {
        "TETHER_HERMES_HOME": str(home),
        "TETHER_HERMES_MAX_TOKENS": "256",
        "TETHER_HERMES_TOOLSETS": "terminal",
        "TETHER_HERMES_TOOL_DELAY": "0",
        "TETHER_BENCH_KEY": "bench-key",
    }
    server = ServerProcess(
        root / "data",
        "--runtime",
        "hermes",
        "--hermes-python",
        str(python),
        "--base-url",
        fake.base_url,
        "--model",
        fake.model,
        "--api-key-env",
        "TETHER_BENCH_KEY",
        "--agent-sync-seconds",
        "0",
        *extra,
        env=env,
    )
    return server.start(timeout=60)


def tree_rss_mb(pid: int) -> float:
    """RSS of `pid` and all its descendants (Linux /proc), in MB."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total_kb, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


# -- one turn, as a subscriber sees it ---------------------------------------------------------


async def new_session(client: httpx.AsyncClient) -> str:
    response = await client.post("/api/sessions", json={"title": "bench"})
    if response.status_code != 201:
        raise SanityError(f"POST /api/sessions answered {response.status_code}")
    return str(response.json()["session"]["session_id"])


async def last_seq(client: httpx.AsyncClient, session_id: str) -> int:
    response = await client.get("/api/session", params={"session_id": session_id})
    return int(response.json()["session"]["last_seq"])


async def turn(
    client: httpx.AsyncClient, session_id: str, message: str = "bench"
) -> tuple[float, float, int]:
    """Start a turn; (seconds to the first text.delta, seconds to run.finished, delta
    characters received), from just before `POST /api/chat/start`."""
    after = await last_seq(client, session_id)
    url = f"/api/sessions/{session_id}/events"
    first = None
    chars = 0
    async with client.stream("GET", url, params={"after": str(after)}) as response:
        if response.status_code != 200:
            raise SanityError(f"events stream answered {response.status_code}")
        started = time.monotonic()
        answer = await client.post(
            "/api/chat/start", json={"session_id": session_id, "message": message}
        )
        if answer.status_code != 200:
            raise SanityError(f"POST /api/chat/start answered {answer.status_code}: {answer.text}")
        event_type = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event_type = line[7:]
            elif line.startswith("data: ") and event_type == "text.delta":
                if first is None:
                    first = time.monotonic() - started
                chars += len(json.loads(line[6:])["data"]["text"])
            elif line.startswith("data: ") and event_type == "run.finished":
                state = json.loads(line[6:])["data"].get("state")
                if state != "completed":
                    raise SanityError(f"a run ended {state!r}: {line[6:]}")
                if first is None:
                    raise SanityError("a run finished without a text delta")
                return first, time.monotonic() - started, chars
            elif line == "":
                event_type = ""
    raise SanityError("the event stream ended before run.finished")


def client_for(server: ServerProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base_url, timeout=TIMEOUT)


# -- scenarios ---------------------------------------------------------------------------------


async def first_token(server: ServerProcess, sessions: int) -> dict[str, Any]:
    async with client_for(server) as client:
        cold_first, _, _ = await turn(client, await new_session(client))  # right after ready
        firsts, laters = [], []
        for _ in range(sessions):
            sid = await new_session(client)
            firsts.append((await turn(client, sid))[0])
            laters.append((await turn(client, sid))[0])
    first_ms = statistics.median(firsts) * 1000
    later_ms = statistics.median(laters) * 1000
    return {
        "sessions": sessions,
        "just_after_start_first_token_ms": round(cold_first * 1000, 1),
        "first_turn_first_token_ms": [round(v * 1000, 1) for v in firsts],
        "later_turn_first_token_ms": [round(v * 1000, 1) for v in laters],
        "median_first_ms": round(first_ms, 1),
        "median_later_ms": round(later_ms, 1),
        "ratio": round(first_ms / later_ms, 2),
        "target": TARGET_FIRST_RATIO,
        "met": first_ms / later_ms <= TARGET_FIRST_RATIO,
    }


async def memory(server: ServerProcess, idle: int) -> dict[str, Any]:
    assert server.proc is not None
    async with client_for(server) as client:
        await turn(client, await new_session(client))
        await asyncio.sleep(2.0)
        one = tree_rss_mb(server.proc.pid)
        for _ in range(idle - 1):
            await turn(client, await new_session(client))
        await asyncio.sleep(2.0)
        many = tree_rss_mb(server.proc.pid)
    return {
        "idle_sessions": idle,
        "rss_one_session_mb": round(one, 1),
        f"rss_{idle}_sessions_mb": round(many, 1),
        "added_mb": round(many - one, 1),
        "target_mb": TARGET_IDLE_MB,
        "met": many - one <= TARGET_IDLE_MB,
    }


async def concurrency(
    server: ServerProcess, fake: FakeOpenAI, streams: int, deltas: int
) -> dict[str, Any]:
    fake.default_reply = reply(*(text("x") for _ in range(deltas)))
    async with client_for(server) as client:
        await turn(client, await new_session(client))  # warm: the path, the fake's reply
        sid = await new_session(client)
        started = time.monotonic()
        for n in range(streams):
            _, _, chars = await turn(client, sid, f"sequential {n}")
            if chars != deltas:
                raise SanityError(f"a sequential turn got {chars} of {deltas} deltas")
        sequential = time.monotonic() - started
        sids = [await new_session(client) for _ in range(streams)]
        started = time.monotonic()
        results = await asyncio.gather(*(turn(client, s, "concurrent") for s in sids))
        concurrent = time.monotonic() - started
        if any(chars != deltas for _, _, chars in results):
            raise SanityError("a concurrent turn did not get all its deltas")
    fake.default_reply = reply(text("ok"))
    return {
        "streams": streams,
        "deltas": deltas,
        "sequential_s": round(sequential, 3),
        "concurrent_s": round(concurrent, 3),
        "ratio": round(concurrent / sequential, 2),
        "target": TARGET_CONCURRENT_RATIO,
        "met": concurrent / sequential <= TARGET_CONCURRENT_RATIO,
    }


# -- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["first-token", "memory", "concurrency"])
    parser.add_argument("--sessions", type=int, default=16, help="new sessions (first-token)")
    parser.add_argument("--idle", type=int, default=20, help="idle sessions (memory)")
    parser.add_argument("--streams", type=int, default=10, help="concurrent sessions")
    parser.add_argument("--deltas", type=int, default=2000, help="deltas per stream")
    parser.add_argument("--quick", action="store_true", help="3 sessions, 5 idle, 3 x 200")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.idle, args.streams, args.deltas = 3, 5, 3, 200
    python = build_hermes_venv()
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    busy_before, wall_before = machine_busy_ticks(), time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(context_length=131072) as fake:
        plan = [args.only] if args.only else ["first-token", "memory", "concurrency"]
        for name in plan:
            root = Path(tmp) / name
            extra = ("--hermes-agents", str(args.idle)) if name == "memory" else ()
            server = start_server(root, fake, python, *extra)
            try:
                if name == "first-token":
                    results[name] = asyncio.run(first_token(server, args.sessions))
                elif name == "memory":
                    results[name] = asyncio.run(memory(server, args.idle))
                else:
                    results[name] = asyncio.run(
                        concurrency(server, fake, args.streams, args.deltas)
                    )
            finally:
                server.stop()
            print(f"{name}: {json.dumps(results[name])}")
    busy_after = machine_busy_ticks()
    if busy_before is not None and busy_after is not None:
        ticks = os.sysconf("SC_CLK_TCK") * (time.monotonic() - wall_before) * (os.cpu_count() or 1)
        results["machine"]["busy_share"] = round((busy_after - busy_before) / ticks, 2)
    met = all(r.get("met", True) for k, r in results.items() if k != "machine")
    print("all targets met" if met else "NOT MET: see above")
    write_results(args.out, results)
    return 0  # timings are noisy: a missed target is reported, not an exit status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SanityError as exc:
        print(f"SANITY CHECK FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
