"""The fake's script language: the steps a reply is made of, the reply types and their
constructors (``reply(text("Hi"), tool_call(...))``, ``error(429, ...)``, ...).

Tests write scripts in these terms and the server only reads them, so they live apart from
the HTTP plumbing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


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
class Verbatim:
    """Bytes of the SSE body sent exactly as given: lines other than ``data:`` (llama.cpp's
    ``error: {...}`` line, a named ``event: error``, CRLF endings, ...)."""

    payload: str


@dataclass(frozen=True)
class End:
    """End the response cleanly here: the HTTP body completes, but with no chunk carrying a
    ``finish_reason`` and no ``[DONE]`` (how a server that crashed mid-answer looks)."""


@dataclass(frozen=True)
class Stall:
    """As the first step: send nothing at all, not even the response headers, until the
    client gives up (a provider that accepted the connection and went quiet)."""


Step = (
    Reasoning
    | Text
    | ToolCall
    | Delay
    | Barrier
    | Hang
    | Drop
    | StreamError
    | Raw
    | Verbatim
    | End
    | Stall
)


@dataclass
class Reply:
    """A scripted successful reply.

    ``finish_reason=None`` means automatic: ``"tool_calls"`` if any step is a ToolCall, else
    ``"stop"``. ``usage`` (partial dicts allowed) overrides the estimated token counts;
    ``total_tokens`` is filled in when missing. ``unstreamed``: answered as one JSON body even
    to a streamed request (a server or proxy that ignores ``stream``).
    """

    steps: list[Step] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    unstreamed: bool = False

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
    """An HTTP error with an OpenAI-style body ``{"error": {message, type, param, code}}``, any
    other JSON body, or an HTML page (``body`` a string: a proxy's or web server's page)."""

    status: int
    body: dict[str, Any] | list[Any] | str
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


def verbatim(payload: str) -> Verbatim:
    """Bytes of the SSE body sent as given (give the line endings too)."""
    return Verbatim(payload)


def end() -> End:
    return End()


def stall() -> Stall:
    return Stall()


def stream_error(
    message: str, *, type: str = "server_error", code: str | None = None, status: int = 500
) -> StreamError:
    return StreamError(message, type, code, status)


def reply(
    *steps: Step | str,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    unstreamed: bool = False,
) -> Reply:
    """``reply(text("a"), tool_call(...))``; bare strings are treated as ``text(...)``."""
    return Reply(
        [text(s) if isinstance(s, str) else s for s in steps], finish_reason, usage, unstreamed
    )


def error(
    status: int,
    body_or_message: str | dict[str, Any] | list[Any] = "",
    code: str | None = None,
    type: str | None = None,
    *,
    headers: dict[str, str] | None = None,
) -> ErrorReply:
    """An error reply. A dict or list is sent verbatim as the JSON body; a string becomes
    ``{"error": {"message": ..., "type": ..., "param": None, "code": code}}`` with ``type``
    defaulting by status (``invalid_request_error`` for 4xx, ``rate_limit_error`` for 429,
    ``server_error`` for 5xx)."""
    body: dict[str, Any] | list[Any]
    if isinstance(body_or_message, dict | list):
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


def error_page(status: int, html: str, *, headers: dict[str, str] | None = None) -> ErrorReply:
    """An HTTP error whose body is an HTML page (nginx, Cloudflare, a web app)."""
    return ErrorReply(status, html, dict(headers or {}))


def malformed(payload: str | None = None) -> MalformedReply:
    return MalformedReply() if payload is None else MalformedReply(payload)


def drop_connection(*before: Step | str) -> Reply:
    """A reply that sends ``before`` (e.g. some text) and then closes the socket mid-stream."""
    return reply(*before, drop())


def coerce_reply(item: AnyReply | Step | str | Sequence[Step | str]) -> AnyReply:
    if isinstance(item, Reply | ErrorReply | MalformedReply):
        return item
    if isinstance(item, str):
        return reply(item)
    if isinstance(item, list | tuple):
        return reply(*item)
    if isinstance(item, Step):
        return reply(item)
    raise TypeError(f"cannot script {item!r}")
