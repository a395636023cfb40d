"""How the fake writes an HTTP response on ASGI: the routes' JSON answers and the chat
completions' streamed ones go through the same writer, which remembers whether the response
has finished (a disconnect after that is not counted)."""

from __future__ import annotations

import json
from typing import Any


class Response:
    """Per-request state shared by the producer and the disconnect watcher."""

    def __init__(self, send: Any) -> None:
        self._send = send
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
