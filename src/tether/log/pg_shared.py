"""The shared state of log/shared.py in the PostgreSQL database of the log (migration m008,
log/pg_schema.py), so replicas that share nothing but the database agree: the cookie secret,
the login failures (on the database's clock) and the settings panel's defaults. One small
connection pool (`LazyPool`) serves these and the attachment bytes (log/pg_blobs.py)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tether.log.errors import StorageError
from tether.log.pg_rows import redact
from tether.log.pg_schema import apply_migrations
from tether.log.shared import Rule, new_secret

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"


def shared_secret(url: str, name: str = "cookie") -> str:
    """The secret called `name`, made by whichever replica asks first: each offers one, the
    first insert wins (ON CONFLICT DO NOTHING) and every replica reads back the same."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as db:
            apply_migrations(db, f"at {redact(url)}")
            db.execute(
                "INSERT INTO server_secrets (name, value) VALUES (%s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                (name, new_secret()),
            )
            row = db.execute("SELECT value FROM server_secrets WHERE name=%s", (name,)).fetchone()
    except psycopg.Error as exc:
        raise StorageError(
            f"Cannot read the cookie secret in the database at {redact(url)}: {exc}".strip()
        ) from exc
    assert row is not None  # inserted or already there, in autocommit: visible now
    return str(row[0])


class LazyPool:
    """An autocommit connection pool opened on first use, inside the event loop."""

    def __init__(self, url: str, size: int = 4) -> None:
        self._pool = AsyncConnectionPool(
            url, min_size=1, max_size=size, open=False, timeout=10, kwargs={"autocommit": True}
        )
        self._opened = False
        self._lock: asyncio.Lock | None = None

    async def get(self) -> AsyncConnectionPool:
        if not self._opened:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if not self._opened:
                    await self._pool.open(wait=False)
                    self._opened = True
        return self._pool

    async def rows(self, sql: str, params: Sequence[Any], what: str) -> list[tuple]:
        """One autocommit statement; StorageError (503) when the database fails."""
        pool = await self.get()
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params)
                return await cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise StorageError(f"could not use {what} in the PostgreSQL database: {exc}") from exc

    async def aclose(self) -> None:
        if self._opened:
            self._opened = False
            await self._pool.close()


def _clean(key: str) -> str:
    """A key without NUL (a user name may hold one; a PostgreSQL text cannot)."""
    return key.replace("\x00", "")


class PostgresLoginLimits:
    """Failures as rows (key, expiry), for every replica at once. `attempt` is one
    transaction holding an advisory lock per key, so parallel guesses through several
    replicas are counted one after the other, never all admitted under the limit."""

    def __init__(self, pool: LazyPool) -> None:
        self.pool = pool

    async def attempt(self, checks: Sequence[tuple[str, Rule]]) -> int:
        checks = [(_clean(key), rule) for key, rule in checks]
        pool = await self.pool.get()
        try:
            async with pool.connection() as conn, conn.transaction():
                for key in sorted({key for key, _ in checks}):  # one order: no deadlock
                    await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
                now = (await (await conn.execute(f"SELECT {_NOW}")).fetchone() or (0.0,))[0]
                await conn.execute("DELETE FROM login_failures WHERE expires_at <= %s", (now,))
                wait = 0
                for key, rule in checks:
                    cur = await conn.execute(
                        "SELECT count(*), min(expires_at) FROM login_failures WHERE key=%s",
                        (key,),
                    )
                    count, first = await cur.fetchone() or (0, None)
                    if count >= rule.max_failures and first is not None:
                        wait = max(wait, max(1, math.ceil(first - now)))
                if wait:
                    return wait
                for key, rule in checks:
                    await conn.execute(
                        "INSERT INTO login_failures (key, expires_at) VALUES (%s, %s)",
                        (key, now + rule.window),
                    )
                return 0
        except psycopg.Error as exc:
            raise StorageError(
                f"could not count login failures in the PostgreSQL database: {exc}"
            ) from exc

    async def reset(self, keys: Sequence[str]) -> None:
        await self.pool.rows(
            "DELETE FROM login_failures WHERE key = ANY(%s)",
            ([_clean(key) for key in keys],),
            "the login failures",
        )

    async def forgive(self, key: str) -> None:
        await self.pool.rows(
            "DELETE FROM login_failures WHERE ctid IN (SELECT ctid FROM login_failures "
            "WHERE key=%s ORDER BY expires_at DESC LIMIT 1)",
            (_clean(key),),
            "the login failures",
        )

    async def aclose(self) -> None:
        await self.pool.aclose()


class PostgresSettings:
    """One row per saved key (its value as JSON text): a change through any replica is what
    every replica reads next (each read asks the database; it is one small row set)."""

    def __init__(self, pool: LazyPool) -> None:
        self.pool = pool

    async def load(self) -> dict[str, str]:
        rows = await self.pool.rows("SELECT key, value FROM server_settings", (), "the settings")
        return {str(key): json.loads(value) for key, value in rows}

    async def save(self, changes: dict[str, str | None]) -> None:
        pool = await self.pool.get()
        try:
            async with pool.connection() as conn, conn.transaction():
                for key, value in changes.items():
                    if value is None:
                        await conn.execute("DELETE FROM server_settings WHERE key=%s", (key,))
                    else:
                        await conn.execute(
                            "INSERT INTO server_settings (key, value) VALUES (%s, %s) "
                            "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                            (key, json.dumps(value)),  # JSON text: a NUL fits
                        )
        except psycopg.Error as exc:
            raise StorageError(
                f"could not save the settings in the PostgreSQL database: {exc}"
            ) from exc

    async def aclose(self) -> None:
        await self.pool.aclose()
