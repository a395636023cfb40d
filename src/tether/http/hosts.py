"""Answer only to the host names this server is meant to be reached by (DNS rebinding).

A web page on `evil.example` whose DNS record is switched to 127.0.0.1 talks to Tether from
the browser as a same-origin page, so the Origin check and the cookie's SameSite cannot stop
it; its requests still carry `Host: evil.example`. Refusing every Host that is not a loopback
name, the bound address or an `--allowed-host` value closes that door, before any route (the
SSE streams included) and before the login check.

A plain ASGI middleware rather than Starlette's TrustedHostMiddleware: that one takes the
name before the first `:`, so `[::1]:8787` never matches, and it answers in plain text where
every other Tether error is `{code, message}`.
"""

from __future__ import annotations

import ipaddress

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.errors import HostNotAllowed
from tether.http.refusals import send_refusal
from tether.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost"})
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def host_name(header: str) -> str | None:
    """The name of a Host header without its port, lower-case and without a final dot
    (`[::1]:8787` -> `::1`); None when it is not a host[:port] at all."""
    value = header.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name if _ip(name) is not None else None
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.removesuffix(".")
    return name or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class AllowedHosts:
    """Loopback names and addresses always; the bound address; the configured names (`*`
    turns the check off). When the server listens on every address (0.0.0.0, ::), any IP
    literal is accepted too: a browser sends an IP as Host only for a URL that names that
    IP, so its page's origin is Tether's own and rebinding cannot produce one."""

    def __init__(self, bound: str, extra: tuple[str, ...] = ()) -> None:
        self.any_host = "*" in extra
        self.any_ip = bound in WILDCARD_ADDRESSES
        self.names = LOOPBACK_NAMES | {n for n in (host_name(h) for h in extra) if n}
        if not self.any_ip and (bound_name := host_name(bound) or host_name(f"[{bound}]")):
            self.names |= {bound_name}

    @classmethod
    def from_settings(cls, settings: Settings) -> AllowedHosts:
        return cls(settings.host, tuple(settings.allowed_hosts))

    def allows(self, header: str | None) -> bool:
        if self.any_host:
            return True
        name = host_name(header) if header else None
        if name is None:
            return False
        if name in self.names:
            return True
        ip = _ip(name)
        return ip is not None and (ip.is_loopback or self.any_ip)


class HostGuard:
    """Refuses a request whose Host is not allowed with 421 `host_not_allowed`."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host")
        if self.allowed.allows(host):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        shown = (host or "")[:100]
        refusal = HostNotAllowed(
            f"This server does not answer to the host name {shown!r}. If it "
            "is yours, start Tether with --allowed-host for it."
        )
        await send_refusal(send, refusal, close=True)
