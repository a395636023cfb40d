"""The Tether side of the sidecar protocol: one `sidecar.py` process, JSON lines both ways,
hosting the agents of many sessions, each reached through its own `AgentChannel`.

Events are read on the event loop by one reader task, in the order the sidecar wrote them,
and routed by their `agent` key into that agent's queue (the current consumer takes from
it); the process's own events (`ready`, `fatal`) go to its own queue, log lines to the
`tether.hermes` logger. stderr (Hermes' own prints and logs) goes to that logger at debug
level; its last lines are kept for error messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("tether.hermes")

SIDECAR = Path(__file__).with_name("sidecar.py")
STARTUP_TIMEOUT = 180.0  # imports of hermes-agent take seconds on a cold cache
LINE_LIMIT = 64 * 1024 * 1024  # one event line (a tool result) may be large
EOF = {"ev": "eof"}


class SidecarError(Exception):
    pass


class AgentChannel:
    """One session's agent in a sidecar: its commands (tagged with its key) and its events.

    `turn_open` (a turn was sent, its `done` not read yet) and `busy` (a turn or a summary is
    being driven through it) keep it from eviction; `wedged` marks an agent whose interrupted
    turn never finished, abandoned with its process (pool.py)."""

    def __init__(self, process: SidecarProcess, key: str):
        self.process = process
        self.key = key
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.closed = False
        self.turn_open = False
        self.busy = False
        self.wedged = False
        self.info: dict[str, Any] = {}

    @property
    def alive(self) -> bool:
        return not self.closed and self.process.alive

    @property
    def idle(self) -> bool:
        return not (self.turn_open or self.busy)

    def send(self, command: dict[str, Any]) -> bool:
        if self.closed:
            return False
        return self.process.send({**command, "agent": self.key})

    def describe(self, message: str | None) -> str:
        return self.process.describe(message)

    def handle_side_event(self, event: dict[str, Any]) -> bool:
        return self.process.handle_side_event(event)


class SidecarProcess:
    def __init__(self, python: str, env: dict[str, str], cwd: Path):
        self.python = python
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # the process's own
        self.channels: dict[str, AgentChannel] = {}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._tasks: list[asyncio.Task] = []
        self.info: dict[str, Any] = {}
        self.ready = False
        self.retiring = False  # takes no new agents; ends once its healthy turns did
        self.on_exit: Callable[[SidecarProcess], None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self.proc.returncode is None
            and not any(t.done() for t in self._tasks[:1])
        )

    async def start(self, config: dict[str, Any]) -> dict[str, Any]:
        """Spawn the sidecar and warm it up (`hello`); returns the `ready` event."""
        started = time.monotonic()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.python,
                str(SIDECAR),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=str(self.cwd),
                limit=LINE_LIMIT,
                start_new_session=True,
            )
        except OSError as exc:  # not executable, not a program, a directory
            raise SidecarError(
                f"{self.python} could not be run ({exc.strerror or exc}); point --hermes-python "
                "(TETHER_HERMES_PYTHON) at the Python that has hermes-agent."
            ) from None
        self._tasks = [
            asyncio.create_task(self._read_stdout()),
            asyncio.create_task(self._read_stderr()),
        ]
        self.send({"op": "hello", "config": config})
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                while True:
                    event = await self.events.get()
                    kind = event.get("ev")
                    if kind == "ready":
                        self.info = event
                        self.ready = True
                        log.info(
                            "hermes sidecar %s ready in %.1f s (hermes-agent %s, warm-up %.1f s)",
                            self.pid,
                            time.monotonic() - started,
                            event.get("version"),
                            float(event.get("seconds") or 0),
                        )
                        return event
                    if kind == "fatal":
                        raise SidecarError(self.describe(event.get("message")))
                    if kind == "eof":
                        code = await self.proc.wait()
                        raise SidecarError(
                            self.describe(
                                f"the Hermes sidecar exited with code {code} before it was ready"
                            )
                        )
        except TimeoutError:
            await self.kill()
            raise SidecarError(
                self.describe(f"the Hermes sidecar did not start in {STARTUP_TIMEOUT:.0f} s")
            ) from None
        except BaseException:
            await self.kill()
            raise

    async def open_agent(self, key: str, config: dict[str, Any]) -> AgentChannel:
        """Build a session's agent in this process; its channel once it is `opened`."""
        channel = AgentChannel(self, key)
        self.channels[key] = channel
        if not self.send({"op": "open", "agent": key, "config": config}):
            self.channels.pop(key, None)
            raise SidecarError(self.describe("the Hermes sidecar exited"))
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                while True:
                    event = await channel.events.get()
                    kind = event.get("ev")
                    if kind == "opened":
                        channel.info = event
                        return channel
                    if kind in ("open_failed", "eof"):
                        raise SidecarError(self.describe(event.get("message")))
                    self.handle_side_event(event)
        except BaseException as exc:
            self.drop_agent(channel)
            if isinstance(exc, TimeoutError):
                raise SidecarError(
                    f"Hermes Agent was not built in {STARTUP_TIMEOUT:.0f} s"
                ) from None
            raise

    def drop_agent(self, channel: AgentChannel) -> None:
        """Close one agent (its turn is interrupted, its resources released); the others in
        this process go on."""
        if channel.closed:
            return
        channel.closed = True
        if self.channels.get(channel.key) is channel:
            del self.channels[channel.key]
        channel.events.put_nowait(EOF)  # whoever still reads it is done
        self.send({"op": "drop", "agent": channel.key})

    def describe(self, message: str | None) -> str:
        tail = "\n".join(list(self.stderr_tail)[-12:])
        text = message or "the Hermes sidecar exited"
        return f"{text}\n{tail}" if tail else text

    def send(self, command: dict[str, Any]) -> bool:
        """Queue one command line (non-blocking); False if the process is gone."""
        if self.proc is None or self.proc.stdin is None or self.proc.returncode is not None:
            return False
        try:
            self.proc.stdin.write((json.dumps(command, ensure_ascii=False) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False
        return True

    def handle_side_event(self, event: dict[str, Any]) -> bool:
        """Events that are not part of a turn's stream; True if consumed."""
        kind = event.get("ev")
        if kind == "log":
            level = getattr(logging, str(event.get("level", "info")).upper(), logging.INFO)
            log.log(
                level if isinstance(level, int) else logging.INFO,
                "hermes: %s",
                event.get("message"),
            )
            return True
        if kind == "status":
            log.debug("hermes status %s: %s", event.get("kind"), event.get("message"))
            return True
        if kind == "fatal":
            log.error("hermes sidecar: %s\n%s", event.get("message"), event.get("traceback"))
            return True
        return False

    def _route(self, event: dict[str, Any]) -> None:
        key = event.get("agent")
        if key is None:
            if not self.handle_side_event(event) or event.get("ev") == "fatal":
                self.events.put_nowait(event)
            return
        channel = self.channels.get(str(key))
        if channel is not None:
            channel.events.put_nowait(event)
        elif event.get("ev") not in ("log", "status"):
            log.debug("hermes event for a closed agent %s: %s", key, event.get("ev"))

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    break
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning("hermes sidecar wrote a non-protocol line: %r", line[:200])
                    continue
                if isinstance(event, dict):
                    self._route(event)
        except (ValueError, asyncio.LimitOverrunError) as exc:
            log.error("hermes sidecar protocol error: %s", exc)
        finally:
            self.events.put_nowait(EOF)
            for channel in list(self.channels.values()):
                channel.events.put_nowait(EOF)
            if self.on_exit is not None:
                self.on_exit(self)

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip()
            self.stderr_tail.append(text)
            log.debug("hermes[%s]: %s", self.proc.pid, text)

    async def close(self, grace: float = 8.0) -> None:
        """Ask the sidecar to finish; kill it if it does not within `grace` seconds."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.send({"op": "close"})
            with contextlib.suppress(Exception):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                await self.kill()
        await self._finish_tasks()

    async def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)  # its own session: tool subprocesses go too
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await self._finish_tasks()

    async def _finish_tasks(self) -> None:
        for task in self._tasks:
            if not task.done():
                try:
                    await asyncio.wait_for(asyncio.shield(task), 2.0)
                except (TimeoutError, asyncio.CancelledError):
                    task.cancel()
