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
(``reasoning``, ``text``, ``tool_call``, ``stream_error``, ``raw``, ``verbatim``) and control steps
(``delay``, ``barrier``, ``hang``, ``drop``, ``end``). Client disconnects during a response
are detected at once (the ASGI ``http.disconnect`` message is watched by a separate task) and
counted in
``fake.disconnects`` / ``fake.disconnect_times`` (``time.monotonic()`` values).

All public methods are safe to call from the test thread while the server thread runs.

The package: ``steps`` (the script language), ``state`` (the script and the record of
requests), ``chat`` (the chat completions answers), ``response`` (the ASGI response writer)
and ``server`` (FakeOpenAI on uvicorn, the other routes). Tests import from here.
"""

from .server import DEFAULT_CONTEXT_LENGTH, DEFAULT_MODEL, FakeOpenAI
from .steps import (
    Barrier,
    Delay,
    Drop,
    End,
    ErrorReply,
    Hang,
    MalformedReply,
    Raw,
    Reasoning,
    Reply,
    Stall,
    StreamError,
    Text,
    ToolCall,
    Verbatim,
    barrier,
    delay,
    drop,
    drop_connection,
    end,
    error,
    error_page,
    hang,
    malformed,
    raw,
    reasoning,
    reply,
    stall,
    stream_error,
    text,
    tool_call,
    verbatim,
)

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
    "Verbatim",
    "barrier",
    "delay",
    "drop",
    "drop_connection",
    "end",
    "error",
    "error_page",
    "hang",
    "malformed",
    "raw",
    "reasoning",
    "reply",
    "stall",
    "stream_error",
    "text",
    "tool_call",
    "verbatim",
]
