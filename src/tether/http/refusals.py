"""A refusal sent straight from an ASGI middleware (the Host check, login, the body limit, the
body deadline), before any route: the same `{code, message, ...}` body and status as the
error family's handler (http/errors.py), so a client cannot tell which layer refused."""

from __future__ import annotations

import json

from starlette.types import Send

from tether.errors import ApiError


async def send_refusal(send: Send, refusal: ApiError, *, close: bool = False) -> None:
    """`close`: the connection is not reused (its request was not read to the end)."""
    body = json.dumps(refusal.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
