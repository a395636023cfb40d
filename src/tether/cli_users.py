"""What `tether users add|list|password|remove` does, on the data directory of a server that may be
stopped (docs/api.md §15): it opens the log (which applies the migrations) and its account
store, like the server does, and closes them again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from argon2 import PasswordHasher

from tether.errors import UserExists
from tether.http.accounts import MAX_PASSWORD, MIN_PASSWORD, valid_username
from tether.log.ownership import OwnedStore
from tether.log.store import AccountStore, User
from tether.services import open_accounts, open_store
from tether.settings import Settings

T = TypeVar("T")


class Refused(Exception):
    """The command was refused; the message says why. Nothing changed."""


def check_password(password: str) -> str:
    """The rules of `POST /api/users` and of a person's own change: a longer password could
    never be sent to `POST /api/auth/login`, which takes 4096 characters at most."""
    if len(password) < MIN_PASSWORD:
        raise Refused(f"A password has at least {MIN_PASSWORD} characters.")
    if len(password) > MAX_PASSWORD:
        raise Refused(f"A password has at most {MAX_PASSWORD} characters.")
    return password


def _hashed(password: str) -> str:
    return PasswordHasher().hash(check_password(password))


def _existing(settings: Settings) -> Settings:
    """The settings of a server that has run: opening the log would make a new, empty one in a
    misspelt --data-dir (only `add` may, for the first admin of a new server)."""
    if not settings.database_url and not settings.database_path.exists():
        raise Refused(
            f"There is no Tether data in {settings.data_dir}: give the --data-dir of the server "
            "(`tether users add` makes a new one)."
        )
    return settings


async def _with_stores(
    settings: Settings, work: Callable[[OwnedStore, AccountStore], Awaitable[T]]
) -> T:
    store = OwnedStore(open_store(settings))
    accounts = open_accounts(settings)
    try:
        return await work(store, accounts)
    finally:
        await accounts.aclose()
        await store.aclose()


def check_name(name: str) -> str:
    """The name `add` would give the user, checked before a password is asked for."""
    name = name.strip()
    if not valid_username(name):
        raise Refused(
            "A user name is 1-64 letters, digits and ._@+-, starting with a letter or digit."
        )
    return name


def _not_a_replica_dir(settings: Settings) -> None:
    """A PostgreSQL replica's data directory holds its attachments' copies and no tether.db:
    a user added there without --database-url went into a new SQLite file no server reads."""
    if settings.database_url or settings.database_path.exists():
        return
    if (settings.data_dir / "attachments").is_dir():
        raise Refused(
            f"{settings.data_dir} is the data directory of a server on PostgreSQL (it holds "
            "attachments and no tether.db): its users are in the database. Give the server's "
            "--database-url (or TETHER_DATABASE_URL)."
        )


def add_user(settings: Settings, name: str, ask: Callable[[], str], admin: bool) -> int:
    """Add the user, asking for the password once the name is known to be free; the number of
    unowned sessions the first admin now owns."""
    name = check_name(name)
    _not_a_replica_dir(settings)

    async def work(store: OwnedStore, accounts: AccountStore) -> int:
        if await accounts.user_by_name(name) is not None:
            raise Refused(f"There is already a user called {name}.")
        password_hash = _hashed(ask())
        first_admin = admin and not any(u.admin for u in await accounts.users())
        try:
            user = await accounts.add_user(name, password_hash, admin)
        except UserExists as exc:
            raise Refused(exc.message) from None
        return await store.claim_unowned(user.user_id) if first_admin else 0

    return asyncio.run(_with_stores(settings, work))


def list_users(settings: Settings) -> list[User]:
    return asyncio.run(_with_stores(_existing(settings), lambda _, accounts: accounts.users()))


def remove_user(settings: Settings, name: str) -> None:
    async def work(_: OwnedStore, accounts: AccountStore) -> None:
        if await accounts.remove_user(name) is None:
            raise Refused(f"There is no user {name}.")

    asyncio.run(_with_stores(_existing(settings), work))


def set_password(settings: Settings, name: str, ask: Callable[[], str]) -> None:
    """Give the user a new password (asked for once the user is found) and end every sign-in
    made before (their cookies fail on every replica at their next request); their sessions
    stay theirs. Their API tokens stay too: each is a credential of its own, revoked one by
    one."""

    async def work(_: OwnedStore, accounts: AccountStore) -> None:
        user = await accounts.user_by_name(name)
        if user is None:
            raise Refused(f"There is no user {name}.")
        await accounts.set_password(user.user_id, _hashed(ask()))
        await accounts.end_sessions(user.user_id)

    asyncio.run(_with_stores(_existing(settings), work))
