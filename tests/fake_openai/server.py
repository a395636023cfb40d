"""FakeOpenAI itself: a uvicorn server in a daemon thread, and the routes other than chat
completions (``/v1/models``, the routes a test adds for other servers' own endpoints).

uvicorn is tuned here to stay out of the way of the app under test, which may run its own
uvicorn in the same process: no logging set-up, no access log, a shutdown in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .chat import ChatCompletions
from .response import Response
from .steps import error

DEFAULT_MODEL = "fake-model"
DEFAULT_CONTEXT_LENGTH = 32768
_THREAD_PREFIX = "fake-openai"


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


class FakeOpenAI(ChatCompletions):
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
        super().__init__()
        # Other servers' own endpoints, answered with this JSON: {("GET", "/props"): {...}}
        # (llama.cpp), ("POST", "/api/show") (Ollama), ... Requests to them are in `hits`.
        self.routes: dict[tuple[str, str], Any] = {}
        self.models_delay = 0.0  # seconds before answering /v1/models (a slow lookup)
        self.other_models: list[str] = []  # listed by /v1/models after `model`, no window stated
        self.hits: list[tuple[str, str, Any]] = []

        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

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
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that name it, and a
        # model server people run (uvloop, Go) sends each chunk at once.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
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
        resp = Response(send)

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
