"""The `log.store.AccountStore` backend on the SQLite file of the log: users and API tokens
(tables of migration m005). Its own connection, opened after `SQLiteEventStore` applied the
migrations; each call runs in a thread, one at a time, and each write is its own
`BEGIN IMMEDIATE` transaction (WAL, synchronous=FULL: durable when it returns)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tether.errors import UserExists
from tether.events import new_id
from tether.log.errors import StorageError
from tether.log.store import ApiToken, User

T = TypeVar("T")

_USER_COLUMNS = "user_id, username, admin, password_hash, epoch, created_at"


def _user(row: tuple) -> User:
    user_id, username, admin, password_hash, epoch, created_at = row
    return User(user_id, username, bool(admin), password_hash, epoch, created_at)


def username_key(username: str) -> str:
    return username.casefold()


class SQLiteAccountStore:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                try:
                    return fn(self._db)
                except sqlite3.DatabaseError as exc:
                    raise StorageError(f"could not use the accounts in {self.path}: {exc}") from exc

        return await asyncio.to_thread(call)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def transaction(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return result

        return await self._run(transaction)

    async def _one(self, sql: str, params: tuple[Any, ...]) -> User | None:
        rows = await self._run(lambda db: db.execute(sql, params).fetchall())
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

        def insert(db: sqlite3.Connection) -> User:
            try:
                db.execute(
                    "INSERT INTO users (user_id, username, username_key, admin, password_hash, "
                    "epoch, created_at, external_id) VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
                    (
                        user.user_id,
                        username,
                        username_key(username),
                        int(admin),
                        password_hash,
                        user.created_at,
                        external_id,
                    ),
                )
            except sqlite3.IntegrityError:
                raise UserExists(f"There is already a user called {username}.") from None
            return user

        return await self._write(insert)

    async def user_by_name(self, username: str) -> User | None:
        return await self._one(
            f"SELECT {_USER_COLUMNS} FROM users WHERE username_key=?", (username_key(username),)
        )

    async def user_by_external_id(self, external_id: str) -> User | None:
        return await self._one(
            f"SELECT {_USER_COLUMNS} FROM users WHERE external_id=?", (external_id,)
        )

    async def user_by_id(self, user_id: str) -> User | None:
        return await self._one(f"SELECT {_USER_COLUMNS} FROM users WHERE user_id=?", (user_id,))

    async def users(self) -> list[User]:
        rows = await self._run(
            lambda db: db.execute(
                f"SELECT {_USER_COLUMNS} FROM users ORDER BY created_at, rowid"
            ).fetchall()
        )
        return [_user(row) for row in rows]

    async def remove_user(self, username: str) -> User | None:
        def remove(db: sqlite3.Connection) -> User | None:
            rows = db.execute(
                f"SELECT {_USER_COLUMNS} FROM users WHERE username_key=?",
                (username_key(username),),
            ).fetchall()
            if not rows:
                return None
            user = _user(rows[0])
            db.execute("DELETE FROM api_tokens WHERE user_id=?", (user.user_id,))
            db.execute("DELETE FROM users WHERE user_id=?", (user.user_id,))
            return user

        return await self._write(remove)

    async def set_password(self, user_id: str, password_hash: str) -> None:
        await self._write(
            lambda db: db.execute(
                "UPDATE users SET password_hash=? WHERE user_id=?", (password_hash, user_id)
            )
        )

    async def end_sessions(self, user_id: str) -> None:
        await self._write(
            lambda db: db.execute("UPDATE users SET epoch=epoch+1 WHERE user_id=?", (user_id,))
        )

    # -- tokens -----------------------------------------------------------------------------
    async def add_token(self, user_id: str, name: str, token_hash: str) -> ApiToken:
        token = ApiToken(new_id("tok"), user_id, name, time.time())
        await self._write(
            lambda db: db.execute(
                "INSERT INTO api_tokens VALUES (?, ?, ?, ?, ?)",
                (token.token_id, user_id, name, token_hash, token.created_at),
            )
        )
        return token

    async def tokens(self, user_id: str) -> list[ApiToken]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT token_id, user_id, name, created_at FROM api_tokens WHERE user_id=? "
                "ORDER BY created_at, rowid",
                (user_id,),
            ).fetchall()
        )
        return [ApiToken(*row) for row in rows]

    async def revoke_token(self, user_id: str, token_id: str) -> bool:
        def revoke(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM api_tokens WHERE token_id=? AND user_id=?", (token_id, user_id)
            )
            return cursor.rowcount > 0

        return await self._write(revoke)

    async def token_user(self, token_hash: str) -> tuple[ApiToken, User] | None:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT t.token_id, t.user_id, t.name, t.created_at, "
                + ", ".join(f"u.{c.strip()}" for c in _USER_COLUMNS.split(","))
                + " FROM api_tokens t JOIN users u ON u.user_id=t.user_id WHERE t.token_hash=?",
                (token_hash,),
            ).fetchall()
        )
        if not rows:
            return None
        return ApiToken(*rows[0][:4]), _user(rows[0][4:])

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        with self._lock:
            self._db.close()
