"""What the `tether` command's flags accept, and the checks `serve` makes before it writes
anything: each refusal is one line naming the flag or the reason (docs/configuration.md)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import click

from tether.sessions.defaults import SYSTEM_PROMPT_MAX_CHARS


class CommaListed(click.ParamType):
    """A repeatable option whose environment variable lists its values separated by commas
    (`TETHER_ALLOWED_HOSTS=a.example,b.example`); an empty item is ignored."""

    def __init__(self, name: str, check: Callable[[str], object]) -> None:
        self.name = name
        self._check = check

    def split_envvar_value(self, rv: str) -> list[str]:
        return [item.strip() for item in rv.split(",") if item.strip()]

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):  # noqa: ANN201
        text = str(value).strip()
        try:
            self._check(text)
        except ValueError as exc:
            self.fail(f"{text!r} is not a valid {self.name}: {exc}", param, ctx)
        return text


def proxy_address(value: str) -> None:
    ipaddress.ip_network(value, strict=False)


def host_name(value: str) -> None:
    """As the host check reads a Host header (a port, if given, is a number): a value it
    cannot read would match no request."""
    from tether.http.hosts import host_name as read  # `tether users` loads no web code

    if value == "*":
        return
    if any(c in value for c in "/ @?#") or read(value) is None:
        raise ValueError("give a host name such as tether.example.com, or *")


def database_url_of(value: str | None) -> str | None:
    if not value:
        return None
    if not value.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("give a postgresql:// URL (e.g. postgresql://tether@db/tether)")
    return value


def oidc_issuer(value: str | None) -> str | None:
    """Discovery is fetched from it only at the first sign-in, so a bare host name (no scheme)
    would fail there, for every person, rather than here."""
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter(
            "give the provider's http:// or https:// issuer URL "
            "(e.g. https://id.example.com/realms/main)"
        )
    return value


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token


def header_name(value: str) -> str:
    """No request can carry a header whose name is not a token: nobody could sign in."""
    if not _HEADER_NAME.fullmatch(value):
        raise click.BadParameter(
            f"give an HTTP header name such as X-Forwarded-User, not {value!r}"
        )
    return value


def system_prompt_of(value: str | None) -> str | None:
    if value is not None and len(value) > SYSTEM_PROMPT_MAX_CHARS:
        raise click.BadParameter(f"at most {SYSTEM_PROMPT_MAX_CHARS:,} characters")
    return value if value and value.strip() else None


def check_can_listen(host: str, port: int) -> None:
    """uvicorn binds only once the app has started and logged that it is ready; a port in use or
    a host that does not resolve is refused here first, in one line, before anything is
    written (uvicorn's own bind stays the last word on a port taken in between)."""

    async def listen_and_close() -> None:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, port)
        server.close()
        await server.wait_closed()

    try:
        asyncio.run(listen_and_close())
    except OSError as exc:
        # asyncio rewords a failed bind but keeps its errno; a failed look-up has no errno text
        reason = exc.strerror if isinstance(exc, socket.gaierror) else os.strerror(exc.errno or 0)
        raise click.ClickException(f"Cannot listen on {host} port {port}: {reason}.") from None


def first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (None: it all exists)."""
    missing = None
    for directory in (path, *path.parents):
        if directory.exists():
            return missing
        missing = directory
    return missing


def remove_made(path: Path, made: Path | None) -> None:
    """Remove the directories from `path` up to `made` that a refused start created, where
    they are still empty (so a refusal leaves nothing behind, and never removes a file)."""
    if made is None:
        return
    for directory in (path, *path.parents):
        try:
            directory.rmdir()
        except OSError:
            return  # not empty (or gone): what is in it stays
        if directory == made:
            return
