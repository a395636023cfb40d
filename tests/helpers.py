"""Shared test tools: a real `tether serve` subprocess and an SSE reader over real HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`tether serve` in a subprocess on a loopback port, with its own data directory."""

    def __init__(self, data_dir: Path, *extra: str, env: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.extra = list(extra)
        self.env = env or {}
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"server-{self.port}.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20) -> ServerProcess:
        args = [
            sys.executable,
            "-m",
            "tether",
            "serve",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--no-browser",
            "--heartbeat-seconds",
            "0.3",
            "--log-level",
            "warning",
            *self.extra,
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/api/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 10)
        return httpx.Client(base_url=self.base_url, **kwargs)


@contextmanager
def running_server(data_dir: Path, *extra: str, **kwargs: Any) -> Iterator[ServerProcess]:
    server = ServerProcess(data_dir, *extra, **kwargs).start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()


@contextmanager
def rotated_conversation(data_dir: Path) -> Iterator[tuple[httpx.Client, str, str]]:
    """A demo server (`--compression-mode rotate`, a 256-token window) whose first turn,
    crossing 80% of the window, continued the conversation in a child: (a client, the
    parent, the child), both idle."""
    rotating = ("--context-window", "256", "--compression-mode", "rotate")
    with (
        running_server(data_dir, *rotating, env={"TETHER_DEMO_DELAY": "0.002"}) as srv,
        srv.client() as client,
    ):
        parent = new_session(client, "Long talk")
        start_turn(client, parent, "hello " * 150)
        child = wait_until(
            lambda: session_body(client, parent)["continuation_session_id"], what="a rotation"
        )
        wait_idle(client, parent)
        wait_idle(client, child)
        yield client, parent, child


@contextmanager
def replicas(
    tmp_path: Path, url: str, *envs: dict[str, str]
) -> Iterator[list[tuple[ServerProcess, httpx.Client]]]:
    """One `tether serve --database-url url` per env, each on a data directory of its own
    (`a`, `b`, `c`, ...), with a client: replicas behind a load balancer."""
    assert len(envs) <= 8, "replicas a to h"
    with ExitStack() as stack:
        out = []
        for name, env in zip("abcdefgh", envs, strict=False):
            server = stack.enter_context(
                running_server(tmp_path / name, "--database-url", url, env=env)
            )
            out.append((server, stack.enter_context(server.client())))
        yield out


class SSEFrame(dict):
    @property
    def event(self) -> str:
        return self["event"]

    @property
    def json(self) -> Any:
        return json.loads(self["data"])


def iter_sse(response: httpx.Response) -> Iterator[SSEFrame]:
    """Parse an SSE body line by line (comments skipped), yielding frames as dicts."""
    frame: dict[str, Any] = {}
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data or frame:
                yield SSEFrame(
                    event=frame.get("event", "message"), id=frame.get("id"), data="\n".join(data)
                )
            frame, data = {}, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                frame[name] = value


def read_events(
    client: httpx.Client,
    session_id: str,
    *,
    until_seq: int | None = None,
    after: str | None = None,
    headers: dict[str, str] | None = None,
    stop_on: str | None = None,
    max_frames: int = 100_000,
    timeout: float = 10,
) -> list[SSEFrame]:
    """Frames of the session stream until one with seq >= until_seq (or a frame of type
    stop_on) arrives."""
    params = {} if after is None else {"after": after}
    frames: list[SSEFrame] = []
    deadline = time.monotonic() + timeout
    with client.stream(
        "GET",
        f"/api/sessions/{session_id}/events",
        params=params,
        headers=headers or {},
        timeout=timeout,
    ) as response:
        assert response.status_code == 200, response.read()
        for frame in iter_sse(response):
            frames.append(frame)
            if stop_on is not None and frame.event == stop_on:
                break
            if until_seq is not None and frame.get("id") and int(frame["id"]) >= until_seq:
                break
            if (
                until_seq is not None
                and frame.event == "session.snapshot"
                and frame.json["session"]["last_seq"] >= until_seq
            ):
                break
            if len(frames) >= max_frames or time.monotonic() > deadline:
                break
    return frames


def seqs(frames: list[SSEFrame]) -> list[int]:
    return [int(f["id"]) for f in frames if f.get("id")]


def new_session(client: httpx.Client, title: str | None = None) -> str:
    response = client.post("/api/sessions", json={} if title is None else {"title": title})
    assert response.status_code == 201, response.text
    return response.json()["session"]["session_id"]


def start_turn(client: httpx.Client, session_id: str, message: str, **extra: Any) -> dict:
    response = client.post(
        "/api/chat/start", json={"session_id": session_id, "message": message, **extra}
    )
    assert response.status_code == 200, response.text
    return response.json()


def session_body(client: httpx.Client, session_id: str) -> dict:
    response = client.get("/api/session", params={"session_id": session_id})
    assert response.status_code == 200, response.text
    return response.json()["session"]


def wait_idle(client: httpx.Client, session_id: str, timeout: float = 20) -> dict:
    """Poll until no worker occupies the session; return the session body."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = session_body(client, session_id)
        if not body["busy"] and body["live"] is None:
            return body
        time.sleep(0.05)
    raise AssertionError(f"session {session_id} still busy after {timeout} s")


def run_events(
    client: httpx.Client, session_id: str, stream_id: str, timeout: float = 20
) -> list[SSEFrame]:
    """Every frame of the session from the start until this stream's run.finished."""
    frames = []
    with client.stream(
        "GET", f"/api/sessions/{session_id}/events", params={"after": "0"}, timeout=timeout
    ) as response:
        for frame in iter_sse(response):
            frames.append(frame)
            if frame.event == "run.finished" and frame.json["stream_id"] == stream_id:
                break
    return frames


def fold_frames(frames: list[SSEFrame]) -> dict:
    """What a client folds from the frames it received: the same pure projection the
    server uses, so two clients (or a client and the server) can be compared."""
    from tether.events import Event
    from tether.projections.transcript import TranscriptFold

    fold = TranscriptFold()
    for frame in frames:
        if frame.get("id"):
            fold.apply(Event.from_envelope(frame.json))
    return fold.view()


def wait_until(predicate: Callable[[], Any], timeout: float = 10, what: str = "") -> Any:
    """Poll until `predicate()` is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


def live_timeline(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    live = session_body(client, session_id)["live"]
    return [] if live is None else live["timeline"]
