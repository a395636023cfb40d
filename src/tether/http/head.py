"""HEAD answered for every GET route: the GET's status and headers without its body (RFC
9110, 9.3.2). FastAPI registers only the methods a route names, so a health checker probing
with HEAD saw 405 and took the server for down.

A plain ASGI middleware rather than HEAD on each route: one place covers the page routes, the
API and the event streams, and the OpenAPI document does not list a second operation per
route. The response ends as soon as its head is sent, so a HEAD on an event stream returns
at once (uvicorn then reports the request as finished, which ends the stream and frees its
slot).

A GET that acts rather than reads (the sign-in callback spends a one-time code) asks
`asked_with_head` and refuses the HEAD, so a link checker's probe does not act for the person.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEAD_SCOPE_KEY = "tether.head"


def asked_with_head(request: Request) -> bool:
    """Whether this GET is really a HEAD answered as one."""
    return bool(request.scope.get(HEAD_SCOPE_KEY))


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def head_only(message: Message) -> None:
            nonlocal ended
            if ended or message["type"] != "http.response.start":
                return
            ended = True
            await send(message)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET", HEAD_SCOPE_KEY: True}, receive, head_only)
