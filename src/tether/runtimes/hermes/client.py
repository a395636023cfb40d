"""The Tether side of the sidecar protocol: one `sidecar.py` process, JSON lines both ways.

Events are read on the event loop by one reader task, in the order the sidecar wrote them,
into a queue the current consumer takes from. stderr (Hermes' own prints and logs) goes to
the `tether.hermes` logger at debug level; its last lines are kept for error messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("tether.hermes")

SIDECAR = Path(__file__).with_name("sidecar.py")
STARTUP_TIMEOUT = 180.0  # imports of hermes-agent take seconds on a cold cache
LINE_LIMIT = 64 * 1024 * 1024  # one event line (a tool result) may be large
EOF = {"ev": "eof"}


class SidecarError(Exception):
    pass


class SidecarProcess:
    def __init__(self, python: str, env: dict[str, str], cwd: Path):
        self.python = python
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._tasks: list[asyncio.Task] = []
        self.info: dict[str, Any] = {}

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self.proc.returncode is None
            and not any(t.done() for t in self._tasks[:1])
        )

    async def start(self, config: dict[str, Any]) -> dict[str, Any]:
        """Spawn the sidecar and build its agent; returns the `ready` event."""
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
                        return event
                    if kind in ("fatal", "eof"):
                        raise SidecarError(self.describe(event.get("message")))
                    self.handle_side_event(event)
        except TimeoutError:
            await self.kill()
            raise SidecarError(
                self.describe(f"the Hermes sidecar did not start in {STARTUP_TIMEOUT:.0f} s")
            ) from None
        except BaseException:
            await self.kill()
            raise

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
        return False

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
                    self.events.put_nowait(event)
        except (ValueError, asyncio.LimitOverrunError) as exc:
            log.error("hermes sidecar protocol error: %s", exc)
        finally:
            self.events.put_nowait(EOF)

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode("utf-8", errors="replace").rstrip()
            self.stderr_tail.append(text)
            log.debug("hermes[%s]: %s", self.proc.pid, text)

    async def close(self, grace: float = 5.0) -> None:
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
