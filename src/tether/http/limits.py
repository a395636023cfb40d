"""Request-body ceiling as plain ASGI middleware: a body over the limit is refused with 413
before any handler sees it, whether it declares Content-Length or streams."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.errors import PayloadTooLarge
from tether.http.refusals import send_refusal


class _TooLarge(Exception):
    """Raised into the route reading past the limit, for BodyLimit to answer 413. `body()`
    is the refusal's, so what records the route's failure (an import's job) can say it."""

    def __init__(self, refusal: PayloadTooLarge) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal

    def body(self) -> dict[str, Any]:
        return self.refusal.body()


class BodyLimit:
    """`max_bytes` for every route but those `larger` names (path -> its own ceiling: an
    import file may be larger than any other body)."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.larger = larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.larger.get(path, self.max_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await send_refusal(send, _refusal(limit, path), close=True)
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(_refusal(limit, path))
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge as exc:
            if not started:
                await send_refusal(send, exc.refusal, close=True)


# What a person sending a message can do about it: the page sends its files in the request.
_WITH_FILES = (
    " A message and its attachments are sent together, as base64: attach fewer or smaller files."
)
_HINTS = {"/api/chat/start": _WITH_FILES, "/api/chat/queue": _WITH_FILES}


def _refusal(limit: int, path: str = "") -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than {limit / 2**20:g} MiB ({limit:,} bytes)."
        + _HINTS.get(path, ""),
        limit_bytes=limit,
    )
