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

How the load is made: the fake model (`tests/fake_openai.py`) runs in a thread of this
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

    python bench/load_test.py            # 50 runs, 200 subscribers, 60 s: about 70 s in all
    python bench/load_test.py --quick    # 10 runs, 40 subscribers, 10 s: about 15 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from benchkit import machine_busy_ticks, percentile, write_results  # noqa: E402 - puts tests/ on sys.path

from fake_openai import FakeOpenAI, Reply, delay, reasoning, reply, text  # noqa: E402
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
RSS_INTERVAL = 0.25
LAG_INTERVAL = 0.02
SLICE_SECONDS = 10.0
DRAIN_TIMEOUT = 60.0
CATCH_UP_TIMEOUT = 30.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "load_test.json"

MODEL = "fake-model"
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# Below uvicorn's 5 s keep-alive timeout: a pooled connection is never reused just as the
# server closes it (httpx's default expiry is also 5 s, which races).
KEEPALIVE_EXPIRY = 2.0
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class SanityError(Exception):
    """Events were lost or duplicated, or the harness could not do its job."""


# -- the fake model -------------------------------------------------------------------------


class LoadFake(FakeOpenAI):
    """The test suite's fake with one change: a `delay` step is one `asyncio.sleep` instead of
    the 10 ms polling loop the tests use to notice `stop()` quickly. With 50 streams at once
    that loop would add thousands of wake-ups a second to this process, which shares the
    machine's cores with the server under test."""

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def default_reply(deltas: int, reasoning_deltas: int, interval: float) -> Reply:
    steps: list[Any] = []
    for k in range(reasoning_deltas):
        steps += [reasoning(f"thinking {k} "), delay(interval)]
    for k in range(deltas):
        steps += [text(f"word{k} "), delay(interval)]
    return reply(*steps[:-1])  # no delay after the last delta


# -- SSE subscribers ------------------------------------------------------------------------


@dataclass
class Subscriber:
    index: int
    session_id: str
    seqs: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds, live events only
    reconnects: int = 0
    snapshots: int = 0
    mismatched_ids: int = 0
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    advanced: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0


class Session:
    """One session under load: its subscribers report each `run.finished` here."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.finished: dict[str, str] = {}  # stream_id -> terminal state
        self.changed = asyncio.Event()

    def run_finished(self, stream_id: str, state: str) -> None:
        if stream_id not in self.finished:
            self.finished[stream_id] = state
            self.changed.set()


def parse_frame(raw: bytes) -> tuple[str, str | None, str]:
    """(event, id, data) of one SSE frame whose line ends were normalised to LF."""
    event, ident, data = "message", None, []
    for line in raw.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value.decode())
        elif name == b"event":
            event = value.decode()
        elif name == b"id":
            ident = value.decode()
    return event, ident, "\n".join(data)


async def subscribe(
    client: httpx.AsyncClient, sub: Subscriber, session: Session, live_after: list[float]
) -> None:
    """Follow the session's stream from `after=0`; reconnect from the last seq received if
    the server closes it (counted: it should not happen). Parses the raw bytes itself, which
    costs this process less than line iteration."""
    url = f"/api/sessions/{sub.session_id}/events"
    while True:
        try:
            async with client.stream("GET", url, params={"after": str(sub.last)}) as response:
                if response.status_code != 200:
                    raise SanityError(f"{url} answered {response.status_code}")
                buffer = b""
                async for chunk in response.aiter_raw():
                    now = time.time()
                    buffer += chunk
                    if b"\r" in buffer:
                        if buffer.endswith(b"\r"):
                            continue  # a CRLF may be split across chunks: wait for the LF
                        buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                    *frames, buffer = buffer.split(b"\n\n")
                    for raw in frames:
                        handle_frame(sub, session, raw, now, live_after[0])
        except (httpx.TransportError, httpx.StreamError):
            pass
        sub.reconnects += 1
        await asyncio.sleep(0.05)


def handle_frame(
    sub: Subscriber, session: Session, raw: bytes, now: float, live_after: float
) -> None:
    event, ident, data = parse_frame(raw)
    if ident is None:
        if event == "session.snapshot":
            sub.snapshots += 1  # never expected with a valid cursor
        return  # heartbeat or comment
    envelope = json.loads(data)
    seq = envelope["seq"]
    if str(seq) != ident:
        sub.mismatched_ids += 1
    sub.seqs.append(seq)
    if seq == 1:
        sub.connected.set()
    if envelope["at"] >= live_after:
        sub.latencies.append(now - envelope["at"])
    if event == "run.finished":
        session.run_finished(envelope["data"]["stream_id"], envelope["data"].get("state", "?"))
    sub.advanced.set()


# -- drivers --------------------------------------------------------------------------------


@dataclass
class Turns:
    started: int = 0
    busy_retries: int = 0
    states: Counter = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)  # start request -> run.finished seen


async def start_turn(client: httpx.AsyncClient, session_id: str, n: int, turns: Turns) -> str:
    """`POST /api/chat/start`, retried while the previous run is still unwinding (409
    session_busy: its `run.finished` is in the log before the worker lets go of the session)."""
    for _ in range(2000):
        response = await client.post(
            "/api/chat/start", json={"session_id": session_id, "message": f"load turn {n}"}
        )
        if response.status_code == 200:
            turns.started += 1
            return response.json()["stream_id"]
        if response.status_code == 409 and "session_busy" in response.text:
            turns.busy_retries += 1
            await asyncio.sleep(0.01)
            continue
        raise SanityError(
            f"POST /api/chat/start answered {response.status_code}: {response.text[:300]}"
        )
    raise SanityError(f"session {session_id} stayed busy")


async def drive(client: httpx.AsyncClient, session: Session, deadline: float, turns: Turns) -> None:
    """Keep one run going in the session until the deadline, then let the last one finish."""
    n = 0
    while time.monotonic() < deadline:
        n += 1
        started = time.monotonic()
        stream_id = await start_turn(client, session.session_id, n, turns)
        while stream_id not in session.finished:
            session.changed.clear()
            await asyncio.wait_for(session.changed.wait(), DRAIN_TIMEOUT)
        turns.durations.append(time.monotonic() - started)
        turns.states[session.finished[stream_id]] += 1


# -- the prober (own thread, own event loop) --------------------------------------------------


class Prober:
    """`GET /api/sessions` then `GET /api/session` for a random session, every `interval`."""

    def __init__(self, base_url: str, session_ids: list[str], interval: float) -> None:
        self.base_url = base_url
        self.session_ids = session_ids
        self.interval = interval
        self.samples: list[tuple[float, str, float, int]] = []  # (monotonic, path, s, status)
        self.lag: list[tuple[float, float]] = []  # (monotonic, seconds late)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load-prober", daemon=True)
        self.native_id: int | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise SanityError(f"the prober failed: {self.error!r}")

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by join()
            self.error = exc

    async def _main(self) -> None:
        rng = random.Random(7)
        limits = httpx.Limits(
            max_connections=4, max_keepalive_connections=4, keepalive_expiry=KEEPALIVE_EXPIRY
        )
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=TIMEOUT, limits=limits
        ) as client:
            lag = asyncio.create_task(loop_lag(self.lag, self.stop))
            next_tick = time.monotonic()
            while not self.stop.is_set():
                for path, params in (
                    ("/api/sessions", None),
                    ("/api/session", {"session_id": rng.choice(self.session_ids)}),
                ):
                    start = time.monotonic()
                    try:
                        response = await client.get(path, params=params)
                        status = response.status_code
                    except httpx.TransportError:
                        status = 0  # counted as an error, with the time it took to fail
                    self.samples.append((start, path, time.monotonic() - start, status))
                next_tick = max(next_tick + self.interval, time.monotonic())
                await asyncio.sleep(next_tick - time.monotonic())
            await lag


async def loop_lag(out: list[tuple[float, float]], stop: threading.Event | asyncio.Event) -> None:
    """How late a short sleep wakes up: a busy event loop delays everything it runs."""
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(LAG_INTERVAL)
        now = time.monotonic()
        out.append((now, max(0.0, now - start - LAG_INTERVAL)))


# -- resource sampling ----------------------------------------------------------------------


def _cpu_ticks(stat_path: str) -> int | None:
    try:
        raw = Path(stat_path).read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Sample:
    t: float
    rss_kib: int
    cpu: dict[str, int]  # ticks by what


class Monitor:
    """Samples the server's VmRSS and the CPU ticks of both processes every 250 ms."""

    def __init__(self, server_pid: int, threads: dict[str, int | None]) -> None:
        self.pid = server_pid
        self.threads = threads  # name -> native thread id in this process
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)

    def sample(self) -> Sample | None:
        rss = _rss_kib(self.pid)
        if rss is None:
            return None
        me = os.getpid()
        paths = {
            "server": f"/proc/{self.pid}/stat",
            "server_loop": f"/proc/{self.pid}/task/{self.pid}/stat",
            "client": f"/proc/{me}/stat",
            "client_loop": f"/proc/{me}/task/{threading.main_thread().native_id}/stat",
        }
        for name, tid in self.threads.items():
            if tid is not None:
                paths[name] = f"/proc/{me}/task/{tid}/stat"
        cpu = {
            name: ticks for name, path in paths.items() if (ticks := _cpu_ticks(path)) is not None
        }
        machine = machine_busy_ticks()
        if machine is not None:
            cpu["machine"] = machine
        sample = Sample(time.monotonic(), rss, cpu)
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self.stop.wait(RSS_INTERVAL):
            self.sample()

    def start(self) -> None:
        self.sample()
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sample()

    def cpu_percent(self, start: float, end: float) -> dict[str, float]:
        """CPU used in [start, end] as % of one core, by process and thread."""
        inside = [s for s in self.samples if start <= s.t <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0], inside[-1]
        wall = last.t - first.t
        out = {
            name: 100.0 * (last.cpu[name] - first.cpu[name]) / CLK_TCK / wall
            for name in last.cpu
            if name in first.cpu
        }
        if "server" in out and "server_loop" in out:
            out["server_other_threads"] = out["server"] - out["server_loop"]
        if {"machine", "server", "client"} <= out.keys():
            out["other_processes"] = max(0.0, out["machine"] - out["server"] - out["client"])
        return out


# -- statistics -----------------------------------------------------------------------------


def dist_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else float("nan"),
    }


# -- the load test --------------------------------------------------------------------------


@dataclass
class Outcome:
    window: dict[str, float]
    sessions: list[str]
    last_seqs: dict[str, int]
    subscribers: list[Subscriber]
    turns: Turns
    probes: list[tuple[float, str, float, int]]
    prober_lag: list[tuple[float, float]]
    client_lag: list[tuple[float, float]]
    monitor: Monitor
    fake_requests: int


async def load(args: argparse.Namespace, base_url: str, server_pid: int, fake: LoadFake) -> Outcome:
    runs = args.runs
    limits = httpx.Limits(
        max_connections=args.subscribers + 8,
        max_keepalive_connections=args.subscribers + 8,
        keepalive_expiry=KEEPALIVE_EXPIRY,
    )
    driver_limits = httpx.Limits(
        max_connections=runs + 8,
        max_keepalive_connections=runs + 8,
        keepalive_expiry=KEEPALIVE_EXPIRY,
    )
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT, limits=limits) as sse,
        httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT, limits=driver_limits) as api,
    ):
        session_ids = []
        for i in range(runs):
            response = await api.post("/api/sessions", json={"title": f"load {i}"})
            if response.status_code != 201:
                raise SanityError(f"POST /api/sessions answered {response.status_code}")
            session_ids.append(response.json()["session"]["session_id"])
        sessions = {sid: Session(sid) for sid in session_ids}

        # Subscribers round-robin over the sessions: 200 over 50 is 4 each.
        subs = [Subscriber(i, session_ids[i % runs]) for i in range(args.subscribers)]
        live_after = [float("inf")]  # latencies count from the load start
        readers = [
            asyncio.create_task(subscribe(sse, s, sessions[s.session_id], live_after)) for s in subs
        ]
        stop_lag = asyncio.Event()
        client_lag: list[tuple[float, float]] = []
        lag_task = asyncio.create_task(loop_lag(client_lag, stop_lag))
        monitor = Monitor(
            server_pid, {"fake_model": fake._thread.native_id if fake._thread else None}
        )
        prober = Prober(base_url, session_ids, args.probe_ms / 1000.0)
        try:
            waiting = asyncio.gather(*(s.connected.wait() for s in subs))
            try:
                await asyncio.wait_for(waiting, 30)
            except TimeoutError:
                for task in readers:
                    if task.done() and task.exception():
                        raise task.exception() from None
                raise SanityError("the SSE subscribers did not connect within 30 s") from None

            prober.start()
            while prober.native_id is None:
                await asyncio.sleep(0.001)
            monitor.threads["prober"] = prober.native_id
            monitor.start()
            t_baseline = time.monotonic()
            await asyncio.sleep(args.baseline_seconds)  # idle probes: the baseline

            turns = Turns()
            start_seqs = {sid: await last_seq(api, sid) for sid in session_ids}
            requests_before = fake.requests_count
            t_load = time.monotonic()
            live_after[0] = time.time()
            deadline = t_load + args.seconds
            drivers = [
                asyncio.create_task(drive(api, sessions[sid], deadline, turns))
                for sid in session_ids
            ]
            await asyncio.wait_for(asyncio.gather(*drivers), args.seconds + DRAIN_TIMEOUT)
            t_drained = time.monotonic()
            prober.stop.set()

            # The server's word on how many events each session holds, then every subscriber
            # must reach it.
            last_seqs = {}
            view_bytes = 0
            for sid in session_ids:
                last_seqs[sid], size = await final_state(api, sid)
                view_bytes += size
            catch_up_deadline = time.monotonic() + CATCH_UP_TIMEOUT
            for sub in subs:
                while sub.last < last_seqs[sub.session_id]:
                    left = catch_up_deadline - time.monotonic()
                    if left <= 0:
                        break
                    sub.advanced.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(sub.advanced.wait(), left)
            await asyncio.sleep(0.3)  # anything past last_seq (a duplicate) would show now
            t_end = time.monotonic()
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            stop_lag.set()
            await lag_task
            prober.join()
            monitor.join()

    appended = sum(last_seqs[s] - start_seqs[s] for s in session_ids)
    return Outcome(
        window={
            "baseline_start": t_baseline,
            "load_start": t_load,
            "deadline": deadline,
            "drained": t_drained,
            "end": t_end,
            "appended": appended,
            "view_bytes": view_bytes,
        },
        sessions=session_ids,
        last_seqs=last_seqs,
        subscribers=subs,
        turns=turns,
        probes=prober.samples,
        prober_lag=prober.lag,
        client_lag=client_lag,
        monitor=monitor,
        fake_requests=fake.requests_count - requests_before,
    )


async def final_state(client: httpx.AsyncClient, session_id: str) -> tuple[int, int]:
    """(last_seq, size of the JSON body) from `GET /api/session` once the session is idle:
    its last run's `run.finished` is in the log a moment before the worker lets go."""
    for _ in range(100):
        response = await client.get("/api/session", params={"session_id": session_id})
        if response.status_code != 200:
            raise SanityError(f"GET /api/session answered {response.status_code}")
        body = response.json()["session"]
        if not body["busy"]:
            return body["last_seq"], len(response.content)
        await asyncio.sleep(0.1)
    raise SanityError(f"session {session_id} still busy 10 s after its last run finished")


async def last_seq(client: httpx.AsyncClient, session_id: str) -> int:
    response = await client.get("/api/session/status", params={"session_id": session_id})
    return response.json()["last_seq"]


# -- checking and reporting -----------------------------------------------------------------


def check_delivery(outcome: Outcome) -> dict[str, Any]:
    """Every subscriber holds exactly 1..last_seq of its session, in order."""
    lost = duplicated = out_of_order = bad_subs = 0
    problems: list[str] = []
    for sub in outcome.subscribers:
        expected = outcome.last_seqs[sub.session_id]
        got = sub.seqs
        distinct = set(got)
        sub_lost = len(set(range(1, expected + 1)) - distinct)
        sub_dup = len(got) - len(distinct)
        extra = len([s for s in distinct if s < 1 or s > expected])
        disorder = sum(1 for a, b in zip(got, got[1:], strict=False) if b != a + 1)
        lost += sub_lost
        duplicated += sub_dup
        out_of_order += disorder
        if sub_lost or sub_dup or extra or disorder or sub.snapshots or sub.mismatched_ids:
            bad_subs += 1
            if len(problems) < 10:
                problems.append(
                    f"subscriber {sub.index} ({sub.session_id}): expected 1..{expected}, got "
                    f"{len(got)} frames, {sub_lost} lost, {sub_dup} duplicated, {extra} beyond "
                    f"last_seq, {disorder} out of order, {sub.snapshots} snapshots, "
                    f"{sub.mismatched_ids} id/seq mismatches"
                )
    return {
        "subscribers": len(outcome.subscribers),
        "subscribers_with_problems": bad_subs,
        "lost": lost,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "reconnects": sum(s.reconnects for s in outcome.subscribers),
        "problems": problems,
        "ok": bad_subs == 0,
    }


def rss_summary(monitor: Monitor, w: dict[str, float]) -> dict[str, Any]:
    samples = [s for s in monitor.samples if s.t >= w["baseline_start"]]
    mib = [(s.t, s.rss_kib / 1024.0) for s in samples]
    load = [(t, v) for t, v in mib if w["load_start"] <= t <= w["drained"]]
    slices = []
    t = w["load_start"]
    while t < w["drained"]:
        chunk = [v for ts, v in load if t <= ts < t + SLICE_SECONDS]
        if chunk:
            slices.append(round(max(chunk), 1))
        t += SLICE_SECONDS
    before = [v for ts, v in mib if ts <= w["load_start"]]
    second_half = [(ts, v) for ts, v in load if ts >= (w["load_start"] + w["drained"]) / 2]
    slope = float("nan")
    if len(second_half) >= 3:
        xs = [ts for ts, _ in second_half]
        ys = [v for _, v in second_half]
        slope = statistics.linear_regression(xs, ys).slope * 60.0
    return {
        "samples": len(mib),
        "start_mib": before[-1] if before else mib[0][1],
        "peak_mib": max(v for _, v in mib),
        "end_mib": mib[-1][1],
        "peak_per_slice_mib": slices,
        "slice_seconds": SLICE_SECONDS,
        "second_half_slope_mib_per_min": slope,
        # What the sessions hold at the end, as `GET /api/session` JSON: the folds the server
        # keeps warm (an LRU of 128 sessions) grow with this, by design.
        "session_views_mib_at_end": w["view_bytes"] / 1024.0 / 1024.0,
    }


def summarize(outcome: Outcome, args: argparse.Namespace) -> dict[str, Any]:
    w = outcome.window
    duration = w["drained"] - w["load_start"]
    in_load = [p for p in outcome.probes if w["load_start"] <= p[0] <= w["deadline"]]
    idle = [p for p in outcome.probes if p[0] < w["load_start"]]
    probes: dict[str, Any] = {}
    for phase, chosen in (("idle", idle), ("load", in_load)):
        for path in ("/api/sessions", "/api/session"):
            values = [p[2] for p in chosen if p[1] == path]
            errors = sum(1 for p in chosen if p[1] == path and p[3] != 200)
            probes[f"{phase} {path}"] = {**dist_ms(values), "errors": errors}
    latencies = [v for sub in outcome.subscribers for v in sub.latencies]
    delivered = sum(len(sub.latencies) for sub in outcome.subscribers)
    turns = outcome.turns

    def lag_load(samples):
        return [v for t, v in samples if w["load_start"] <= t <= w["deadline"]]

    cpu = outcome.monitor.cpu_percent(w["load_start"], w["deadline"])
    in_deadline = w["deadline"] - w["load_start"]
    # CPU cost of the work itself, independent of how much CPU other processes left over.
    cost = {}
    if "server" in cpu and turns.durations:
        cost = {
            "server_cpu_ms_per_turn": cpu["server"] * 10.0 / (turns.started / duration),
            "server_loop_cpu_ms_per_turn": cpu.get("server_loop", 0)
            * 10.0
            / (turns.started / duration),
            "client_cpu_ms_per_turn": cpu.get("client", 0) * 10.0 / (turns.started / duration),
            "window_s": in_deadline,
        }
    return {
        "duration_s": duration,
        "turns": {
            "started": turns.started,
            "completed": turns.states.get("completed", 0),
            "states": dict(turns.states),
            "per_s": turns.started / duration,
            "busy_retries": turns.busy_retries,
            "model_requests": outcome.fake_requests,
            "duration": dist_ms(turns.durations),
        },
        "throughput": {
            "appended_events": w["appended"],
            "appended_per_s": w["appended"] / duration,
            "delivered_events": delivered,
            "delivered_per_s": delivered / duration,
            "events_per_turn": w["appended"] / max(1, turns.started),
        },
        "event_latency": dist_ms(latencies),
        "probes": probes,
        "rss": rss_summary(outcome.monitor, w),
        "cpu_percent_of_one_core": cpu,
        "cpu_cost": cost,
        "client_loop_lag": dist_ms(lag_load(outcome.client_lag)),
        "prober_loop_lag": dist_ms(lag_load(outcome.prober_lag)),
    }


def fmt_dist(d: dict[str, float]) -> str:
    return f"{d['p50_ms']:>8.1f} {d['p90_ms']:>8.1f} {d['p99_ms']:>8.1f} {d['max_ms']:>8.1f}"


def report(
    s: dict[str, Any], delivery: dict[str, Any], targets: dict[str, Any], header: str
) -> str:
    t, th = s["turns"], s["throughput"]
    lines = [header, ""]
    lines.append(
        f"{'load window (first start .. last run finished)':<48} {s['duration_s']:>9.1f} s"
    )
    lines.append(
        f"{'turns started / completed':<48} {t['started']:>9} / {t['completed']}"
        + (f"   other states: {t['states']}" if len(t["states"]) > 1 else "")
    )
    lines.append(f"{'turns per second':<48} {t['per_s']:>9.1f}")
    lines.append(
        f"{'events appended (last_seq growth)':<48} {th['appended_events']:>9}"
        f"   {th['appended_per_s']:>8.0f} /s   ({th['events_per_turn']:.1f} per turn)"
    )
    lines.append(
        f"{'events delivered (all subscribers)':<48} {th['delivered_events']:>9}"
        f"   {th['delivered_per_s']:>8.0f} /s"
    )
    lines += ["", f"{'latency':<48} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}"]
    lines.append(f"{'event: arrival - envelope.at':<48} {fmt_dist(s['event_latency'])}")
    lines.append(f"{'turn: start request -> run.finished received':<48} {fmt_dist(t['duration'])}")
    for key, d in s["probes"].items():
        label = f"GET {key.split(' ', 1)[1]} ({key.split(' ', 1)[0]})"
        err = f"  {d['errors']} errors" if d["errors"] else ""
        lines.append(f"{label:<48} {fmt_dist(d)}{err}")
    lines.append(
        f"{'client event loop lag (SSE readers, drivers)':<48} {fmt_dist(s['client_loop_lag'])}"
    )
    lines.append(f"{'prober event loop lag':<48} {fmt_dist(s['prober_loop_lag'])}")
    rss = s["rss"]
    slices = ", ".join(f"{v:.0f}" for v in rss["peak_per_slice_mib"])
    lines += [
        "",
        f"{'server RSS: start / peak / end':<48} {rss['start_mib']:>7.1f} / "
        f"{rss['peak_mib']:.1f} / {rss['end_mib']:.1f} MiB",
        f"{'server RSS peak per 10 s of load':<48} {slices} MiB",
        f"{'server RSS slope, second half of the load':<48} "
        f"{rss['second_half_slope_mib_per_min']:>7.1f} MiB/min",
        f"{'all sessions as GET /api/session JSON, at end':<48} "
        f"{rss['session_views_mib_at_end']:>7.1f} MiB",
    ]
    cpu = s["cpu_percent_of_one_core"]
    if cpu:
        cores = os.cpu_count() or 1
        lines += ["", f"CPU during the load, % of one core ({cores} cores = {100 * cores}%):"]
        server = (
            f"  server {cpu.get('server', 0):.0f}% (event loop thread "
            f"{cpu.get('server_loop', 0):.0f}%, other threads "
            f"{cpu.get('server_other_threads', 0):.0f}%)"
        )
        client = (
            f"  client {cpu.get('client', 0):.0f}% (main loop: SSE readers + drivers "
            f"{cpu.get('client_loop', 0):.0f}%, fake model {cpu.get('fake_model', 0):.0f}%,"
            f" prober {cpu.get('prober', 0):.0f}%)"
        )
        lines += [server, client]
        if "machine" in cpu:
            lines.append(
                f"  whole machine {cpu['machine']:.0f}%, of which other processes "
                f"{cpu.get('other_processes', 0):.0f}%"
            )
        cost = s["cpu_cost"]
        if cost:
            lines.append(
                f"  CPU per turn: server {cost['server_cpu_ms_per_turn']:.1f} ms (event "
                f"loop {cost['server_loop_cpu_ms_per_turn']:.1f} ms), client "
                f"{cost['client_cpu_ms_per_turn']:.1f} ms"
            )
    lines += ["", f"{'target':<48} {'p99 ms':>8}  verdict"]
    for key, target in targets.items():
        verdict = "MET" if target["met"] else "NOT MET"
        lines.append(f"{key:<48} {target['p99_ms']:>8.1f}  < {target['max_ms']:g} ms  {verdict}")
    lines += [
        "",
        f"delivery: {delivery['subscribers']} subscribers, {delivery['lost']} lost, "
        f"{delivery['duplicated']} duplicated, {delivery['out_of_order']} out of order, "
        f"{delivery['reconnects']} reconnects",
    ]
    return "\n".join(lines)


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
