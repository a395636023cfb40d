"""The `log.store.AccountStore` backend on the PostgreSQL database of the log: users and API
tokens (tables of migration m005, log/pg_schema.py), shared by every replica. Its own small
connection pool, opened on first use inside the event loop (open the log first: it applies
the migrations). Each write is one autocommit statement or one explicit transaction, durable
when it returns (`synchronous_commit=on`), and any replica's read after it sees it."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from tether.errors import UserExists
from tether.events import new_id
from tether.log.errors import StorageError
from tether.log.pg_shared import LazyPool
from tether.log.sqlite_accounts import username_key
from tether.log.store import ApiToken, User

_USER_COLUMNS = "user_id, username, admin, password_hash, epoch, created_at"


def _user(row: tuple) -> User:
    user_id, username, admin, password_hash, epoch, created_at = row
    return User(user_id, username, bool(admin), password_hash, epoch, created_at)


def _clean(value: str) -> str:
    """A lookup key without NUL (a PostgreSQL text cannot hold it, so nothing stored has it)."""
    return value.replace("\x00", "")


class PostgresAccountStore:
    def __init__(self, url: str, pool_size: int = 4) -> None:
        self.url = url
        self._pool = LazyPool(url, pool_size)

    async def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple]:
        return await self._pool.rows(sql, params, "the accounts")

    async def _one(self, sql: str, params: tuple[Any, ...]) -> User | None:
        rows = await self._rows(sql, params)
        return _user(rows[0]) if rows else None

    # -- users ------------------------------------------------------------------------------
    async def add_user(
        self,
        username: str,
        password_hash: str | None,
        admin: bool,
        external_id: str | None = None,
    ) -> User:
        user = User(new_id("usr"), username, admin, password_hash, 0, time.time())
        pool = await self._pool.get()
        try:
            async with pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO users (user_id, username, username_key, admin, password_hash, "
                    "epoch, created_at, external_id) VALUES (%s, %s, %s, %s, %s, 0, %s, %s)",
                    (
                        user.user_id,
                        username,
                        username_key(username),
                        admin,
                        password_hash,
                        user.created_at,
                        external_id,
                    ),
                )
        except psycopg.errors.UniqueViolation:
            raise UserExists(f"There is already a user called {username}.") from None
        except psycopg.Error as exc:
            raise StorageError(
                f"could not use the accounts in the PostgreSQL database: {exc}"
            ) from exc
        return user

    async def user_by_name(self, username: str) -> User | None:
        return await self._one(
            f"SELECT {_USER_COLUMNS} FROM users WHERE username_key=%s",
            (_clean(username_key(username)),),
        )

    async def user_by_external_id(self, external_id: str) -> User | None:
        return await self._one(
            f"SELECT {_USER_COLUMNS} FROM users WHERE external_id=%s", (_clean(external_id),)
        )

    async def user_by_id(self, user_id: str) -> User | None:
        return await self._one(
            f"SELECT {_USER_COLUMNS} FROM users WHERE user_id=%s", (_clean(user_id),)
        )

    async def users(self) -> list[User]:
        rows = await self._rows(f"SELECT {_USER_COLUMNS} FROM users ORDER BY created_at, n", ())
        return [_user(row) for row in rows]

    async def remove_user(self, username: str) -> User | None:
        rows = await self._rows(
            "WITH gone AS (DELETE FROM users WHERE username_key=%s "
            f"RETURNING {_USER_COLUMNS}), tokens AS (DELETE FROM api_tokens t USING gone "
            f"WHERE t.user_id = gone.user_id) SELECT {_USER_COLUMNS} FROM gone",
            (_clean(username_key(username)),),
        )
        return _user(rows[0]) if rows else None

    async def set_password(self, user_id: str, password_hash: str) -> None:
        await self._rows(
            "UPDATE users SET password_hash=%s WHERE user_id=%s", (password_hash, _clean(user_id))
        )

    async def end_sessions(self, user_id: str) -> None:
        await self._rows("UPDATE users SET epoch=epoch+1 WHERE user_id=%s", (_clean(user_id),))

    # -- tokens -----------------------------------------------------------------------------
    async def add_token(self, user_id: str, name: str, token_hash: str) -> ApiToken:
        token = ApiToken(new_id("tok"), user_id, name, time.time())
        await self._rows(
            "INSERT INTO api_tokens (token_id, user_id, name, token_hash, created_at) "
            "VALUES (%s, %s, %s, %s, %s)",
            (token.token_id, user_id, name, token_hash, token.created_at),
        )
        return token

    async def tokens(self, user_id: str) -> list[ApiToken]:
        rows = await self._rows(
            "SELECT token_id, user_id, name, created_at FROM api_tokens WHERE user_id=%s "
            "ORDER BY created_at, n",
            (_clean(user_id),),
        )
        return [ApiToken(*row) for row in rows]

    async def revoke_token(self, user_id: str, token_id: str) -> bool:
        rows = await self._rows(
            "DELETE FROM api_tokens WHERE token_id=%s AND user_id=%s RETURNING token_id",
            (_clean(token_id), _clean(user_id)),
        )
        return bool(rows)

    async def token_user(self, token_hash: str) -> tuple[ApiToken, User] | None:
        rows = await self._rows(
            "SELECT t.token_id, t.user_id, t.name, t.created_at, "
            + ", ".join(f"u.{c.strip()}" for c in _USER_COLUMNS.split(","))
            + " FROM api_tokens t JOIN users u ON u.user_id=t.user_id WHERE t.token_hash=%s",
            (_clean(token_hash),),
        )
        if not rows:
            return None
        return ApiToken(*rows[0][:4]), _user(rows[0][4:])

    async def aclose(self) -> None:
        await self._pool.aclose()
