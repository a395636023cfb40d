"""Who a request acts for in the user modes (docs/api.md §15, docs/security.md):
`--auth accounts` (a user name and password, then a session cookie), `--auth trusted-header`
(a reverse proxy that authenticated the person names them in a header), and, in both, personal
API tokens (`Authorization: Bearer`).

- The cookie is itsdangerous-signed (the secret in `<data_dir>/secret_key`, or with
  PostgreSQL in the database, so every replica accepts it: `services.open_secret`) and
  carries the user id and the user's logout epoch: a logout grows the epoch in the account
  store, so every cookie of that person fails on every replica.
- A token is 256 random bits; only its SHA-256 is stored. It needs no Origin check: a page of
  another site cannot make a browser send an `Authorization` header here without CORS.
- The trusted header is read only when the peer that sent the request (before any
  X-Forwarded-For rewrite) is in `--trusted-proxy`; a named user is created at first sight.
- Open event streams re-check their credential at every heartbeat, and at once when a logout,
  a token's revocation or the user's removal happens in this process (`watch`).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from itsdangerous import BadData, URLSafeTimedSerializer
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.errors import UserExists
from tether.log.store import AccountStore, User
from tether.settings import Settings

log = logging.getLogger("tether.auth")

COOKIE_NAME = "tether_session"
SESSION_MAX_AGE = 30 * 24 * 3600
USER_MODES = frozenset({"accounts", "trusted-header", "oidc"})
TOKEN_PREFIX = "tth_"
PEER_KEY = "tether.peer"
USERNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$"
_USERNAME = re.compile(USERNAME_PATTERN)
# A password's rules, the same for `tether users add|password`, `POST /api/users` and a
# person's own change: long enough that a guess is not cheap, short enough for argon2.
MIN_PASSWORD = 8
MAX_PASSWORD = 4096


def valid_username(name: str) -> bool:
    """1-64 letters, digits and `._@+-`, starting with a letter or digit (an e-mail
    address from a proxy fits)."""
    return bool(_USERNAME.fullmatch(name))


@dataclass(frozen=True, slots=True)
class Principal:
    """The person a request acts for, and how they proved it."""

    user: User
    via: str  # "cookie" | "token" | "header"
    token_hash: str | None = None


PRINCIPAL: ContextVar[Principal | None] = ContextVar("tether_principal", default=None)


def bearer_token(authorization: str | None) -> str | None:
    """The Tether token an `Authorization` header carries (`Bearer tth_...`), else None.
    Any other credential (a proxy's Basic, an identity provider's bearer JWT passed along by
    oauth2-proxy) is not Tether's and is ignored, never mistaken for a wrong token."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
        return None
    return token


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class RecordPeer:
    """The outermost middleware in trusted-header mode: remembers the address that really
    sent the request before ProxyHeadersMiddleware replaces it with X-Forwarded-For's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            scope[PEER_KEY] = client[0] if client else None
        await self.app(scope, receive, send)


class AccountAuth:
    """Identifies the person behind a request in the user modes. The account store is given
    when the services start (`attach`)."""

    def __init__(self, settings: Settings, secret: str) -> None:
        self.mode = settings.auth
        # An OIDC sign-in is the provider's word at that moment (a group it may take back):
        # it lasts hours, and the next one asks the provider again.
        self.max_age = (
            round(settings.oidc_session_hours * 3600) if self.mode == "oidc" else SESSION_MAX_AGE
        )
        self.header = settings.trusted_header.lower()
        self.proxies = [ipaddress.ip_network(p, strict=False) for p in settings.trusted_proxies]
        self.hasher = PasswordHasher()
        self.verify_slots = asyncio.Semaphore(2)  # argon2 takes 64 MiB per check
        self._dummy_hash = self.hasher.hash(secrets.token_urlsafe(16))
        self.flow_secret = hashlib.sha256(b"tether-oidc-flow:" + secret.encode()).hexdigest()
        self._serializer = URLSafeTimedSerializer(
            secret,
            salt="tether-account-session",
            signer_kwargs={"digest_method": hashlib.sha256},
        )
        self._store: AccountStore | None = None
        self._watchers: dict[str, set[StreamGuard]] = {}

    def attach(self, store: AccountStore | None) -> None:
        self._store = store

    @property
    def store(self) -> AccountStore:
        if self._store is None:
            raise RuntimeError("the account store is not open yet")
        return self._store

    # -- passwords --------------------------------------------------------------------------
    def _check(self, encoded: str | None, password: str) -> bool:
        try:
            return self.hasher.verify(encoded or self._dummy_hash, password) and bool(encoded)
        except (VerificationError, InvalidHashError):
            return False

    async def verify(self, username: str, password: str) -> User | None:
        """The user whose password this is; an unknown name costs the same argon2 check."""
        user = await self.store.user_by_name(username)
        async with self.verify_slots:
            ok = await asyncio.to_thread(
                self._check, user.password_hash if user else None, password
            )
        return user if ok else None

    # -- cookies ----------------------------------------------------------------------------
    def cookie_for(self, user: User) -> str:
        return self._serializer.dumps({"u": user.user_id, "e": user.epoch})

    async def from_cookie(self, cookie: str | None) -> Principal | None:
        if not cookie:
            return None
        try:
            payload = self._serializer.loads(cookie, max_age=self.max_age)
        except BadData:
            return None
        if not isinstance(payload, dict) or not isinstance(payload.get("u"), str):
            return None
        user = await self.store.user_by_id(payload["u"])
        if user is None or user.epoch != payload.get("e"):
            return None
        return Principal(user, "cookie")

    # -- the request ------------------------------------------------------------------------
    def _trusted_peer(self, scope: Scope) -> bool:
        peer = scope.get(PEER_KEY)
        try:
            address = ipaddress.ip_address(peer) if peer else None
        except ValueError:
            return False
        return address is not None and any(address in net for net in self.proxies)

    async def identify(self, scope: Scope, headers: Headers) -> Principal | None:
        """The principal of this request, or None (401). A request carrying a Tether token
        is that token's or nobody's: it never falls back to a cookie."""
        token = bearer_token(headers.get("authorization"))
        if token is not None:
            token_hash = hash_token(token)
            found = await self.store.token_user(token_hash)
            return Principal(found[1], "token", token_hash) if found else None
        if self.mode == "trusted-header":
            name = headers.get(self.header)
            if name is None or not self._trusted_peer(scope):
                return None
            return await self._header_user(name.strip())
        cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE_NAME)
        return await self.from_cookie(cookie)

    async def _header_user(self, name: str) -> Principal | None:
        if not valid_username(name):
            return None
        user = await self.store.user_by_name(name)
        if user is None:
            try:
                user = await self.store.add_user(name, None, admin=False)
                log.info("created user %s at their first request through the proxy", name)
            except UserExists:  # created meanwhile by a parallel request
                user = await self.store.user_by_name(name)
        return Principal(user, "header") if user is not None else None

    async def still_valid(self, principal: Principal) -> bool:
        """Whether the credential of an open stream still holds (a logout, a revocation or
        the user's removal ends it)."""
        if principal.via == "token":
            assert principal.token_hash is not None
            return await self.store.token_user(principal.token_hash) is not None
        user = await self.store.user_by_id(principal.user.user_id)
        if user is None:
            return False
        return principal.via == "header" or user.epoch == principal.user.epoch

    # -- open streams -----------------------------------------------------------------------
    def guard(self, principal: Principal | None, every: float) -> StreamGuard | None:
        return None if principal is None else StreamGuard(self, principal, every)

    def credentials_changed(self, user_id: str) -> None:
        """A logout, a revoked token or a removed user: the user's open streams re-check."""
        for guard in list(self._watchers.get(user_id, ())):
            guard.changed()


class Guard:
    """What an open event stream asks before each frame: whether its credential still holds
    (`StreamGuard` in the user modes, `auth.CookieGuard` with the single password). A change
    made here wakes the stream at once (`changed`); the credential is asked again at least
    every `every` seconds (the heartbeat interval), for a change made by another replica or
    an expiry. The clock is the guard's own, not the stream's quiet time: a run streaming
    into it leaves no quiet interval, and a logout through another replica must end it too."""

    def __init__(self, every: float) -> None:
        self._wakeups: list[asyncio.Event] = []
        self._dirty = False
        self._every = every
        self._next_ask = time.monotonic() + every

    @contextmanager
    def watching(self, *wakeups: asyncio.Event) -> Iterator[None]:
        self._wakeups = list(wakeups)
        self._watch()
        try:
            yield
        finally:
            self._unwatch()

    def changed(self) -> None:
        self._dirty = True
        for wakeup in self._wakeups:
            wakeup.set()

    async def holds(self) -> bool:
        """Whether the stream may go on; asks only when something may have changed."""
        now = time.monotonic()
        if not self._dirty and now < self._next_ask:
            return True
        self._dirty = False
        self._next_ask = now + self._every
        return await self._ask()

    def _watch(self) -> None:
        raise NotImplementedError

    def _unwatch(self) -> None:
        raise NotImplementedError

    async def _ask(self) -> bool:
        raise NotImplementedError


class StreamGuard(Guard):
    """A user mode's stream: its person's logout, revoked token or removal ends it."""

    def __init__(self, accounts: AccountAuth, principal: Principal, every: float) -> None:
        super().__init__(every)
        self.accounts = accounts
        self.principal = principal

    def _watch(self) -> None:
        self.accounts._watchers.setdefault(self.principal.user.user_id, set()).add(self)

    def _unwatch(self) -> None:
        watchers = self.accounts._watchers.get(self.principal.user.user_id, set())
        watchers.discard(self)
        if not watchers:
            self.accounts._watchers.pop(self.principal.user.user_id, None)

    async def _ask(self) -> bool:
        return await self.accounts.still_valid(self.principal)
