"""A fake OpenAI-compatible Chat Completions server for the test suite.

Why this exists: tether's tests may not mock anything inside tether itself. The one boundary
we are allowed to fake is the model provider, and we fake it the way tether really meets it:
as a real HTTP server on loopback, speaking the OpenAI wire format (JSON bodies, SSE streams,
OpenAI-style error objects). Tether's HTTP client, its SSE parsing, its cancellation and its
error mapping therefore all run for real; only the model's answers are scripted.

The server is a tiny raw ASGI app on uvicorn, run in a daemon thread with its own event loop,
so it can be used from ordinary synchronous pytest fixtures::

    with FakeOpenAI() as fake:
        fake.script(
            reply(reasoning("thinking..."), text("Hello "), text("world")),
            reply(tool_call("call_1", "read_file", {"path": "a.txt"})),
            error(429, "slow down", code="rate_limit_exceeded"),
        )
        client = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
        ...
        assert fake.requests_count == 3

Scripted replies are served in order to ``POST /v1/chat/completions``; when the queue is empty
``fake.default_reply`` (plain text "ok") is served. Replies are lists of steps: content steps
(``reasoning``, ``text``, ``tool_call``, ``stream_error``, ``raw``) and control steps
(``delay``, ``barrier``, ``hang``, ``drop``, ``end``). Client disconnects during a response
are detected at once (the ASGI ``http.disconnect`` message is watched by a separate task) and
counted in
``fake.disconnects`` / ``fake.disconnect_times`` (``time.monotonic()`` values).

All public methods are safe to call from the test thread while the server thread runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "DEFAULT_CONTEXT_LENGTH",
    "DEFAULT_MODEL",
    "Barrier",
    "Delay",
    "Drop",
    "End",
    "ErrorReply",
    "FakeOpenAI",
    "Hang",
    "MalformedReply",
    "Raw",
    "Reasoning",
    "Reply",
    "Stall",
    "StreamError",
    "Text",
    "ToolCall",
    "barrier",
    "delay",
    "drop",
    "drop_connection",
    "end",
    "error",
    "hang",
    "malformed",
    "raw",
    "reasoning",
    "reply",
    "stall",
    "stream_error",
    "text",
    "tool_call",
]

DEFAULT_MODEL = "fake-model"
DEFAULT_CONTEXT_LENGTH = 32768
_TICK = 0.01  # polling period (s) for barrier release / fake shutdown
_THREAD_PREFIX = "fake-openai"


# --------------------------------------------------------------------------------------------
# Steps and replies
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reasoning:
    """A reasoning delta, sent as ``choices[0].delta.<reasoning_field>``."""

    text: str


@dataclass(frozen=True)
class Text:
    """A content delta, sent as ``choices[0].delta.content``."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """A function tool call; ``arguments`` is a dict (JSON-encoded) or a raw string."""

    id: str
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    pieces: int = 3

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class Delay:
    """Sleep before the next chunk."""

    seconds: float


@dataclass(frozen=True)
class Barrier:
    """Block the response until the test calls ``fake.release(name)``."""

    name: str


@dataclass(frozen=True)
class Hang:
    """Block forever (until the client disconnects or the fake stops)."""


@dataclass(frozen=True)
class Drop:
    """Close the TCP connection abruptly (no terminating chunk, no ``[DONE]``)."""


@dataclass(frozen=True)
class StreamError:
    """An in-stream error event ``data: {"error": {...}}`` (how vLLM & co report late errors).

    The stream ends right after it (no ``[DONE]``). On the non-streaming path it becomes an
    HTTP ``status`` error response instead.
    """

    message: str
    type: str = "server_error"
    code: str | None = None
    status: int = 500


@dataclass(frozen=True)
class Raw:
    """One SSE ``data:`` line sent verbatim (a chunk of the wrong shape, for example)."""

    payload: str


@dataclass(frozen=True)
class End:
    """End the response cleanly here: the HTTP body completes, but with no chunk carrying a
    ``finish_reason`` and no ``[DONE]`` (how a server that crashed mid-answer looks)."""


@dataclass(frozen=True)
class Stall:
    """As the first step: send nothing at all, not even the response headers, until the
    client gives up (a provider that accepted the connection and went quiet)."""


Step = Reasoning | Text | ToolCall | Delay | Barrier | Hang | Drop | StreamError | Raw | End | Stall


@dataclass
class Reply:
    """A scripted successful reply.

    ``finish_reason=None`` means automatic: ``"tool_calls"`` if any step is a ToolCall, else
    ``"stop"``. ``usage`` (partial dicts allowed) overrides the estimated token counts;
    ``total_tokens`` is filled in when missing.
    """

    steps: list[Step] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [s for s in self.steps if isinstance(s, ToolCall)]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps if isinstance(s, Text))

    @property
    def reasoning(self) -> str:
        return "".join(s.text for s in self.steps if isinstance(s, Reasoning))

    def resolved_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass
class ErrorReply:
    """An HTTP error with an OpenAI-style body ``{"error": {message, type, param, code}}``."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class MalformedReply:
    """HTTP 200 whose body is garbage (non-JSON SSE ``data:`` lines / non-JSON body)."""

    payload: str = "data: {this is not json\n\ndata: <<garbage>>\n\n"


AnyReply = Reply | ErrorReply | MalformedReply

_DEFAULT_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


def reasoning(content: str) -> Reasoning:
    return Reasoning(content)


def text(content: str) -> Text:
    return Text(content)


def tool_call(
    call_id: str, name: str, arguments: dict[str, Any] | str | None = None, *, pieces: int = 3
) -> ToolCall:
    """A tool call whose arguments are streamed in ``pieces`` fragments."""
    return ToolCall(call_id, name, {} if arguments is None else arguments, max(1, pieces))


def delay(seconds: float) -> Delay:
    return Delay(seconds)


def barrier(name: str) -> Barrier:
    return Barrier(name)


def hang() -> Hang:
    return Hang()


def drop() -> Drop:
    return Drop()


def raw(payload: str | dict[str, Any] | list[Any]) -> Raw:
    """A verbatim ``data:`` line; a dict or list is JSON-encoded."""
    return Raw(payload if isinstance(payload, str) else json.dumps(payload))


def end() -> End:
    return End()


def stall() -> Stall:
    return Stall()


def stream_error(
    message: str, *, type: str = "server_error", code: str | None = None, status: int = 500
) -> StreamError:
    return StreamError(message, type, code, status)


def reply(
    *steps: Step | str, finish_reason: str | None = None, usage: dict[str, Any] | None = None
) -> Reply:
    """``reply(text("a"), tool_call(...))``; bare strings are treated as ``text(...)``."""
    return Reply([text(s) if isinstance(s, str) else s for s in steps], finish_reason, usage)


def error(
    status: int,
    body_or_message: str | dict[str, Any] = "",
    code: str | None = None,
    type: str | None = None,
    *,
    headers: dict[str, str] | None = None,
) -> ErrorReply:
    """An error reply. A dict is sent verbatim as the JSON body; a string becomes
    ``{"error": {"message": ..., "type": ..., "param": None, "code": code}}`` with ``type``
    defaulting by status (``invalid_request_error`` for 4xx, ``rate_limit_error`` for 429,
    ``server_error`` for 5xx)."""
    if isinstance(body_or_message, dict):
        body = body_or_message
    else:
        default_type = _DEFAULT_ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        body = {
            "error": {
                "message": body_or_message or f"fake error {status}",
                "type": type or default_type,
                "param": None,
                "code": code,
            }
        }
    return ErrorReply(status, body, dict(headers or {}))


def malformed(payload: str | None = None) -> MalformedReply:
    return MalformedReply() if payload is None else MalformedReply(payload)


def drop_connection(*before: Step | str) -> Reply:
    """A reply that sends ``before`` (e.g. some text) and then closes the socket mid-stream."""
    return reply(*before, drop())


def _coerce_reply(item: AnyReply | Step | str | Sequence[Step | str]) -> AnyReply:
    if isinstance(item, Reply | ErrorReply | MalformedReply):
        return item
    if isinstance(item, str):
        return reply(item)
    if isinstance(item, list | tuple):
        return reply(*item)
    if isinstance(item, Step):
        return reply(item)
    raise TypeError(f"cannot script {item!r}")


# --------------------------------------------------------------------------------------------
# Logging: silence uvicorn's complaint about the responses we cut off on purpose
# --------------------------------------------------------------------------------------------


class _IntentionalDropFilter(logging.Filter):
    _MESSAGES = frozenset(
        {
            "ASGI callable returned without completing response.",
            "ASGI callable returned without starting response.",
        }
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            (record.threadName or "").startswith(_THREAD_PREFIX) and record.msg in self._MESSAGES
        )


_uvicorn_error_logger = logging.getLogger("uvicorn.error")
if not any(isinstance(f, _IntentionalDropFilter) for f in _uvicorn_error_logger.filters):
    _uvicorn_error_logger.addFilter(_IntentionalDropFilter())


class _QuietConfig(uvicorn.Config):
    """uvicorn.Config that leaves global logging configuration alone (the app under test may
    run its own uvicorn in this process)."""

    def configure_logging(self) -> None:
        pass


class _QuietH11Protocol(H11Protocol):
    """No access log lines for the fake (uvicorn enables them whenever any handler exists)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_log = False


class _FastServer(uvicorn.Server):
    """uvicorn.Server that notices ``should_exit`` within ~10 ms and shuts down without
    uvicorn's fixed 0.1 s sleeps, so a fake per test stays cheap."""

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            await asyncio.sleep(0.01)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.timeout_graceful_shutdown or 3)
        while (self.server_state.connections or self.server_state.tasks) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        for task in list(self.server_state.tasks):
            task.cancel()
        for server in self.servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 1.0)


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class _Aborted(Exception):
    """The fake is stopping: cut the response off."""


class _Response:
    """Per-request state shared by the producer and the disconnect watcher."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self.started = False
        self.finished = False

    async def start(
        self,
        status: int,
        content_type: str,
        extra: dict[str, str] | None = None,
        content_length: int | None = None,
    ) -> None:
        headers = [(b"content-type", content_type.encode())]
        if content_length is not None:
            headers.append((b"content-length", str(content_length).encode()))
        for k, v in (extra or {}).items():
            headers.append((k.lower().encode(), v.encode()))
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def finish(self, data: bytes = b"") -> None:
        self.finished = True
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def json(self, status: int, obj: Any, extra: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        await self.start(status, "application/json", extra)
        await self.finish(data)


class FakeOpenAI:
    """A real HTTP server on 127.0.0.1 that impersonates an OpenAI-compatible provider.

    Use as a context manager or call ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        context_length: int | None = DEFAULT_CONTEXT_LENGTH,
        api_key: str | None = None,
        reasoning_field: str = "reasoning_content",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model = model
        self.context_length = context_length
        self.api_key = api_key  # if set, chat/models requests need "Authorization: Bearer <key>"
        self.reasoning_field = reasoning_field
        self.host = host
        self.port = port
        self.default_reply: AnyReply = reply(text("ok"))
        # Other servers' own endpoints, answered with this JSON: {("GET", "/props"): {...}}
        # (llama.cpp), ("POST", "/api/show") (Ollama), ... Requests to them are in `hits`.
        self.routes: dict[tuple[str, str], Any] = {}
        self.models_delay = 0.0  # seconds before answering /v1/models (a slow lookup)
        self.other_models: list[str] = []  # listed by /v1/models after `model`, no window stated
        self.hits: list[tuple[str, str, Any]] = []

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._queue: collections.deque[AnyReply] = collections.deque()
        self._requests: list[Any] = []
        self._request_headers: list[dict[str, str]] = []
        self._request_peers: list[tuple[str, int] | None] = []
        self._disconnect_times: list[float] = []
        self._released: dict[str, threading.Event] = {}
        self._reached: dict[str, threading.Event] = {}
        self._stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (valid once started)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> FakeOpenAI:
        if self._thread is not None:
            raise RuntimeError("FakeOpenAI already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = _QuietConfig(
            self._asgi,
            host=self.host,
            port=self.port,
            loop="asyncio",
            http=_QuietH11Protocol,
            ws="none",
            lifespan="off",
            interface="asgi3",
            proxy_headers=False,
            access_log=False,
            log_config=None,
            log_level=None,
            timeout_graceful_shutdown=3,
        )
        self._stopping.clear()
        self._server = _FastServer(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"{_THREAD_PREFIX}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("FakeOpenAI server failed to start")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server. Responses blocked in barrier/hang/delay are cut off."""
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- scripting --------------------------------------------------------------------------

    def script(self, *replies: AnyReply | Step | str | Sequence[Step | str]) -> FakeOpenAI:
        """Append replies to the queue. Accepts Reply/ErrorReply/MalformedReply, a bare step,
        a str (text reply) or a list of steps."""
        coerced = [_coerce_reply(r) for r in replies]
        with self._lock:
            self._queue.extend(coerced)
        return self

    @property
    def pending(self) -> int:
        """Number of scripted replies not yet served."""
        with self._lock:
            return len(self._queue)

    def release(self, name: str) -> None:
        """Open barrier ``name`` (before or after a stream reaches it). Stays open until
        ``reset()``."""
        self._event(self._released, name).set()

    def reached(self, name: str) -> bool:
        return self._event(self._reached, name).is_set()

    def wait_reached(self, name: str, timeout: float = 5.0) -> bool:
        """Wait until some response has reached barrier ``name``; False on timeout."""
        return self._event(self._reached, name).wait(timeout)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> bool:
        """Wait until at least ``n`` chat completion requests were received."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._requests) >= n, timeout)

    def wait_disconnects(self, n: int = 1, timeout: float = 5.0) -> bool:
        """Wait until at least ``n`` client disconnects were observed."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._disconnect_times) >= n, timeout)

    def reset(self) -> None:
        """Forget the queue, recorded requests, disconnects and barrier states; restore the
        default reply. Responses still blocked on a barrier from before are released."""
        with self._lock:
            for ev in self._released.values():
                ev.set()
            self._queue.clear()
            self._requests.clear()
            self._request_headers.clear()
            self._request_peers.clear()
            self._disconnect_times.clear()
            self._released.clear()
            self._reached.clear()
            self.default_reply = reply(text("ok"))

    # ---- observations -----------------------------------------------------------------------

    @property
    def requests(self) -> list[Any]:
        """Parsed JSON bodies of chat completion requests, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> Any:
        with self._lock:
            return self._requests[-1] if self._requests else None

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Headers (lower-case names) of chat completion requests, parallel to ``requests``."""
        with self._lock:
            return [dict(h) for h in self._request_headers]

    @property
    def request_peers(self) -> list[tuple[str, int] | None]:
        """The client address (host, port) of each chat completion request, parallel to
        ``requests``: one TCP connection per distinct address."""
        with self._lock:
            return list(self._request_peers)

    @property
    def requests_count(self) -> int:
        with self._lock:
            return len(self._requests)

    @property
    def disconnects(self) -> int:
        with self._lock:
            return len(self._disconnect_times)

    @property
    def disconnect_times(self) -> list[float]:
        """``time.monotonic()`` of each client disconnect before the response completed."""
        with self._lock:
            return list(self._disconnect_times)

    # ---- internals: state -------------------------------------------------------------------

    def _event(self, table: dict[str, threading.Event], name: str) -> threading.Event:
        with self._lock:
            ev = table.get(name)
            if ev is None:
                ev = table[name] = threading.Event()
            return ev

    def _next_reply(self) -> AnyReply:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default_reply

    def _record(
        self, body: Any, headers: dict[str, str], peer: tuple[str, int] | None = None
    ) -> int:
        with self._changed:
            self._requests.append(body)
            self._request_headers.append(headers)
            self._request_peers.append(peer)
            self._seq += 1
            self._changed.notify_all()
            return self._seq

    def _record_disconnect(self) -> None:
        with self._changed:
            self._disconnect_times.append(time.monotonic())
            self._changed.notify_all()

    # ---- internals: ASGI --------------------------------------------------------------------

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        resp = _Response(send)

        if (method, path) in self.routes:
            with self._lock:
                self.hits.append((method, path, json.loads(body) if body else None))
            await resp.json(200, self.routes[(method, path)])
        elif path == "/v1/chat/completions" and method == "POST":
            try:
                parsed: Any = json.loads(body) if body else None
            except ValueError:
                parsed = None
            client = scope.get("client")
            seq = self._record(parsed, headers, tuple(client) if client else None)
            if not self._authorized(headers):
                await resp.json(
                    401, error(401, "Incorrect API key provided", code="invalid_api_key").body
                )
                return
            if not isinstance(parsed, dict):
                await resp.json(400, error(400, "request body is not a JSON object").body)
                return
            await self._guarded(self._chat(parsed, seq, resp), receive, resp)
        elif path == "/v1/models" and method == "GET":
            await asyncio.sleep(self.models_delay)
            if not self._authorized(headers):
                await resp.json(
                    401, error(401, "Incorrect API key provided", code="invalid_api_key").body
                )
                return
            others = [self._model_card(name) for name in self.other_models]
            await resp.json(200, {"object": "list", "data": [self._model_card(), *others]})
        elif path.startswith("/v1/models/") and method == "GET":
            await asyncio.sleep(self.models_delay)
            model_id = path[len("/v1/models/") :]
            if model_id == self.model or model_id in self.other_models:
                await resp.json(200, self._model_card(model_id))
            else:
                await resp.json(
                    404,
                    error(
                        404, f"The model '{model_id}' does not exist", code="model_not_found"
                    ).body,
                )
        else:
            await resp.json(
                404, error(404, f"Unknown route {method} {path}", code="unknown_url").body
            )

    def _authorized(self, headers: dict[str, str]) -> bool:
        return self.api_key is None or headers.get("authorization") == f"Bearer {self.api_key}"

    def _model_card(self, model_id: str | None = None) -> dict[str, Any]:
        """The card states ``context_length`` unless it is None (like llama.cpp, Ollama);
        the other models' cards state none."""
        card = {"id": model_id or self.model, "object": "model", "created": 0, "owned_by": "fake"}
        if self.context_length is not None and model_id in (None, self.model):
            card["context_length"] = self.context_length
        return card

    async def _guarded(self, producer: Any, receive: Any, resp: _Response) -> None:
        """Run ``producer`` while watching for the client going away."""

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    break
            if not resp.finished:
                self._record_disconnect()

        prod_task = asyncio.ensure_future(producer)
        watch_task = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({prod_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (prod_task, watch_task):
                if not task.done():
                    task.cancel()
            for task in (prod_task, watch_task):
                with contextlib.suppress(asyncio.CancelledError, _Aborted):
                    await task
        # If the producer returned without finishing (drop / fake stopping), uvicorn closes
        # the connection abruptly, which is exactly what we want.

    async def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self._stopping.is_set():
                raise _Aborted
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, _TICK))

    async def _control(self, step: Step) -> None:
        if isinstance(step, Delay):
            await self._sleep(step.seconds)
        elif isinstance(step, Barrier):
            self._event(self._reached, step.name).set()
            released = self._event(self._released, step.name)
            while not released.is_set():
                await self._sleep(_TICK)
        elif isinstance(step, Hang):
            while True:
                await self._sleep(1.0)

    async def _chat(self, body: dict[str, Any], seq: int, resp: _Response) -> None:
        rep = self._next_reply()
        if isinstance(rep, ErrorReply):
            await resp.json(rep.status, rep.body, rep.headers)
            return
        stream = bool(body.get("stream"))
        if isinstance(rep, MalformedReply):
            ctype = "text/event-stream" if stream else "application/json"
            await resp.start(200, ctype)
            await resp.finish(rep.payload.encode())
            return
        if rep.steps and isinstance(rep.steps[0], Stall):
            await self._control(Hang())
        model = body.get("model") or self.model
        usage = self._usage(body, rep)
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await self._stream(rep, seq, model, usage, include_usage, resp)
        else:
            await self._complete(rep, seq, model, usage, resp)

    def _usage(self, body: dict[str, Any], rep: Reply) -> dict[str, Any]:
        prompt = max(1, len(json.dumps(body.get("messages", []))) // 4)
        out_chars = len(rep.text) + len(rep.reasoning)
        out_chars += sum(len(t.name) + len(t.arguments_json) for t in rep.tool_calls)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": max(1, out_chars // 4),
        }
        usage.update(rep.usage or {})
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        return usage

    async def _stream(
        self,
        rep: Reply,
        seq: int,
        model: str,
        usage: dict[str, Any],
        include_usage: bool,
        resp: _Response,
    ) -> None:
        created = int(time.time())
        cid = f"chatcmpl-fake-{seq}"

        def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> bytes:
            obj: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fake",
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                obj["usage"] = usage if delta is None else None
            return f"data: {json.dumps(obj)}\n\n".encode()

        await resp.start(200, "text/event-stream", {"cache-control": "no-cache"})
        await resp.body(chunk({"role": "assistant", "content": ""}))
        tool_index = 0
        for step in rep.steps:
            if isinstance(step, Reasoning):
                await resp.body(chunk({self.reasoning_field: step.text}))
            elif isinstance(step, Text):
                await resp.body(chunk({"content": step.text}))
            elif isinstance(step, ToolCall):
                await resp.body(
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": tool_index,
                                    "id": step.id,
                                    "type": "function",
                                    "function": {"name": step.name, "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                for piece in _split(step.arguments_json, step.pieces):
                    await resp.body(
                        chunk(
                            {
                                "tool_calls": [
                                    {
                                        "index": tool_index,
                                        "function": {"arguments": piece},
                                    }
                                ]
                            }
                        )
                    )
                tool_index += 1
            elif isinstance(step, StreamError):
                err = {
                    "error": {
                        "message": step.message,
                        "type": step.type,
                        "param": None,
                        "code": step.code,
                    }
                }
                await resp.finish(f"data: {json.dumps(err)}\n\n".encode())
                return
            elif isinstance(step, Drop):
                return  # uvicorn closes the socket: incomplete chunked body
            elif isinstance(step, Raw):
                await resp.body(f"data: {step.payload}\n\n".encode())
            elif isinstance(step, End):
                await resp.finish()
                return
            else:
                await self._control(step)
        await resp.body(chunk({}, rep.resolved_finish_reason()))
        if include_usage:
            await resp.body(chunk(None))
        await resp.finish(b"data: [DONE]\n\n")

    async def _complete(
        self, rep: Reply, seq: int, model: str, usage: dict[str, Any], resp: _Response
    ) -> None:
        for step in rep.steps:
            if isinstance(step, StreamError):
                err = {
                    "error": {
                        "message": step.message,
                        "type": step.type,
                        "param": None,
                        "code": step.code,
                    }
                }
                await resp.json(step.status, err)
                return
            if isinstance(step, Drop):
                # Promise a body, send half of nothing, hang up.
                await resp.start(200, "application/json", content_length=1000)
                await resp.body(b'{"id": "chatcmpl-fake-')
                return
            await self._control(step)
        message: dict[str, Any] = {"role": "assistant", "content": rep.text or None}
        if rep.reasoning:
            message[self.reasoning_field] = rep.reasoning
        if rep.tool_calls:
            message["tool_calls"] = [
                {
                    "id": t.id,
                    "type": "function",
                    "function": {"name": t.name, "arguments": t.arguments_json},
                }
                for t in rep.tool_calls
            ]
        await resp.json(
            200,
            {
                "id": f"chatcmpl-fake-{seq}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "system_fingerprint": "fake",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": rep.resolved_finish_reason(),
                    }
                ],
                "usage": usage,
            },
        )


def _split(s: str, pieces: int) -> Iterable[str]:
    """Split ``s`` into at most ``pieces`` non-empty fragments (one "" if ``s`` is empty)."""
    if not s:
        return [""]
    size = max(1, -(-len(s) // pieces))
    return [s[i : i + size] for i in range(0, len(s), size)]
