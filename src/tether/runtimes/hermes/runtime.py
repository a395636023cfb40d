"""`HermesRuntime`: Hermes Agent behind Tether, the agents of every session in one warm
sidecar process (pool.py), each session's handle driving its own agent there.

docs/hermes.md explains the design (why a sidecar, the protocol, Stop, steer, proofs).
Nothing here imports hermes-agent: the sidecar runs it in its own interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tether.runtimes.attachments import accepts_mime
from tether.runtimes.base import (
    AgentHistory,
    AgentNews,
    Capabilities,
    ProviderError,
    Runtime,
    RuntimeStream,
    RuntimeUnavailable,
    TurnInput,
)
from tether.runtimes.hermes.agent_view import agent_news
from tether.runtimes.hermes.client import AgentChannel, SidecarError
from tether.runtimes.hermes.lineage import live_tip
from tether.runtimes.hermes.pool import SidecarPool
from tether.runtimes.hermes.proofs import ProofStore
from tether.runtimes.hermes.reconcile import max_row_id
from tether.runtimes.hermes.streaming import run_turn
from tether.runtimes.hermes.watch import AgentWatch
from tether.settings import Settings

log = logging.getLogger("tether.hermes")

PREVIOUS_TURN_GRACE = 30.0  # an interrupted turn gets this long to report `done`
STARTER_CONFIG = """\
# Written by Tether when it created this Hermes home; edit freely (Tether never rewrites it).
compression:
  # Tether models compression as an epoch inside one session.
  in_place: true
approvals:
  # Every command Hermes flags as dangerous is put to you in Tether's page.
  mode: manual
"""


def default_python() -> str | None:
    """This interpreter, when hermes-agent is installed beside Tether (`tether[hermes]`).
    `find_spec` locates the module without importing it (no side effects)."""
    return sys.executable if importlib.util.find_spec("run_agent") is not None else None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.strip().lstrip("-").isdigit() else None


class HermesRuntime(Runtime):
    name = "hermes"
    description = "Hermes Agent in a warm sidecar process (the `hermes` extra)"
    capabilities = Capabilities(
        tools=True,
        attachments=("image", "text"),
        steer=True,
        interrupt=True,
        compression=True,
        agent_sync=True,
        approvals=True,
    )

    def __init__(self, settings: Settings):
        self.settings = settings
        python = (
            settings.hermes_python or os.environ.get("TETHER_HERMES_PYTHON") or default_python()
        )
        if not python:
            raise RuntimeUnavailable(
                "The hermes runtime needs hermes-agent: install it with "
                "`pip install 'tether[hermes]'`, or point --hermes-python (TETHER_HERMES_PYTHON) "
                "at the Python of a virtualenv where `pip install hermes-agent==0.19.0` ran."
            )
        if not Path(python).exists():
            raise RuntimeUnavailable(f"--hermes-python {python!r} does not exist.")
        self.python = python
        configured = os.environ.get("TETHER_HERMES_HOME")
        self.home = Path(configured).expanduser() if configured else settings.data_dir / "hermes"
        if not configured and not self.home.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            (self.home / "config.yaml").write_text(STARTER_CONFIG)
        self.home.mkdir(parents=True, exist_ok=True)
        self.model = settings.model or "hermes"
        self.profile = os.environ.get("TETHER_HERMES_PROFILE") or None
        self.proofs = ProofStore(self.home / "tether-proofs.sqlite")
        self.state_db = self.home / "state.db"
        self._handles: set[HermesHandle] = set()
        # Handles being built for sessions just created (`prepare`), oldest first.
        self._prepared: dict[str, asyncio.Task[HermesHandle]] = {}
        self._utility: HermesHandle | None = None
        self._utility_lock = asyncio.Lock()
        self._last_ts = 0.0
        self.watch = AgentWatch(self.state_db, self.proofs, self.profile)
        cwd = Path(settings.workspace).expanduser() if settings.workspace else self.home
        self.pool = SidecarPool(
            python, self.child_env(), cwd, self.agent_config(""), settings.hermes_agents
        )

    @property
    def context_window(self) -> int | None:
        return self.settings.context_window

    def accepts(self, mime: str) -> bool:
        return accepts_mime(mime)

    # -- process setup ----------------------------------------------------------------------
    def child_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
        }
        env.update(
            HERMES_HOME=str(self.home),
            HERMES_SESSION_SOURCE="tether",
            PYTHONUNBUFFERED="1",
            PYTHONIOENCODING="utf-8",
        )
        if self.settings.workspace is not None:
            env["TERMINAL_CWD"] = str(Path(self.settings.workspace).expanduser())
        return env

    def agent_config(self, agent_session_id: str) -> dict[str, Any]:
        s = self.settings
        config: dict[str, Any] = {"session_id": agent_session_id}
        if s.base_url:
            config.update(
                base_url=s.base_url,
                provider="custom",
                api_key=os.environ.get(s.api_key_env) or "not-needed",
            )
        if s.model:
            config["model"] = s.model
        config["max_tokens"] = _env_int("TETHER_HERMES_MAX_TOKENS")
        config["max_iterations"] = _env_int("TETHER_HERMES_MAX_ITERATIONS")
        delay = os.environ.get("TETHER_HERMES_TOOL_DELAY")
        if delay:
            config["tool_delay"] = float(delay)
        approval_seconds = os.environ.get("TETHER_HERMES_APPROVAL_SECONDS")
        if approval_seconds:
            config["approval_seconds"] = float(approval_seconds)
        clarify_seconds = os.environ.get("TETHER_HERMES_CLARIFY_SECONDS")
        if clarify_seconds:
            config["clarify_seconds"] = float(clarify_seconds)
        toolsets = os.environ.get("TETHER_HERMES_TOOLSETS")
        if toolsets is not None:
            config["toolsets"] = [t.strip() for t in toolsets.split(",") if t.strip()]
        return config

    async def start(self) -> None:
        """With the server: the sidecar starts and warms up in the background."""
        self.pool.start_soon()

    async def open_agent(self, session_id: str, agent_session_id: str) -> AgentChannel:
        config = {**self.agent_config(agent_session_id), "approval_session_key": session_id}
        try:
            return await self.pool.open(config)
        except SidecarError as exc:
            raise RuntimeUnavailable(f"Hermes Agent could not start: {exc}") from exc

    def next_timestamp(self) -> float:
        """A `persist_user_timestamp` no other turn of this server used."""
        ts = max(time.time(), self._last_ts + 0.001)
        self._last_ts = ts
        return ts

    # -- the runtime protocol ---------------------------------------------------------------
    def prepare(self, session_id: str) -> None:
        """A session was just created: build its agent now (10-30 ms in the warm sidecar,
        plus the system prompt its first turn needs), while its user types; `open_handle`
        takes it. At most `--hermes-agents` wait to be taken; the oldest one beyond is
        closed (its turn then builds its own)."""
        if session_id in self._prepared:
            return
        task = asyncio.ensure_future(self._build_handle(session_id))
        task.add_done_callback(_retrieved)  # a failure is the first turn's to report
        self._prepared[session_id] = task
        while len(self._prepared) > self.pool.max_agents:
            oldest = next(iter(self._prepared))
            self._prepared.pop(oldest).add_done_callback(_close_unused)

    async def open_handle(self, session_id: str) -> HermesHandle:
        """The session's handle, at once: its turn's stream builds its agent (or takes the
        one `prepare` is building), where a Stop ends the wait. The engine waits for this
        call, and no Stop ends that wait; a sidecar still starting takes seconds, minutes
        when it hangs."""
        handle = HermesHandle(self, session_id, await self._agent_session(session_id))
        handle.prepared = self._prepared.pop(session_id, None)
        self._handles.add(handle)
        return handle

    async def _agent_session(self, session_id: str) -> str:
        """The Tether session's id, or the newest agent session bound to it (a continuation:
        its own turns rotated into it, or one created from the lineage)."""
        bound = await asyncio.to_thread(self.proofs.agent_sessions, session_id)
        return await asyncio.to_thread(
            live_tip, self.state_db, bound[-1] if bound else session_id, self.profile
        )

    async def _build_handle(self, session_id: str) -> HermesHandle:
        handle = HermesHandle(self, session_id, await self._agent_session(session_id))
        await handle.ensure_started()
        return handle

    async def stream(self, turn: TurnInput) -> RuntimeStream:
        handle = await self.open_handle(turn.session_id)
        try:
            async with contextlib.aclosing(handle.stream(turn)) as events:
                async for event in events:
                    yield event
        finally:
            await handle.close()

    async def summarize(self, messages: list[dict[str, Any]], model: str | None) -> str:
        from tether.runtimes.compression import clean_summary, summary_request

        async with self._utility_lock:
            if self._utility is None or not self._utility.alive:
                self._utility = HermesHandle(self, "tether-utility", "tether-utility")
                await self._utility.ensure_started()
        text = await self._utility.complete(
            summary_request(messages, window=self.context_window), model
        )
        summary = clean_summary(text)
        if not summary:
            raise ProviderError(
                "bad_response",
                "Hermes Agent's model returned an empty "
                "summary when asked to compress the conversation.",
            )
        return summary

    # -- what other clients of the profile did (runs/agent_sync.py) ----------------------------
    async def agent_news(
        self, session_id: str, watermark: int, continued: Sequence[tuple[str, int]] = ()
    ) -> AgentNews | None:
        """None while one of the session's turns (or of a session it continues) is still
        being written by the agent (an interrupted turn finishes writing after Tether's run
        has ended)."""
        writing = {session_id, *(ancestor for ancestor, _ in continued)}
        if any(h.session_id in writing and h.turn_open for h in self._handles):
            return None
        return await asyncio.to_thread(
            agent_news,
            self.state_db,
            self.proofs,
            session_id,
            watermark,
            self.profile,
            continued=continued,
        )

    def agent_history(self) -> AgentHistory:
        return self

    async def agent_changed(self) -> list[str]:
        """The sessions whose agent rows moved; one pragma when nothing did (watch.py)."""
        return await asyncio.to_thread(self.watch.changed)

    async def agent_started_elsewhere(self, exists: Callable[[str], bool]) -> list[dict[str, Any]]:
        """Sessions a person started in the Hermes CLI/TUI that no existing Tether session
        drives (`exists` says which Tether sessions exist), when anything moved."""
        return await asyncio.to_thread(self.watch.started_elsewhere, exists)

    async def agent_look_again(self) -> None:
        """The last pass failed: the next one looks although nothing moved since."""
        await asyncio.to_thread(self.watch.look_again)

    async def bind(self, session_id: str, agent_session_id: str) -> bool:
        return await asyncio.to_thread(self.proofs.bind, session_id, agent_session_id)

    async def agent_adopted(self, agent_session_id: str) -> None:
        await asyncio.to_thread(self.proofs.adopted, agent_session_id)

    async def agent_owner(self, agent_session_id: str) -> str | None:
        """The Tether session bound to this agent session, if any."""
        return await asyncio.to_thread(self.proofs.tether_session_of, agent_session_id)

    async def aclose(self) -> None:
        for task in self._prepared.values():
            task.add_done_callback(_close_unused)
        self._prepared.clear()
        handles = list(self._handles) + ([self._utility] if self._utility else [])
        await asyncio.gather(*(h.close() for h in handles), return_exceptions=True)
        self._handles.clear()
        self._utility = None
        await self.pool.aclose()
        await asyncio.to_thread(self.watch.close)


def _retrieved(task: asyncio.Task[HermesHandle]) -> None:
    if not task.cancelled():
        task.exception()


def _close_unused(task: asyncio.Task[HermesHandle]) -> None:
    """A prepared handle nobody will take: close its agent once it is built."""
    if not task.cancelled() and task.exception() is None:
        asyncio.ensure_future(task.result().close())


class HermesHandle:
    """One Tether session's agent (in the shared sidecar), reused across its turns; built
    again when it was evicted or its sidecar was replaced."""

    def __init__(self, runtime: HermesRuntime, session_id: str, agent_session_id: str):
        self.runtime = runtime
        self.session_id = session_id
        self.agent_session_id = agent_session_id
        self.channel: AgentChannel | None = None
        self.turn_stream_id: str | None = None  # the last turn sent
        self.closed = False
        self._requests = 0
        self.prepared: asyncio.Task[HermesHandle] | None = None  # `prepare` builds its agent

    @property
    def turn_open(self) -> bool:
        """A turn was sent and its `done` not read yet."""
        return self.channel is not None and self.channel.turn_open

    @turn_open.setter
    def turn_open(self, value: bool) -> None:
        if self.channel is not None:
            self.channel.turn_open = value

    @property
    def alive(self) -> bool:
        return self.channel is not None and self.channel.alive

    async def ensure_started(self) -> AgentChannel:
        if self.prepared is not None:
            await self._take_prepared()
        if self.channel is not None and not self.channel.alive:
            self.channel = None  # evicted, or its sidecar is gone
        if self.channel is None:
            # A new agent continues the newest authorized continuation, if the agent (or
            # its CLI) rotated the session meanwhile.
            self.agent_session_id = await asyncio.to_thread(
                live_tip, self.runtime.state_db, self.agent_session_id, self.runtime.profile
            )
            channel = await self.runtime.open_agent(self.session_id, self.agent_session_id)
            if self.closed:  # closed while it was being built
                self.runtime.pool.close(channel)
                raise RuntimeUnavailable("The session's Hermes agent was closed.")
            self.channel = channel
        self.runtime.pool.touch(self.channel)
        return self.channel

    async def _take_prepared(self) -> None:
        """The agent `prepare` built for this session, once it is; one that failed or died
        meanwhile is built again (`ensure_started`). Stopped while it is being built, it is
        closed when it is."""
        task, self.prepared = self.prepared, None
        if task is None:
            return
        try:
            built = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_close_unused)
            raise
        except Exception:
            return
        if built.alive and self.channel is None:
            self.channel, built.channel = built.channel, None
            self.agent_session_id = built.agent_session_id
        await built.close()

    def interrupt(self) -> None:
        if self.channel is not None and self.channel.turn_open:
            self.channel.send({"op": "interrupt", "message": "Stopped from Tether"})

    def release(self, channel: AgentChannel) -> None:
        """The turn (or summary) driven through `channel` is over on Tether's side."""
        self.runtime.pool.release(channel)

    async def close(self) -> None:
        self.closed = True
        self.runtime._handles.discard(self)
        if self.prepared is not None:  # never taken: close it once it is built
            self.prepared.add_done_callback(_close_unused)
            self.prepared = None
        if self.channel is not None:
            self.runtime.pool.close(self.channel)
            self.channel = None

    async def settle_previous(self) -> None:
        """Wait (bounded) for an interrupted turn's `done`; give up an agent that hangs (its
        sidecar is retired once the other sessions' turns on it are over, pool.py)."""
        channel = self.channel
        if channel is None or not channel.turn_open:
            return
        deadline = time.monotonic() + PREVIOUS_TURN_GRACE
        while channel.turn_open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "the hermes agent of %s did not finish its interrupted turn", self.session_id
                )
                self.give_up()
                return
            try:  # not wait_for: on Python 3.11 it can swallow a cancel
                async with asyncio.timeout(remaining):
                    event = await channel.events.get()
            except TimeoutError:
                continue
            if event.get("ev") in ("done", "eof"):
                await self.turn_done(event)

    def give_up(self) -> None:
        """Abandon this session's agent (its interrupted turn never ended): its sidecar takes
        no new agent and ends once the other sessions' turns on it did; this session's next
        turn builds a new agent in a new sidecar."""
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.turn_open = False
            self.runtime.pool.abandon(channel)

    def turn_begins(self, stream_id: str) -> None:
        """Note where `state.db` stands: the rows after it, until the turn is done, are this
        turn's (its user row, its replies, a compaction it did)."""
        self.turn_stream_id = stream_id
        self.runtime.proofs.turn_started(
            self.session_id, stream_id, max_row_id(self.runtime.state_db)
        )

    async def turn_done(self, event: dict[str, Any]) -> None:
        """The agent finished the turn (also an interrupted one, later): everything it wrote
        is in `state.db` now."""
        self.turn_open = False
        if event.get("session_id"):
            self.agent_session_id = str(event["session_id"])
            await asyncio.to_thread(
                self.runtime.proofs.bind, self.session_id, self.agent_session_id
            )
        if self.turn_stream_id is not None:
            written = event.get("row_ids")
            await asyncio.to_thread(
                self._record_turn_end,
                self.turn_stream_id,
                [int(i) for i in written] if isinstance(written, list) else None,
            )

    def _record_turn_end(self, stream_id: str, written: list[int] | None) -> None:
        self.runtime.proofs.turn_ended(stream_id, max_row_id(self.runtime.state_db), written)

    async def complete(self, messages: list[dict[str, Any]], model: str | None) -> str:
        channel = await self.ensure_started()
        channel.busy = True
        try:
            self._requests += 1
            request_id = f"c{self._requests}"
            channel.send({"op": "complete", "id": request_id, "messages": messages, "model": model})
            while True:
                event = await channel.events.get()
                if event.get("ev") == "eof":
                    raise ProviderError("internal", channel.describe("The Hermes sidecar exited."))
                if event.get("ev") == "completion" and event.get("id") == request_id:
                    if event.get("error"):
                        raise ProviderError(event.get("error_code") or "internal", event["error"])
                    return str(event.get("text") or "")
                channel.handle_side_event(event)
        finally:
            self.release(channel)

    def stream(self, turn: TurnInput) -> RuntimeStream:
        return run_turn(self, turn)
