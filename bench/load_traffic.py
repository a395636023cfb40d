"""The clients that make `load_test.py`'s load and record what arrives: the fake model, the
SSE subscribers, the drivers that keep one run going per session, the prober of the two GETs
and the event-loop lag probe."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import benchkit  # noqa: F401 - first: puts tests/ on sys.path
import httpx

from fake_openai import FakeOpenAI, Reply, delay, reasoning, reply, text  # noqa: E402

LAG_INTERVAL = 0.02
DRAIN_TIMEOUT = 60.0
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# Below uvicorn's 5 s keep-alive timeout: a pooled connection is never reused just as the
# server closes it (httpx's default expiry is also 5 s, which races).
KEEPALIVE_EXPIRY = 2.0


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
