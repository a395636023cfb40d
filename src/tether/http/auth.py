"""Access control (docs/security.md): the password, the session cookie, the login rate limit,
and the ASGI gate that checks the Origin of state-changing requests and the session of every
other request.

- The password comes from an environment variable (`--password-env`) or the first line of a
  file (`--password-file`). It is hashed with argon2id (argon2-cffi) at start; only the hash
  is kept, in memory and in `<data_dir>/auth.json` (0600), which is how a changed password is
  noticed: it rotates the cookie secret, so every earlier session is logged out.
- The session cookie `tether_session` is an itsdangerous-signed, timestamped token carrying a
  random nonce. Logout revokes the nonce: revoked nonces are kept (with their expiry) in
  memory and in `auth.json`, so a logged-out cookie stays refused across restarts, and on
  every replica sharing the data directory: each save merges the file's list under a lock
  file (`auth.lock`), and a check reads the file again once it changed.
- Login failures are limited per client address (`log.shared.LoginLimits`: in memory, or
  with PostgreSQL in the database, counted for every replica at once); the argon2 check runs
  in a thread.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from itsdangerous import BadData, URLSafeTimedSerializer
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.errors import ApiError, BadOrigin, Unauthenticated
from tether.http.accounts import PRINCIPAL, AccountAuth, Guard, bearer_token
from tether.http.refusals import send_refusal
from tether.log.ownership import NOBODY, VIEWER
from tether.log.private import private_dir
from tether.settings import Settings

log = logging.getLogger("tether.auth")

COOKIE_NAME = "tether_session"
SESSION_MAX_AGE = 30 * 24 * 3600
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Reachable without a session: readiness, the login page and its API, and static assets.
PUBLIC_PATHS = frozenset(
    {
        "/api/health",
        "/login",
        "/api/auth/login",
        "/api/auth/logout",
        "/api/auth/status",
        "/api/auth/oidc/login",
        "/api/auth/oidc/callback",
    }
)
PUBLIC_PREFIXES = ("/static/",)
MAX_REVOKED = 10_000


class PasswordError(Exception):
    """The password could not be loaded; the message names the variable or file."""


def load_password(settings: Settings) -> str | None:
    """The configured password, or None when none is configured. The environment variable is
    removed from this process's environment once read, so tools never inherit it."""
    if settings.password_env and settings.password_file:
        raise PasswordError("Use either --password-env or --password-file, not both.")
    if settings.password_env:
        var = settings.password_env
        value = os.environ.pop(var, None)
        if value is None:
            raise PasswordError(
                f"The environment variable {var} (named by --password-env) is not set."
            )
        source = f"The environment variable {var}"
    elif settings.password_file:
        path = Path(settings.password_file)
        try:
            with path.open(encoding="utf-8") as handle:
                value = handle.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise PasswordError(f"Cannot read the password file {path}: {reason}.") from None
        source = f"The password file {path}"
    else:
        return None
    if not value.strip():
        raise PasswordError(f"{source} holds an empty password.")
    return value


def _write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class Authenticator:
    """Checks passwords and session cookies. Without a password everyone is let in."""

    def __init__(self, data_dir: Path, password: str | None) -> None:
        self.password_required = password is not None
        self._verify_slots = asyncio.Semaphore(2)  # argon2 takes 64 MiB per check
        self._lock = threading.Lock()
        self._revoked: dict[str, float] = {}
        self._seen: tuple[int, int, int] | None = None  # auth.json as last read or written
        self._watchers: set[CookieGuard] = set()
        self._hash = ""
        if password is None:
            return
        self._hasher = PasswordHasher()
        private_dir(data_dir)
        self._state_path = data_dir / "auth.json"
        self._lock_path = data_dir / "auth.lock"
        self._secret_path = data_dir / "secret_key"
        state = self._read_state()
        stored = state.get("password_hash")
        if isinstance(stored, str) and self._check(stored, password):
            self._hash = stored
            if self._hasher.check_needs_rehash(stored):
                self._hash = self._hasher.hash(password)
            self._merge(state.get("revoked"))
            secret = self._load_secret()
            merge = True
        else:  # first start, or a new password: every earlier cookie is logged out
            if stored is not None:
                log.warning("the password changed: earlier login sessions are logged out")
            self._hash = self._hasher.hash(password)
            secret = self._new_secret()
            merge = False
        self._serializer = self._make_serializer(secret)
        self._save(merge)

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        return cls(settings.data_dir, load_password(settings))

    # -- persistence ------------------------------------------------------------------

    def _read_state(self) -> dict:
        try:
            state = json.loads(self._state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _save(self, merge: bool = True) -> None:
        """Write the state, first taking in the logouts another replica sharing the data
        directory wrote (docs/operations.md), under a lock file so that neither drops the
        other's."""
        with os.fdopen(os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)) as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            if merge:
                self._merge(self._read_state().get("revoked"))
            with self._lock:
                state = {"password_hash": self._hash, "revoked": dict(self._revoked)}
            _write_private(self._state_path, json.dumps(state))
            self._seen = self._signature()

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self._state_path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _merge(self, revoked: object) -> None:
        """Take in a list of logged-out nonces (their expiry by nonce), dropping expired ones."""
        now = time.time()
        with self._lock:
            merged = {n: t for n, t in self._revoked.items() if t > now}
            if isinstance(revoked, dict):
                for nonce, expiry in revoked.items():
                    if isinstance(expiry, int | float) and expiry > now:
                        merged[nonce] = max(float(expiry), merged.get(nonce, 0.0))
            self._revoked = merged

    def _catch_up(self) -> None:
        """A logout through another replica sharing the data directory holds here at the next
        request: `auth.json` is read again when it changed (a stat per check)."""
        seen = self._signature()
        if seen is not None and seen != self._seen:
            self._seen = seen
            self._merge(self._read_state().get("revoked"))

    def _load_secret(self) -> str:
        try:
            secret = self._secret_path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            secret = ""
        if len(secret) < 32:
            return self._new_secret()
        if self._secret_path.stat().st_mode & 0o077:
            log.warning("%s was readable by others; restricting it to its owner", self._secret_path)
            os.chmod(self._secret_path, 0o600)
        return secret

    def _new_secret(self) -> str:
        secret = secrets.token_urlsafe(48)
        _write_private(self._secret_path, secret + "\n")
        self._revoked = {}
        return secret

    @staticmethod
    def _make_serializer(secret: str) -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(
            secret, salt="tether-session", signer_kwargs={"digest_method": hashlib.sha256}
        )

    # -- passwords --------------------------------------------------------------------

    def _check(self, encoded: str, password: str) -> bool:
        try:
            return self._hasher.verify(encoded, password)
        except (VerificationError, InvalidHashError):
            return False

    async def verify_password(self, password: str) -> bool:
        """The argon2 check, off the event loop, at most two at a time."""
        if not self.password_required:
            return True
        async with self._verify_slots:
            return await asyncio.to_thread(self._check, self._hash, password)

    # -- sessions ---------------------------------------------------------------------

    def new_session_cookie(self) -> str:
        return self._serializer.dumps({"n": secrets.token_urlsafe(18)})

    def _decode(self, cookie: str | None) -> tuple[str, float] | None:
        if not self.password_required or not cookie:
            return None
        try:
            payload, issued = self._serializer.loads(
                cookie, max_age=SESSION_MAX_AGE, return_timestamp=True
            )
        except BadData:
            return None
        nonce = payload.get("n") if isinstance(payload, dict) else None
        self._catch_up()
        if not isinstance(nonce, str) or nonce in self._revoked:
            return None
        return nonce, issued.timestamp()

    def is_authenticated(self, cookie: str | None) -> bool:
        return not self.password_required or self._decode(cookie) is not None

    async def revoke(self, cookie: str | None) -> bool:
        """Log this cookie's session out for good; False when it was not a live session."""
        decoded = self._decode(cookie)
        if decoded is None:
            return False
        nonce, issued = decoded
        self._merge({nonce: issued + SESSION_MAX_AGE})
        rotated = len(self._revoked) > MAX_REVOKED
        if rotated:  # never forget a revocation: rotate instead
            self._serializer = self._make_serializer(self._new_secret())
        for guard in list(self._watchers):  # its open streams end at once
            guard.changed()
        await asyncio.to_thread(self._save, not rotated)
        return True

    def guard(self, cookie: str | None, every: float) -> CookieGuard:
        return CookieGuard(self, cookie, every)


class CookieGuard(Guard):
    """A single-password stream: a logout of its cookie (in another tab at once, through
    another replica at the next ask) or a rotated secret ends it, and so does its expiry."""

    def __init__(self, auth: Authenticator, cookie: str | None, every: float) -> None:
        super().__init__(every)
        self.auth = auth
        self.cookie = cookie

    def _watch(self) -> None:
        self.auth._watchers.add(self)

    def _unwatch(self) -> None:
        self.auth._watchers.discard(self)

    async def _ask(self) -> bool:
        return self.auth.is_authenticated(self.cookie)


# -- the gate ---------------------------------------------------------------------------


def _origin_tuple(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None or parts.path or parts.query:
        return None
    return scheme, parts.hostname.lower(), port


def same_origin(scope: Scope, headers: Headers) -> bool:
    """A request without Origin (curl, scripts) passes unless the browser says it is
    cross-site; with one, it must equal this server's scheme://host:port as the Host header
    and the request's scheme give it."""
    origin = headers.get("origin")
    if origin is None:
        return headers.get("sec-fetch-site") not in ("cross-site", "same-site")
    host = headers.get("host")
    scope_scheme = str(scope.get("scheme") or "http")
    scheme = {"ws": "http", "wss": "https"}.get(scope_scheme, scope_scheme)
    if not host or "://" not in origin:
        return False
    origin_scheme, _, origin_netloc = origin.partition("://")
    mine = _origin_tuple(scheme, host)
    theirs = _origin_tuple(origin_scheme.lower(), origin_netloc)
    return mine is not None and mine == theirs


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def safe_next(value: str | None) -> str:
    """A same-origin relative path to go to after login; anything else becomes `/`."""
    if (
        not value
        or not value.startswith("/")
        or value.startswith(("//", "/\\"))
        or any(ord(ch) < 0x20 or ch == "\\" for ch in value)
    ):
        return "/"
    return value


class AuthGate:
    """Pure ASGI middleware (streaming responses pass through untouched): the Origin check on
    state-changing requests, then, when a password is set, the session check. In the user
    modes (`accounts` given) the session check names the person, and the whole request acts
    for them (`log.ownership.VIEWER`); a bearer token needs no Origin."""

    def __init__(self, app: ASGIApp, auth: Authenticator, accounts: AccountAuth | None = None):
        self.app = app
        self.auth = auth
        self.accounts = accounts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method = scope.get("method", "GET")
        path = scope.get("path", "/")
        websocket = scope["type"] == "websocket"
        if self.accounts is not None:
            await self._as_person(scope, receive, send, self.accounts)
            return
        if (websocket or method in STATE_CHANGING) and not same_origin(scope, headers):
            await self._refuse(
                scope, send, BadOrigin("This request came from another site and was refused.")
            )
            return
        if self.auth.password_required and not is_public(path):
            cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE_NAME)
            if not self.auth.is_authenticated(cookie):
                if not websocket and method in ("GET", "HEAD") and not path.startswith("/api/"):
                    await self._redirect(scope, send)
                else:
                    await self._refuse(scope, send, Unauthenticated("Log in first."))
                return
        await self.app(scope, receive, send)

    async def _as_person(
        self, scope: Scope, receive: Receive, send: Send, accounts: AccountAuth
    ) -> None:
        headers = Headers(scope=scope)
        method = scope.get("method", "GET")
        path = scope.get("path", "/")
        websocket = scope["type"] == "websocket"
        bearer = bearer_token(headers.get("authorization")) is not None
        changing = websocket or method in STATE_CHANGING
        if changing and not bearer and not same_origin(scope, headers):
            await self._refuse(
                scope, send, BadOrigin("This request came from another site and was refused.")
            )
            return
        quiet = path.startswith(PUBLIC_PREFIXES) or path == "/api/health"
        principal = None if quiet and not bearer else await accounts.identify(scope, headers)
        if principal is None and not is_public(path):
            page = not websocket and method in ("GET", "HEAD") and not path.startswith("/api/")
            if page:  # the login page signs in, or (trusted-header) says how
                await self._redirect(scope, send)
            else:
                await self._refuse(scope, send, Unauthenticated("Log in first."))
            return
        viewer = VIEWER.set(principal.user.user_id if principal else NOBODY)
        person = PRINCIPAL.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            PRINCIPAL.reset(person)
            VIEWER.reset(viewer)

    async def _refuse(self, scope: Scope, send: Send, refusal: ApiError) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send_refusal(send, refusal)

    async def _redirect(self, scope: Scope, send: Send) -> None:
        target = scope.get("path", "/")
        query = scope.get("query_string", b"").decode("latin-1")
        if query:
            target += "?" + query
        location = "/login" if target == "/" else "/login?next=" + quote(target, safe="")
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode("latin-1")),
                    (b"content-length", b"0"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})
