"""The Hermes Agent sidecar: drives one `run_agent.AIAgent` for one Tether session.

Run by the interpreter that has `hermes-agent` installed (`python sidecar.py`). It speaks JSON
lines: commands on stdin, events on stdout (docs/hermes.md lists both). It is standalone on
purpose: it imports nothing from Tether, so it runs in Hermes' own environment with Hermes'
exact pins.

Threads: the main thread reads commands; a turn runs on its own thread (so `interrupt` and
`steer` arrive while it runs); Hermes fires callbacks on the turn thread, its HTTP worker
threads and tool threads. Every line goes through `emit`, under one lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
import uuid
from typing import Any

# Hermes replaces sys.stdout and prints on it: keep the protocol on a private copy of fd 1
# and point fd 1 at stderr before anything of Hermes is imported.
_PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr
# Commands come on a private copy of fd 0; fd 0 itself becomes /dev/null, so nothing Hermes
# runs (an `input()` prompt, a tool's subprocess) can ever read protocol lines.
_COMMANDS = os.fdopen(os.dup(0), "r", encoding="utf-8")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - lives as long as the process

from sidecar_prompts import UserPrompts  # noqa: E402 - beside this script, stdlib only

_WRITE_LOCK = threading.Lock()
SUMMARY_MARKER = "[CONTEXT COMPACTION"


def emit(event: str, **data: Any) -> None:
    line = json.dumps({"ev": event, **data}, default=str, ensure_ascii=False)
    with _WRITE_LOCK:
        _PROTOCOL.write(line + "\n")
        _PROTOCOL.flush()


def log(level: str, message: str) -> None:
    emit("log", level=level, message=message)


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


class Session:
    """One agent and the bookkeeping of its current turn."""

    def __init__(self, config: dict[str, Any]):
        from run_agent import AIAgent  # imported here: after the fd 1 switch above

        self.config = config
        self.turn_id: str | None = None
        self.turn_thread: threading.Thread | None = None
        self.forwarded: list[tuple[str, str]] = []  # (steer_id, text) given to agent.steer()
        self.steer_lock = threading.Lock()
        self.tool_meta: dict[str, dict[str, Any]] = {}
        self.after_tool = False
        self.last_usage: tuple[int, int] | None = None
        self.prompts = UserPrompts(
            emit,
            float(config.get("approval_seconds") or 300),
            config.get("clarify_seconds"),
        )
        self._patch_steer_marker()
        session = self

        class TetherAgent(AIAgent):
            def _compress_context(self, messages, system_message, **kwargs):  # noqa: ANN001
                return session.compress(
                    super()._compress_context, messages, system_message, **kwargs
                )

        from hermes_state import SessionDB

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
        kwargs: dict[str, Any] = dict(
            base_url=config.get("base_url"),
            api_key=config.get("api_key"),
            provider=config.get("provider"),
            model=config.get("model") or "",
            max_tokens=config.get("max_tokens"),
            quiet_mode=True,
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
        if config.get("toolsets") is not None:
            kwargs["enabled_toolsets"] = config["toolsets"]
        if config.get("tool_delay") is not None:
            kwargs["tool_delay"] = float(config["tool_delay"])
        if config.get("max_iterations"):
            kwargs["max_iterations"] = int(config["max_iterations"])
        self.agent = TetherAgent(**kwargs)

    # -- callbacks (any thread) -------------------------------------------------------------
    def on_reasoning(self, text: Any) -> None:
        if isinstance(text, str) and text:
            emit("reasoning", text=text)

    def on_delta(self, text: Any) -> None:
        if not isinstance(text, str) or not text:
            return
        if self.after_tool:  # the agent's paragraph break after a tool round
            text = text.lstrip("\n")
            if not text:
                return
            self.after_tool = False
        emit("text", text=text)

    def on_interim(self, text: Any, already_streamed: bool = False, **_: Any) -> None:
        if isinstance(text, str) and text.strip() and not already_streamed:
            emit("text", text=text, interim=True)

    def on_tool_progress(self, kind: Any, name: Any = None, *args: Any, **kwargs: Any) -> None:
        if kind == "tool.completed" and isinstance(name, str):
            self.tool_meta[name] = {
                "is_error": bool(kwargs.get("is_error")),
                "duration": kwargs.get("duration") or 0,
            }

    def on_tool_start(self, call_id: Any, name: Any, args: Any) -> None:
        self._usage()
        emit(
            "tool_started",
            call_id=str(call_id),
            name=str(name),
            args=args if isinstance(args, dict) else {"value": args},
        )

    def on_tool_complete(self, call_id: Any, name: Any, args: Any, result: Any) -> None:
        meta = self.tool_meta.pop(str(name), {})
        emit(
            "tool_completed",
            call_id=str(call_id),
            name=str(name),
            result=result if isinstance(result, str) else json.dumps(result, default=str),
            is_error=meta.get("is_error", False),
            duration_ms=int(float(meta.get("duration") or 0) * 1000),
        )
        self.after_tool = True

    def on_status(self, kind: Any, message: Any = None, *_: Any) -> None:
        emit("status", kind=str(kind), message=str(message))

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
            emit("usage", prompt_tokens=prompt, completion_tokens=int(completion or 0))

    # -- compression ------------------------------------------------------------------------
    def compress(self, original: Any, messages: list, system_message: Any, **kwargs: Any):
        pass_id = f"cmp_{uuid.uuid4().hex[:12]}"
        old_session = self.agent.session_id
        before = kwargs.get("approx_tokens") or _estimate(messages)
        emit("compression_started", pass_id=pass_id)
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
            emit(
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
            emit("compression_skipped", pass_id=pass_id)
        return result

    # -- steer ------------------------------------------------------------------------------
    def _patch_steer_marker(self) -> None:
        """`format_steer_marker` is called exactly when the agent appends pending steer text
        to a tool result: that is where the steers were taken."""
        import agent.agent_runtime_helpers as helpers
        import agent.prompt_builder as builder

        original = builder.format_steer_marker
        session = self

        def marker(steer_text: str) -> str:
            session.steers_taken(steer_text)
            return original(steer_text)

        builder.format_steer_marker = marker
        if getattr(helpers, "format_steer_marker", None) is original:
            helpers.format_steer_marker = marker

    def steer(self, steer_id: str, text: str) -> None:
        with self.steer_lock:
            if self.agent.steer(text):
                self.forwarded.append((steer_id, text.strip()))
            else:
                emit("steer_taken", steer_ids=[steer_id])  # empty text: nothing to take

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
            emit("steer_taken", steer_ids=taken)

    # -- a turn -----------------------------------------------------------------------------
    def start_turn(self, cmd: dict[str, Any]) -> None:
        if self.turn_thread is not None and self.turn_thread.is_alive():
            emit(
                "done",
                id=cmd.get("id"),
                failed=True,
                error="a turn is already running",
                error_code="internal",
            )
            return
        self.turn_id = cmd.get("id")
        self.turn_thread = threading.Thread(
            target=self._run_turn, args=(cmd,), name="tether-turn", daemon=True
        )
        self.turn_thread.start()

    def _run_turn(self, cmd: dict[str, Any]) -> None:
        # Ask the user through Tether before a flagged command (never auto-approve): an
        # interactive context with our prompt; Hermes carries both to its tool threads.
        from tools.approval import set_current_session_key, set_hermes_interactive_context
        from tools.terminal_tool import set_approval_callback

        set_hermes_interactive_context(True)
        # "Allow for this session" is keyed by the Tether session, which outlives the agent
        # sessions its compressions rotate into.
        set_current_session_key(str(self.config.get("approval_session_key") or "default"))
        set_approval_callback(self.prompts.on_approval)
        self.after_tool = False
        self.last_usage = None
        self.tool_meta.clear()
        self.written = []
        try:
            if cmd.get("model") and cmd["model"] != self.agent.model:
                self.agent.model = cmd["model"]
            emit(
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
                _shutdown_provider_sockets(getattr(self.agent, "base_url", None))
            with self.steer_lock:
                leftover = [steer_id for steer_id, _ in self.forwarded]
                self.forwarded.clear()
            emit(
                "done",
                id=cmd.get("id"),
                session_id=self.agent.session_id,
                interrupted=bool(result.get("interrupted")),
                failed=bool(result.get("failed")) and not result.get("interrupted"),
                completed=bool(result.get("completed")),
                error=result.get("error"),
                error_code=_error_code(self.agent, result),
                leftover_steer_ids=leftover,
                row_ids=list(self.written),
                final_response=result.get("final_response"),
                turn_exit_reason=result.get("turn_exit_reason"),
            )
        except BaseException as exc:  # report, never die silently
            with self.steer_lock:
                leftover = [steer_id for steer_id, _ in self.forwarded]
                self.forwarded.clear()
            emit(
                "done",
                id=cmd.get("id"),
                session_id=getattr(self.agent, "session_id", None),
                interrupted=False,
                failed=True,
                error=f"{type(exc).__name__}: {exc}",
                error_code=_classify_exception(exc),
                leftover_steer_ids=leftover,
                row_ids=list(self.written),
                traceback=traceback.format_exc(limit=8),
            )

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
            emit("completion", id=cmd.get("id"), text=text)
        except Exception as exc:
            emit(
                "completion",
                id=cmd.get("id"),
                error=f"{type(exc).__name__}: {exc}",
                error_code=_classify_exception(exc),
            )


def _shutdown_provider_sockets(base_url: str | None) -> int:
    """Make sure no request to the provider outlives a Stop.

    On `interrupt()` Hermes abandons the streaming request on its worker thread but only
    finds the sockets of some transports to shut down (plain HTTP ones stay open until the
    provider answers). Every TCP socket of this process connected to the provider's host and
    port is shut down (not closed: the owning thread releases the descriptor, so no
    descriptor is recycled under it). Idle pooled connections go too; the client reconnects.
    """
    import gc
    import socket
    from urllib.parse import urlparse

    if not base_url:
        return 0
    url = urlparse(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(url.hostname, port)}
    except OSError:
        return 0
    count = 0
    for obj in gc.get_objects():
        if not isinstance(obj, socket.socket):
            continue
        try:
            if obj.fileno() < 0 or obj.type != socket.SOCK_STREAM:
                continue
            peer = obj.getpeername()
            if peer[1] == port and peer[0] in addresses:
                socket.socket.shutdown(obj, socket.SHUT_RDWR)  # the base method: no TLS state
                count += 1
        except (OSError, ValueError, IndexError):
            continue
    return count


def _classify_exception(exc: BaseException) -> str:
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


def _error_code(agent: Any, result: dict[str, Any]) -> str | None:
    if not result.get("failed") or result.get("interrupted"):
        return None
    text = f"{result.get('error') or ''} {result.get('turn_exit_reason') or ''}".lower()
    for needle, code in (
        ("401", "auth"),
        ("403", "auth"),
        ("authentication", "auth"),
        ("api key", "auth"),
        ("429", "rate_limit"),
        ("rate limit", "rate_limit"),
        ("404", "model_not_found"),
        ("not found", "model_not_found"),
        ("context length", "context_overflow"),
        ("context window", "context_overflow"),
        ("connection", "network"),
        ("timed out", "network"),
        ("timeout", "network"),
        ("500", "bad_response"),
        ("502", "bad_response"),
        ("503", "bad_response"),
    ):
        if needle in text:
            return code
    return "bad_response"


def main() -> int:
    session: Session | None = None
    for raw in _COMMANDS:
        raw = raw.strip()
        if not raw:
            continue
        try:
            cmd = json.loads(raw)
        except ValueError:
            log("warning", f"unreadable command: {raw[:200]}")
            continue
        op = cmd.get("op")
        try:
            if op == "hello":
                started = time.monotonic()
                session = Session(cmd.get("config") or {})
                import importlib.metadata as md

                emit(
                    "ready",
                    session_id=session.agent.session_id,
                    version=md.version("hermes-agent"),
                    seconds=round(time.monotonic() - started, 3),
                )
            elif session is None:
                emit("fatal", message=f"{op!r} before hello")
            elif op == "turn":
                session.start_turn(cmd)
            elif op == "steer":
                session.steer(str(cmd.get("steer_id")), str(cmd.get("text") or ""))
            elif op == "interrupt":
                session.prompts.stop_all()
                session.agent.interrupt(cmd.get("message"))
            elif op == "approve":
                session.prompts.answer_approval(str(cmd.get("approval_id")), str(cmd.get("choice")))
            elif op == "answer":
                session.prompts.answer_question(
                    str(cmd.get("question_id")), str(cmd.get("text") or "")
                )
            elif op == "complete":
                threading.Thread(target=session.complete, args=(cmd,), daemon=True).start()
            elif op == "close":
                break
            else:
                log("warning", f"unknown command {op!r}")
        except Exception as exc:
            emit(
                "fatal",
                message=f"{op}: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=8),
            )
            if op == "hello":
                return 1
    if session is not None:
        session.prompts.stop_all()
        session.agent.interrupt("Tether closed the session")
        if session.turn_thread is not None:
            session.turn_thread.join(5)
        with contextlib.suppress(Exception):
            session.agent.close()
    return 0


if __name__ == "__main__":
    os._exit(main())
