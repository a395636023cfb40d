"""One load run of `load_test.py` against a started server: create the sessions, connect the
subscribers, take the idle baseline, drive turns until the deadline, wait for every subscriber
to catch up; meanwhile sample the server's RSS and both processes' CPU. Returns the raw
`Outcome`: judging and printing it is `load_report.py`'s job."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from benchkit import machine_busy_ticks  # noqa: E402 - puts tests/ on sys.path
from load_traffic import (
    DRAIN_TIMEOUT,
    KEEPALIVE_EXPIRY,
    TIMEOUT,
    LoadFake,
    Prober,
    SanityError,
    Session,
    Subscriber,
    Turns,
    drive,
    loop_lag,
    subscribe,
)

RSS_INTERVAL = 0.25
CATCH_UP_TIMEOUT = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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
