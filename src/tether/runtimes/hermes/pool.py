"""The sidecars and the agents they host: one warm serving sidecar for every session's agent,
a bound on the idle agents kept (least recently used first out), and the replacement of a
sidecar that died or had to be given up (docs/hermes.md, "One warm sidecar").

- **Serving**: every new agent goes to the one serving process, started with the server
  (`start_soon`) and warmed once, so no turn pays interpreter start-up or imports.
- **Eviction**: at most `max_agents` agents are kept; opening one more closes the least
  recently used agent that no turn or summary is using. An agent in use is never evicted,
  so the bound may be exceeded while more turns run at once than it allows. An evicted
  session's handle builds a new agent at its next turn, from the log (the history each turn
  carries) and `state.db` (the live tip of its agent session).
- **Death**: when the serving process exits (killed, crashed), the runs on it end
  `interrupted` (streaming.py); a new one is started at once, so the next turns work.
- **Retirement**: an agent whose interrupted turn never ends (a wedged tool) cannot be
  stopped from outside its process, and killing the process would end other sessions' runs.
  Its process is retired instead: it takes no new agent (a new serving process starts), and
  it is killed once every turn on it but the wedged ones has ended.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from pathlib import Path
from typing import Any

from tether.runtimes.hermes.client import AgentChannel, SidecarError, SidecarProcess

log = logging.getLogger("tether.hermes")


class SidecarPool:
    def __init__(
        self,
        python: str,
        env: dict[str, str],
        cwd: Path,
        warm_config: dict[str, Any],
        max_agents: int,
    ):
        self.python = python
        self.env = env
        self.cwd = cwd
        self.warm_config = warm_config
        self.max_agents = max(1, max_agents)
        self.serving: SidecarProcess | None = None
        self.retiring: set[SidecarProcess] = set()
        self.agents: collections.OrderedDict[str, AgentChannel] = collections.OrderedDict()
        self._keys = itertools.count(1)
        self._starting: asyncio.Task[SidecarProcess] | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closing = False

    # -- the serving process ----------------------------------------------------------------
    def start_soon(self) -> None:
        """Start (and warm) the serving sidecar in the background; a turn that comes first
        waits for it."""
        if self._closing or (self.serving is not None and self.serving.alive):
            return
        task = self._start_task()
        task.add_done_callback(_log_start_failure)

    def _start_task(self) -> asyncio.Task[SidecarProcess]:
        if self._starting is None or self._starting.done():
            self._starting = asyncio.create_task(self._start())
        return self._starting

    async def _start(self) -> SidecarProcess:
        process = SidecarProcess(self.python, self.env, self.cwd)
        process.on_exit = self._exited
        await process.start(self.warm_config)
        if self._closing:
            await process.close()
            raise SidecarError("Tether is shutting down")
        self.serving = process
        return process

    async def serving_process(self) -> SidecarProcess:
        current = self.serving
        if current is not None and current.alive and not current.retiring:
            return current
        if self._closing:
            raise SidecarError("Tether is shutting down")
        return await asyncio.shield(self._start_task())

    def _exited(self, process: SidecarProcess) -> None:
        """A sidecar's output ended (it exited, or was killed): its agents are gone."""
        for channel in list(process.channels.values()):
            channel.closed = True
            self.agents.pop(channel.key, None)
        process.channels.clear()
        self.retiring.discard(process)
        if process is self.serving:
            self.serving = None
            if not self._closing and process.ready:
                log.warning(
                    "the hermes sidecar %s exited; starting a new one\n%s",
                    process.pid,
                    process.describe(None),
                )
                self.start_soon()

    # -- agents -------------------------------------------------------------------------------
    async def open(self, config: dict[str, Any]) -> AgentChannel:
        """A new agent in the serving process, built from `config` (runtime.agent_config)."""
        process = await self.serving_process()
        channel = await process.open_agent(f"a{next(self._keys)}", config)
        self.agents[channel.key] = channel
        self._evict()
        return channel

    def touch(self, channel: AgentChannel) -> None:
        if channel.key in self.agents:
            self.agents.move_to_end(channel.key)

    def _evict(self) -> None:
        """Close the least recently used idle agents beyond the bound."""
        excess = len(self.agents) - self.max_agents
        for channel in list(self.agents.values()):
            if excess <= 0:
                break
            if channel.idle:
                self.close(channel)
                excess -= 1

    def close(self, channel: AgentChannel) -> None:
        """Close one agent; the rest of its process goes on."""
        self.agents.pop(channel.key, None)
        channel.process.drop_agent(channel)
        self._reap()

    def release(self, channel: AgentChannel) -> None:
        """A turn or summary on this agent ended: a retiring process may be done now."""
        channel.busy = False
        if channel.process.retiring:
            self._reap()

    def abandon(self, channel: AgentChannel) -> None:
        """The agent's interrupted turn never ended: give it up and retire its process."""
        log.warning(
            "hermes agent %s did not finish its interrupted turn; retiring sidecar %s",
            channel.key,
            channel.process.pid,
        )
        channel.wedged = True
        self.agents.pop(channel.key, None)
        process = channel.process
        process.drop_agent(channel)
        if not process.retiring:
            process.retiring = True
            self.retiring.add(process)
            if process is self.serving:
                self.serving = None
                self.start_soon()
        self._reap()

    def _reap(self) -> None:
        """Kill every retiring process none of whose healthy agents is in use any more (its
        idle agents go with it: their sessions build new ones at their next turn)."""
        for process in list(self.retiring):
            healthy = [c for c in process.channels.values() if not c.wedged]
            if any(not c.idle for c in healthy):
                continue
            self.retiring.discard(process)
            for channel in healthy:
                channel.closed = True
                self.agents.pop(channel.key, None)
            self._spawn(process.kill())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- shutdown ----------------------------------------------------------------------------
    async def aclose(self) -> None:
        self._closing = True
        if self._starting is not None and not self._starting.done():
            # Cancelled, not awaited: a sidecar that hangs starting would hold the shutdown
            # for the whole start-up timeout; cancelling its start kills it.
            self._starting.cancel()
            with contextlib.suppress(BaseException):
                await self._starting
        processes = [p for p in (self.serving, *self.retiring) if p is not None]
        self.serving = None
        self.retiring.clear()
        self.agents.clear()
        await asyncio.gather(*(p.close() for p in processes), return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _log_start_failure(task: asyncio.Task) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.warning("the hermes sidecar could not start (the next turn tries again): %s", exc)
