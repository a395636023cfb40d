"""Deadlines for clients that send slowly: a request head must arrive within
`--header-timeout-seconds`, a request body within `--body-timeout-seconds` (docs/security.md,
"Slow clients"). Without them a connection that dribbles its headers, or never finishes a
chunked body, is held forever: 250 of 250 such connections were still open after 50 s.

uvicorn has no header deadline (its keep-alive timeout is armed only after a response, and
any byte cancels it), and the app is not called before the head is complete, so the first
deadline lives in the connection's protocol: a subclass of uvicorn's httptools protocol that
arms a timer when a connection opens and when a new request begins, and disarms it once the
head is parsed. The body deadline is plain ASGI middleware around `receive`.

A connection closed while its request is unfinished (either deadline's 408) closes lingering,
as Apache and nginx do: closing a socket whose client is still sending makes the kernel answer
with a reset, which can destroy the 408 before the client reads it (seen under load: one of 40
dribbling sockets read nothing). So the server sends its answer, shuts down its own side, and
discards what still arrives until the client closes or `LINGER_SECONDS` pass.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tether.errors import RequestTimeout
from tether.http.refusals import send_refusal

LINGER_SECONDS = 2.0
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def _timeout_body(what: str, seconds: float) -> bytes:
    refusal = RequestTimeout(f"The request {what} did not arrive within {seconds:g} s.")
    return json.dumps(refusal.body()).encode()


class _LingeringTransport(asyncio.Transport):
    """The connection's transport as uvicorn sees it: `close()` lingers while the protocol's
    request is unfinished; everything else goes to the real transport."""

    def __init__(self, real: asyncio.Transport, protocol: HeaderDeadlineProtocol) -> None:
        super().__init__()
        self._real = real
        self._protocol = protocol

    def close(self) -> None:
        if self._protocol.lingering:
            return  # closes on its own: when the client does, or at the linger's end
        if self._protocol.mid_request and not self._real.is_closing():
            self._protocol.linger()
        else:
            self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    # asyncio.Transport defines these as raising NotImplementedError, so __getattr__ alone
    # would never reach the real transport's.
    def is_closing(self) -> bool:
        return self._real.is_closing() or self._protocol.lingering

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._real.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._real.pause_reading()

    def resume_reading(self) -> None:
        self._real.resume_reading()

    def is_reading(self) -> bool:
        return self._real.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._real.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._real.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    def abort(self) -> None:
        self._real.abort()


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request head (`head_seconds`, set
    by `header_deadline_protocol`) and a lingering close for an unfinished request."""

    head_seconds: float = 10.0
    head_timeout_body: bytes = b""
    mid_request = False
    lingering = False
    _head_timer: asyncio.TimerHandle | None = None
    _real_transport: asyncio.Transport

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_seconds, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            body = self.head_timeout_body
            self.transport.write(REQUEST_TIMEOUT % (len(body), body))
            self.transport.close()

    def linger(self) -> None:
        """Send what is buffered and a FIN, keep reading (and discarding) until the client
        closes, and close for good after `LINGER_SECONDS`."""
        self.lingering = True
        self._disarm()
        real = self._real_transport
        real.resume_reading()  # uvicorn may have paused it for a body nobody will read now
        if real.can_write_eof():
            real.write_eof()
        self.loop.call_later(LINGER_SECONDS, real.close)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._real_transport = transport
        super().connection_made(_LingeringTransport(transport, self))
        self._arm()  # a connection that sends nothing at all is held too

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)

    def eof_received(self) -> None:
        if self.lingering:
            self._real_transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.mid_request = True
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.mid_request = False
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def header_deadline_protocol(seconds: float) -> type[asyncio.Protocol]:
    """The protocol class uvicorn is given: `HeaderDeadlineProtocol` with this deadline."""
    return type(
        "HeaderDeadlineProtocol",
        (HeaderDeadlineProtocol,),
        {"head_seconds": seconds, "head_timeout_body": _timeout_body("headers", seconds)},
    )


class BodyDeadline:
    """The whole request body must be received within `seconds` of the request's start;
    otherwise the client gets 408 `request_timeout` and the connection is closed, and the
    route sees a disconnected client (so nothing is stored). Once the body is complete,
    `receive` is passed through untouched: an event stream waits on it for the disconnect."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds
        self.refusal = RequestTimeout(f"The request body did not arrive within {seconds:g} s.")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        body_done = False
        started = False
        timed_out = False

        async def timed_receive() -> Message:
            nonlocal body_done, timed_out
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                timed_out = True
                if not started:
                    await self._refuse(send)
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if timed_out:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, timed_receive, guarded_send)

    async def _refuse(self, send: Send) -> None:
        await send_refusal(send, self.refusal, close=True)
