"""The Hermes Agent sidecar: one warm process that hosts the agents of many Tether sessions.

Run by the interpreter that has `hermes-agent` installed (`python sidecar.py`). It speaks JSON
lines: commands on stdin, events on stdout (docs/hermes.md lists both). Every command and
event of one agent carries its `agent` key (Tether's); each agent is a `Session`
(sidecar_agent.py) with its own `AIAgent`, turn thread, steers and questions. It is
standalone on purpose: it imports nothing from Tether, so it runs in Hermes' own environment
with Hermes' exact pins.

`hello` warms the process once (docs/hermes.md, "One warm sidecar"): Hermes is imported, the
modules its first turn would import are imported, one throw-away agent is built (its lazy
set-up paid), and what Hermes re-checks for every new agent although it cannot change within
the process (the CA bundle, the kind of local server behind a base URL) is checked once. So
building a session's agent later costs tens of milliseconds, not seconds.

Threads: the main thread reads commands and never blocks on an agent (building one, closing
one and every turn run on threads of their own). Every line goes through `emit`, under one
lock, so lines never interleave.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys
import threading
import time
import traceback
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

from sidecar_agent import Session, agent_kwargs, install_steer_marker  # noqa: E402 - beside this

_WRITE_LOCK = threading.Lock()

# What hermes-agent 0.19.0 imports lazily during an agent's first turn (measured: about
# 200 ms); imported by `hello` instead. A name a later version lacks is skipped.
FIRST_TURN_MODULES = (
    "agent.conversation_loop",
    "agent.chat_completion_helpers",
    "agent.system_prompt",
    "agent.turn_finalizer",
    "agent.turn_retry_state",
    "agent.stream_single_writer",
    "agent.prompt_caching",
    "agent.display",
    "agent.bounded_response",
    "agent.rate_limit_tracker",
    "agent.credits_tracker",
    "agent.aux_accounting",
    "agent.coding_context",
    "agent.verification_stop",
    "agent.verify_hooks",
    "agent.kanban_stop",
    "hermes_cli.moa_config",
    "hermes_cli.profiles",
    "hermes_cli.skin_engine",
    "hermes_cli.nous_subscription",
    "tools.hook_output_spill",
    "tools.skill_provenance",
    "openai.resources",
    "openai.lib.streaming.chat",
)


# What `resolve_httpx_verify` and httpx read from the environment to pick CA certificates.
TLS_ENV = (
    "HERMES_CA_BUNDLE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)


def emit(event: str, **data: Any) -> None:
    line = json.dumps({"ev": event, **data}, default=str, ensure_ascii=False)
    with _WRITE_LOCK:
        _PROTOCOL.write(line + "\n")
        _PROTOCOL.flush()


def log(level: str, message: str) -> None:
    emit("log", level=level, message=message)


def check_once_per_process() -> None:
    """Checks Hermes repeats for every new agent (and TLS set-up it repeats for every model
    request) although their answer cannot change while this process lives: done once here.

    - The CA bundle check (`agent.ssl_guard`, about 90 ms an agent): run now, so a broken
      bundle still fails `hello`; later agents skip it through Hermes' own switch.
    - The kind of local server behind a base URL (`detect_local_server_type`, up to five
      HTTP probes an agent): Hermes caches an answer for the process, but not "none of the
      kinds it knows", which a plain OpenAI-compatible server always gets; remembered here
      for the process too.
    - The TLS context of provider clients (`resolve_httpx_verify`): Hermes builds a client
      for every request and loads the CA bundle into a new context each time (20-100 ms of
      CPU); the context is built once per setting and shared (an `ssl.SSLContext` is safe
      to share between connections). Insecure mode is left to Hermes, warning and all.
    - The copies of its configuration Hermes makes for every read (`_PlainCopy`).
    """
    import ssl

    import agent.model_metadata as metadata
    import agent.ssl_verify as ssl_verify
    import hermes_cli.config as config_module
    import httpx
    from agent.ssl_guard import verify_ca_bundle

    verify_ca_bundle()
    os.environ["HERMES_SKIP_SSL_GUARD"] = "1"
    lock = threading.Lock()
    probe = metadata.detect_local_server_type
    known: dict[tuple[str, str], str | None] = {}

    def detect_local_server_type(base_url: str, api_key: str = "") -> str | None:
        key = (str(base_url), str(api_key or ""))
        with lock:
            if key in known:
                return known[key]
        kind = probe(base_url, api_key=api_key)
        with lock:
            known[key] = kind
        return kind

    resolve = ssl_verify.resolve_httpx_verify
    contexts: dict[tuple[str, ...], ssl.SSLContext] = {}

    def resolve_httpx_verify(
        *, ca_bundle: str | None = None, ssl_verify: Any = None, base_url: str = ""
    ) -> bool | ssl.SSLContext:
        key = (str(ca_bundle or ""), repr(ssl_verify), *(os.environ.get(n, "") for n in TLS_ENV))
        with lock:
            if key in contexts:
                return contexts[key]
        verify = resolve(ca_bundle=ca_bundle, ssl_verify=ssl_verify, base_url=base_url)
        if verify is False:
            return False
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context()
        with lock:
            contexts[key] = context
        return context

    metadata.detect_local_server_type = detect_local_server_type
    ssl_verify.resolve_httpx_verify = resolve_httpx_verify
    config_module.copy = _PlainCopy()


class _PlainCopy:
    """`copy` for `hermes_cli.config`, which deep-copies its cached configuration (plain YAML
    data: dicts, lists, scalars) on every read, a dozen times for each new agent: the same
    copy, made by a recursion over plain data (about five times faster than
    `copy.deepcopy`); anything else, or data nested deeper than 64, goes to
    `copy.deepcopy`."""

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        try:
            return _plain(value, 0)
        except _NotPlain:
            return copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


class _NotPlain(Exception):
    pass


def _plain(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if depth > 64:
        raise _NotPlain
    if kind is dict:
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if kind is list:
        return [_plain(v, depth + 1) for v in value]
    raise _NotPlain


class StartFailed(Exception):
    """`hello` cannot go on; the message is for the person who configured Tether."""


class Host:
    """The agents of this process by key, and the commands that reach them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.opening: set[str] = set()  # keys whose agent is being built
        self.dropped: set[str] = set()  # keys dropped while their agent was being built
        self.closers: list[threading.Thread] = []  # agents still closing (`drop`)

    def live(self) -> list[Session]:
        with self.lock:
            return list(self.sessions.values())

    def hello(self, config: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            import run_agent  # noqa: F401 - the one import of Hermes, after the fd 1 switch
        except ModuleNotFoundError as exc:
            raise StartFailed(
                f"{sys.executable} cannot import hermes-agent ({exc}); point --hermes-python "
                "(TETHER_HERMES_PYTHON) at the Python of a virtualenv where "
                "`pip install hermes-agent==0.19.0` ran."
            ) from exc

        install_steer_marker(self.live)
        check_once_per_process()
        for name in FIRST_TURN_MODULES:
            try:
                importlib.import_module(name)
            except Exception as exc:  # an optional module of another Hermes version
                log("debug", f"warm-up import {name}: {type(exc).__name__}: {exc}")
        self._throwaway_agent(config)
        import importlib.metadata as md

        emit(
            "ready",
            version=md.version("hermes-agent"),
            pid=os.getpid(),
            seconds=round(time.monotonic() - started, 3),
        )

    def _throwaway_agent(self, config: dict[str, Any]) -> None:
        """Build one agent with the sessions' settings and no `state.db`, then close it: its
        constructor's one-time costs (tool discovery, the endpoint probes) are paid now."""
        from run_agent import AIAgent

        try:
            agent = AIAgent(**agent_kwargs(config), session_id="tether-warm-up", session_db=None)
        except Exception as exc:  # the sessions' own agents will report it
            log("warning", f"warm-up agent: {type(exc).__name__}: {exc}")
            return
        try:
            agent.close()
        except Exception as exc:
            log("debug", f"warm-up agent close: {type(exc).__name__}: {exc}")

    def open(self, key: str, config: dict[str, Any]) -> None:
        with self.lock:
            if key in self.sessions or key in self.opening:
                emit("open_failed", agent=key, message=f"agent {key!r} is already open")
                return
            self.opening.add(key)
        threading.Thread(
            target=self._build, args=(key, config), name=f"tether-open-{key}", daemon=True
        ).start()

    def _build(self, key: str, config: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            session = Session(key, config, emit)
        except BaseException as exc:
            with self.lock:
                self.opening.discard(key)
                self.dropped.discard(key)
            emit(
                "open_failed",
                agent=key,
                message=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=8),
            )
            return
        with self.lock:
            self.opening.discard(key)
            dropped = key in self.dropped
            self.dropped.discard(key)
            if not dropped:
                self.sessions[key] = session
        if dropped:
            session.close()
            return
        emit(
            "opened",
            agent=key,
            session_id=session.agent.session_id,
            seconds=round(time.monotonic() - started, 3),
        )
        session.prebuild_prompt()

    def drop(self, key: str) -> None:
        with self.lock:
            session = self.sessions.pop(key, None)
            if session is None and key in self.opening:
                self.dropped.add(key)
        if session is not None:
            closer = threading.Thread(target=session.close, name=f"tether-close-{key}", daemon=True)
            with self.lock:
                self.closers = [t for t in self.closers if t.is_alive()]
                self.closers.append(closer)
            closer.start()

    def dispatch(self, op: str, cmd: dict[str, Any]) -> None:
        key = str(cmd.get("agent") or "")
        if op == "open":
            self.open(key, cmd.get("config") or {})
            return
        if op == "drop":
            self.drop(key)
            return
        with self.lock:
            session = self.sessions.get(key)
        if session is None:  # dropped meanwhile: answer what waits for an answer
            if op == "turn":
                emit(
                    "done",
                    agent=key,
                    id=cmd.get("id"),
                    failed=True,
                    error="the agent was closed",
                    error_code="internal",
                )
            elif op == "complete":
                emit("completion", agent=key, id=cmd.get("id"), error="the agent was closed")
            return
        if op == "turn":
            session.start_turn(cmd)
        elif op == "steer":
            session.steer(str(cmd.get("steer_id")), str(cmd.get("text") or ""))
        elif op == "interrupt":
            session.interrupt(cmd.get("message"))
        elif op == "approve":
            session.prompts.answer_approval(str(cmd.get("approval_id")), str(cmd.get("choice")))
        elif op == "answer":
            session.prompts.answer_question(str(cmd.get("question_id")), str(cmd.get("text") or ""))
        elif op == "complete":
            threading.Thread(target=session.complete, args=(cmd,), daemon=True).start()
        else:
            log("warning", f"unknown command {op!r}")

    def close_all(self) -> None:
        """Close every agent, also those a `drop` is still closing (Tether drops its agents
        before it says `close` when it shuts down): the process exits right after, and an
        agent not closed by then leaves its tool's process running (Hermes starts each in a
        session of its own, out of reach of the process group Tether kills)."""
        with self.lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
            closing = list(self.closers)
        threads = [threading.Thread(target=s.close, daemon=True) for s in sessions]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 6
        for thread in [*threads, *closing]:
            thread.join(max(0.0, deadline - time.monotonic()))


def main() -> int:
    host = Host()
    greeted = False
    for raw in _COMMANDS:
        raw = raw.strip()
        if not raw:
            continue
        try:
            cmd = json.loads(raw)
        except ValueError:
            log("warning", f"unreadable command: {raw[:200]}")
            continue
        op = str(cmd.get("op"))
        try:
            if op == "hello":
                host.hello(cmd.get("config") or {})
                greeted = True
            elif op == "close":
                break
            elif not greeted:
                emit("fatal", message=f"{op!r} before hello")
            else:
                host.dispatch(op, cmd)
        except StartFailed as exc:
            emit("fatal", message=str(exc))
            return 1
        except Exception as exc:
            emit(
                "fatal",
                agent=cmd.get("agent"),
                message=f"{op}: {type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=8),
            )
            if op == "hello":
                return 1
    host.close_all()
    return 0


if __name__ == "__main__":
    os._exit(main())
