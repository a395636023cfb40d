"""One Tether session's agent inside the shared sidecar: its `run_agent.AIAgent`, its turn,
its steers, its questions and every event it emits, tagged with its agent key.

Runs in the sidecar's interpreter (hermes-agent's virtualenv), imported by sidecar.py after
the protocol streams moved off fd 0 and 1. Many of these live in one process; each keeps
everything of its own (the agent, its turn thread, its prompts, its request clients), and
what Hermes keeps process-wide is routed back to the right one (the steer marker, below).

Threads: a turn runs on its own thread (so `interrupt` and `steer` arrive while it runs);
Hermes fires callbacks on the turn thread, its HTTP worker threads and tool threads.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from sidecar_prompts import UserPrompts  # beside this module, stdlib only
from sidecar_system_prompt import SystemPrompt

SUMMARY_MARKER = "[CONTEXT COMPACTION"
Emit = Callable[..., None]

_TURN = threading.local()  # .session: the Session whose turn runs on this thread


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _estimate(messages: list[Any]) -> int:
    return sum(
        len(_text_of(m.get("content")) if isinstance(m, dict) else "")
        + len(json.dumps(m.get("tool_calls") or "") if isinstance(m, dict) else "")
        for m in messages
    ) // 4 + 4 * len(messages)


def install_steer_marker(sessions: Callable[[], list[Session]]) -> None:
    """`format_steer_marker` is called exactly when an agent appends pending steer text to a
    tool result (or its next request): that is where that agent took its steers. It is one
    module function for the whole process, so it is wrapped once and routed to the session
    whose turn runs on the calling thread (Hermes calls it on the agent's own thread), or
    else to the one whose forwarded text the marker starts with."""
    import agent.agent_runtime_helpers as helpers
    import agent.prompt_builder as builder

    original = builder.format_steer_marker

    def marker(steer_text: str) -> str:
        owner = getattr(_TURN, "session", None)
        if owner is None:
            owner = next((s for s in sessions() if s.owns_steer(steer_text)), None)
        if owner is not None:
            owner.steers_taken(steer_text)
        return original(steer_text)

    builder.format_steer_marker = marker
    if getattr(helpers, "format_steer_marker", None) is original:
        helpers.format_steer_marker = marker


class Session:
    """One agent and the bookkeeping of its current turn."""

    def __init__(self, key: str, config: dict[str, Any], emit: Emit):
        from hermes_state import SessionDB
        from run_agent import AIAgent

        self.key = key
        self.config = config
        self.emit: Emit = lambda event, **data: emit(event, agent=key, **data)
        self.turn_id: str | None = None
        self.turn_thread: threading.Thread | None = None
        self.turn_running = False  # until its `done` is emitted (its thread ends just after)
        self.forwarded: list[tuple[str, str]] = []  # (steer_id, text) given to agent.steer()
        self.steer_lock = threading.Lock()
        self.tool_meta: dict[str, dict[str, Any]] = {}
        self.after_tool = False
        self.last_usage: tuple[int, int] | None = None
        self.closed = False
        # The connections of the per-request clients this agent made: a Stop shuts down
        # their sockets, and no other agent's.
        self.connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self.prompts = UserPrompts(
            self.emit,
            float(config.get("approval_seconds") or 300),
            config.get("clarify_seconds"),
        )
        session = self

        class TetherAgent(AIAgent):
            def _compress_context(self, messages, system_message, **kwargs):  # noqa: ANN001
                return session.compress(
                    super()._compress_context, messages, system_message, **kwargs
                )

            def _build_system_prompt(self, system_message: Any = None) -> str:
                prebuilt = session.system_prompt.take_prebuilt(self, system_message)
                if prebuilt is not None:
                    return prebuilt
                return super()._build_system_prompt(system_message)

            def _create_request_openai_client(self, **kwargs: Any) -> Any:
                if session.turn_running:
                    session.system_prompt.saw_request(
                        kwargs.get("api_kwargs"), self.ephemeral_system_prompt
                    )
                client = super()._create_request_openai_client(**kwargs)
                session.watch_connections(client)
                return client

        class TetherSessionDB(SessionDB):
            """Notes the id of every message row this agent writes (its turns' evidence:
            another client may write into the same agent session meanwhile). Hermes writes
            rows through `append_message`, and a compaction through `_insert_message_rows`
            inside its own write transaction, so the newest `inserted` ids are that call's."""

            def append_message(self, *args: Any, **kwargs: Any) -> Any:
                row_id = super().append_message(*args, **kwargs)
                if isinstance(row_id, int):
                    session.written.append(row_id)
                return row_id

            def _insert_message_rows(self, conn, session_id, messages):  # noqa: ANN001
                inserted, calls = super()._insert_message_rows(conn, session_id, messages)
                last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
                session.written.extend(range(int(last) - inserted + 1, int(last) + 1))
                return inserted, calls

        self.written: list[int] = []  # row ids the agent wrote during the current turn
        self.system_prompt = SystemPrompt(lambda text: self.emit("system_prompt", text=text))
        self._base = AIAgent
        kwargs = agent_kwargs(config)
        kwargs.update(
            session_id=config["session_id"],
            session_db=TetherSessionDB(),
            tool_start_callback=self.on_tool_start,
            tool_complete_callback=self.on_tool_complete,
            tool_progress_callback=self.on_tool_progress,
            reasoning_callback=self.on_reasoning,
            stream_delta_callback=self.on_delta,
            interim_assistant_callback=self.on_interim,
            status_callback=self.on_status,
            step_callback=self.on_step,
            clarify_callback=self.prompts.on_clarify,
        )
        self.agent = TetherAgent(**kwargs)

    # -- the system prompt (sidecar_system_prompt.py) ---------------------------------------
    def prebuild_prompt(self) -> None:
        self.system_prompt.prebuild(self.agent, self._base._build_system_prompt)

    # -- callbacks (any thread) -------------------------------------------------------------
    def on_reasoning(self, text: Any) -> None:
        if isinstance(text, str) and text:
            self.emit("reasoning", text=text)

    def on_delta(self, text: Any) -> None:
        if not isinstance(text, str) or not text:
            return
        if self.after_tool:  # the agent's paragraph break after a tool round
            text = text.lstrip("\n")
            if not text:
                return
            self.after_tool = False
        self.emit("text", text=text)

    def on_interim(self, text: Any, already_streamed: bool = False, **_: Any) -> None:
        if isinstance(text, str) and text.strip() and not already_streamed:
            self.emit("text", text=text, interim=True)

    def on_tool_progress(self, kind: Any, name: Any = None, *args: Any, **kwargs: Any) -> None:
        if kind == "tool.completed" and isinstance(name, str):
            self.tool_meta[name] = {
                "is_error": bool(kwargs.get("is_error")),
                "duration": kwargs.get("duration") or 0,
            }

    def on_tool_start(self, call_id: Any, name: Any, args: Any) -> None:
        self._usage()
        self.emit(
            "tool_started",
            call_id=str(call_id),
            name=str(name),
            args=args if isinstance(args, dict) else {"value": args},
        )

    def on_tool_complete(self, call_id: Any, name: Any, args: Any, result: Any) -> None:
        meta = self.tool_meta.pop(str(name), {})
        self.emit(
            "tool_completed",
            call_id=str(call_id),
            name=str(name),
            result=result if isinstance(result, str) else json.dumps(result, default=str),
            is_error=meta.get("is_error", False),
            duration_ms=int(float(meta.get("duration") or 0) * 1000),
        )
        self.after_tool = True

    def on_status(self, kind: Any, message: Any = None, *_: Any) -> None:
        self.emit("status", kind=str(kind), message=str(message))

    def on_step(self, *_: Any, **__: Any) -> None:
        self._usage()

    def _usage(self) -> None:
        compressor = (
            getattr(self.agent, "context_compressor", None) if hasattr(self, "agent") else None
        )
        prompt = getattr(compressor, "last_prompt_tokens", 0) or 0
        completion = getattr(compressor, "last_completion_tokens", 0) or 0
        if isinstance(prompt, int) and prompt > 0 and (prompt, completion) != self.last_usage:
            self.last_usage = (prompt, completion)
            self.emit("usage", prompt_tokens=prompt, completion_tokens=int(completion or 0))

    # -- compression ------------------------------------------------------------------------
    def compress(self, original: Any, messages: list, system_message: Any, **kwargs: Any):
        pass_id = f"cmp_{uuid.uuid4().hex[:12]}"
        old_session = self.agent.session_id
        before = kwargs.get("approx_tokens") or _estimate(messages)
        self.emit("compression_started", pass_id=pass_id)
        result = original(messages, system_message, **kwargs)
        compressed = result[0] if isinstance(result, tuple) else result
        summary = next(
            (
                _text_of(m.get("content"))
                for m in compressed
                if isinstance(m, dict) and SUMMARY_MARKER in _text_of(m.get("content"))
            ),
            None,
        )
        changed = (compressed is not messages and len(compressed) != len(messages)) or (
            self.agent.session_id != old_session
        )
        if summary is not None and changed:
            self.emit(
                "compression_completed",
                pass_id=pass_id,
                tokens_before=int(before),
                tokens_after=_estimate(compressed),
                summary=summary,
                in_place=bool(getattr(self.agent, "_last_compaction_in_place", False)),
                old_session_id=old_session,
                session_id=self.agent.session_id,
            )
        else:
            self.emit("compression_skipped", pass_id=pass_id)
        return result

    # -- steer ------------------------------------------------------------------------------
    def steer(self, steer_id: str, text: str) -> None:
        with self.steer_lock:
            if self.agent.steer(text):
                self.forwarded.append((steer_id, text.strip()))
            else:
                self.emit("steer_taken", steer_ids=[steer_id])  # empty text: nothing to take

    def owns_steer(self, steer_text: str) -> bool:
        with self.steer_lock:
            return bool(self.forwarded) and steer_text.startswith(self.forwarded[0][1])

    def steers_taken(self, steer_text: str) -> None:
        with self.steer_lock:
            taken: list[str] = []
            rest = steer_text
            while self.forwarded and rest:
                steer_id, text = self.forwarded[0]
                if not rest.startswith(text):
                    break
                taken.append(steer_id)
                self.forwarded.pop(0)
                rest = rest[len(text) :].lstrip("\n")
            if not taken and self.forwarded:  # not a clean prefix: everything pending went
                taken = [steer_id for steer_id, _ in self.forwarded]
                self.forwarded.clear()
        if taken:
            self.emit("steer_taken", steer_ids=taken)

    # -- a turn -----------------------------------------------------------------------------
    def start_turn(self, cmd: dict[str, Any]) -> None:
        if self.turn_running:
            self.emit(
                "done",
                id=cmd.get("id"),
                failed=True,
                error="a turn is already running",
                error_code="internal",
            )
            return
        self.turn_id = cmd.get("id")
        self.turn_running = True
        self.turn_thread = threading.Thread(
            target=self._run_turn, args=(cmd,), name=f"tether-turn-{self.key}", daemon=True
        )
        self.turn_thread.start()

    def _run_turn(self, cmd: dict[str, Any]) -> None:
        # Ask the user through Tether before a flagged command (never auto-approve): an
        # interactive context with our prompt; Hermes carries both to its tool threads. All
        # three are this thread's own (context variables, a thread-local), so agents of other
        # sessions in this process keep theirs.
        from tools.approval import set_current_session_key, set_hermes_interactive_context
        from tools.terminal_tool import set_approval_callback

        _TURN.session = self
        set_hermes_interactive_context(True)
        # "Allow for this session" is keyed by the Tether session, which outlives the agent
        # sessions its compressions rotate into.
        set_current_session_key(str(self.config.get("approval_session_key") or "default"))
        set_approval_callback(self.prompts.on_approval)
        self.after_tool = False
        # Hermes' own mark for the paragraph break it prepends to the text after a tool
        # round: a turn that ended during or right after its tools (Stop, a failure, the
        # iteration limit) leaves it set, and this turn's answer would open with "\n\n".
        self.agent._stream_needs_break = False
        self.last_usage = None
        self.tool_meta.clear()
        self.written = []
        self.system_prompt.new_turn()
        try:
            if cmd.get("model") and cmd["model"] != self.agent.model:
                self.agent.model = cmd["model"]
            # Set every turn, so a prompt removed since the last one is gone: Hermes appends it
            # to its own system prompt at each request and never stores it in state.db.
            self.agent.ephemeral_system_prompt = cmd.get("system_prompt") or None
            self.emit(
                "accepted",
                id=cmd.get("id"),
                session_id=self.agent.session_id,
                persist_user_timestamp=cmd.get("persist_user_timestamp"),
            )
            result = self.agent.run_conversation(
                cmd["message"],
                conversation_history=cmd.get("history") or [],
                task_id=cmd.get("task_id"),
                persist_user_message=cmd.get("persist_user_message"),
                persist_user_timestamp=cmd.get("persist_user_timestamp"),
            )
            self._usage()
            if result.get("interrupted"):
                self.shutdown_request_sockets()
            self._done(
                id=cmd.get("id"),
                session_id=self.agent.session_id,
                interrupted=bool(result.get("interrupted")),
                failed=bool(result.get("failed")) and not result.get("interrupted"),
                completed=bool(result.get("completed")),
                error=result.get("error"),
                error_code=_error_code(result),
                leftover_steer_ids=self._leftover(),
                row_ids=list(self.written),
                final_response=result.get("final_response"),
                turn_exit_reason=result.get("turn_exit_reason"),
            )
        except BaseException as exc:  # report, never die silently
            self._done(
                id=cmd.get("id"),
                session_id=getattr(self.agent, "session_id", None),
                interrupted=False,
                failed=True,
                error=f"{type(exc).__name__}: {exc}",
                error_code=classify_exception(exc),
                leftover_steer_ids=self._leftover(),
                row_ids=list(self.written),
                traceback=traceback.format_exc(limit=8),
            )
        finally:
            _TURN.session = None

    def _done(self, **data: Any) -> None:
        """The turn's last word: from here the next turn may start (this thread only ends)."""
        self.turn_running = False
        self.emit("done", **data)

    def _leftover(self) -> list[str]:
        with self.steer_lock:
            leftover = [steer_id for steer_id, _ in self.forwarded]
            self.forwarded.clear()
        return leftover

    def interrupt(self, message: Any) -> None:
        self.prompts.stop_all()
        self.agent.interrupt(message)

    def shutdown_request_sockets(self) -> int:
        """Make sure no request of this agent outlives a Stop.

        On `interrupt()` Hermes abandons the streaming request on its worker thread but only
        finds the sockets of some transports to shut down (plain HTTP ones stay open until
        the provider answers). The sockets of this agent's own clients (the per-request ones
        it made, and its primary one) are shut down, never closed: the owning thread
        releases the descriptor, so none is recycled under it. Other sessions' agents in this
        process keep their requests. (Hermes' own sweep looks at the client's default
        transport only, while its keep-alive client sends through mounted ones.) The
        connections are noted as each pool makes them (`watch_connections`): when Hermes
        gives up a request, its pool may already have dropped the connection that still
        waits on the provider."""
        import socket

        count = 0
        primary = getattr(self.agent, "client", None)
        connections = [*list(self.connections), *_pool_connections(primary)]
        for sock in (s for c in connections for s in _connection_sockets(c)):
            try:
                if sock.fileno() >= 0:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the base method: no TLS
                    count += 1
            except (OSError, ValueError):
                continue
        return count

    def watch_connections(self, client: Any) -> None:
        """Note every connection `client`'s httpx pools make (httpcore's `create_connection`,
        the pool's own extension point)."""
        noted = self.connections
        for pool in _pools(client):
            create = getattr(pool, "create_connection", None)
            if create is None:
                continue

            def create_connection(origin: Any, create: Any = create) -> Any:
                connection = create(origin)
                with contextlib.suppress(TypeError):
                    noted.add(connection)
                return connection

            with contextlib.suppress(AttributeError):
                pool.create_connection = create_connection

    def close(self) -> None:
        """Stop whatever runs and release the agent (its processes, its client)."""
        self.closed = True
        self.prompts.stop_all()
        with contextlib.suppress(Exception):
            self.agent.interrupt("Tether closed the session")
        if self.turn_thread is not None:
            self.turn_thread.join(5)
        with contextlib.suppress(Exception):
            self.agent.close()

    def complete(self, cmd: dict[str, Any]) -> None:
        """One plain non-streaming request with the agent's endpoint (summaries)."""
        try:
            from openai import OpenAI

            client = OpenAI(
                base_url=self.agent.base_url,
                api_key=getattr(self.agent, "api_key", None) or "not-needed",
                max_retries=0,
                timeout=600,
            )
            response = client.chat.completions.create(
                model=cmd.get("model") or self.agent.model, messages=cmd["messages"]
            )
            text = (response.choices[0].message.content or "") if response.choices else ""
            self.emit("completion", id=cmd.get("id"), text=text)
        except Exception as exc:
            self.emit(
                "completion",
                id=cmd.get("id"),
                error=f"{type(exc).__name__}: {exc}",
                error_code=classify_exception(exc),
            )


def agent_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """`AIAgent`'s keywords from Tether's agent config (all but the session's own)."""
    kwargs: dict[str, Any] = dict(
        base_url=config.get("base_url"),
        api_key=config.get("api_key"),
        provider=config.get("provider"),
        model=config.get("model") or "",
        max_tokens=config.get("max_tokens"),
        quiet_mode=True,
    )
    if config.get("toolsets") is not None:
        kwargs["enabled_toolsets"] = config["toolsets"]
    if config.get("tool_delay") is not None:
        kwargs["tool_delay"] = float(config["tool_delay"])
    if config.get("max_iterations"):
        kwargs["max_iterations"] = int(config["max_iterations"])
    return kwargs


def _pools(client: Any) -> list[Any]:
    """The httpcore pools of an OpenAI client's httpx client (httpx 0.28, httpcore 1.x,
    private attributes read defensively): its default transport's and those of its mounts,
    which Hermes' keep-alive client routes every request through."""
    http_client = getattr(client, "_client", None)
    mounts = getattr(http_client, "_mounts", None) or {}
    transports = [getattr(http_client, "_transport", None), *mounts.values()]
    return [p for p in (getattr(t, "_pool", None) for t in transports) if p is not None]


def _pool_connections(client: Any) -> list[Any]:
    """The connections an OpenAI client's pools hold."""
    return [c for pool in _pools(client) for c in list(getattr(pool, "_connections", None) or [])]


def _connection_sockets(connection: Any) -> Iterator[Any]:
    """The socket under an httpcore connection (private attributes, read defensively)."""
    for candidate in (connection, getattr(connection, "_connection", None)):
        stream = getattr(candidate, "_network_stream", None)
        sock = getattr(stream, "_sock", None)
        if sock is None and stream is not None and hasattr(stream, "get_extra_info"):
            with contextlib.suppress(Exception):
                sock = stream.get_extra_info("socket")
        if sock is not None:
            yield sock


def classify_exception(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if status in (401, 403) or "Authentication" in name or "PermissionDenied" in name:
        return "auth"
    if status == 429 or "RateLimit" in name:
        return "rate_limit"
    if status == 404 or "NotFound" in name:
        return "model_not_found"
    if "Connection" in name or "Timeout" in name:
        return "network"
    if isinstance(status, int) and status >= 500:
        return "bad_response"
    return "internal"


def _error_code(result: dict[str, Any]) -> str | None:
    if not result.get("failed") or result.get("interrupted"):
        return None
    text = f"{result.get('error') or ''} {result.get('turn_exit_reason') or ''}".lower()
    # A status is a whole number ("4010 requests" is no 401); context overflow before the
    # status, as a provider may answer it with 400 or 413.
    words = set(re.findall(r"[a-z0-9]+", text))
    for needle, code in (
        ("context overflow", "context_overflow"),
        ("context length", "context_overflow"),
        ("context window", "context_overflow"),
        ("context_length_exceeded", "context_overflow"),
        ("401", "auth"),
        ("403", "auth"),
        ("authentication", "auth"),
        ("api key", "auth"),
        ("429", "rate_limit"),
        ("rate limit", "rate_limit"),
        ("404", "model_not_found"),
        ("not found", "model_not_found"),
        ("connection", "network"),
        ("timed out", "network"),
        ("timeout", "network"),
        ("500", "bad_response"),
        ("502", "bad_response"),
        ("503", "bad_response"),
    ):
        if (needle in words) if needle.isdigit() else (needle in text):
            return code
    return "bad_response"
