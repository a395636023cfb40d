"""Deadlines for clients that send slowly: a request head must arrive within
`--header-timeout-seconds`, a request body within `--body-timeout-seconds` (docs/security.md,
"Slow clients"). Without them a connection that dribbles its headers, or never finishes a
chunked body, is held forever: 250 of 250 such connections were still open after 50 s.

uvicorn has no header deadline (its keep-alive timeout is armed only after a response, and
any byte cancels it), and the app is not called before the head is complete, so the first
deadline lives in the connection's protocol: a subclass of uvicorn's httptools protocol that
arms a timer when a connection opens and when a new request begins, and disarms it once the
head is parsed. The body deadline is plain ASGI middleware around `receive`.
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tether.errors import RequestTimeout
from tether.http.refusals import send_refusal

REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def _timeout_body(what: str, seconds: float) -> bytes:
    refusal = RequestTimeout(f"The request {what} did not arrive within {seconds:g} s.")
    return json.dumps(refusal.body()).encode()


def header_deadline_protocol(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a deadline for each request head."""
    body = _timeout_body("headers", seconds)

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(seconds, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.write(REQUEST_TIMEOUT % (len(body), body))
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()  # a connection that sends nothing at all is held too

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol


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
