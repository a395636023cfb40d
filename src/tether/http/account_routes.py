"""Accounts: docs/api.md §15. Who I am, the users (admins only) and personal API tokens.
These routes exist in the user modes only (`--auth accounts`, `--auth trusted-header`); in
the single-password and open modes they answer 404 `not_found`."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field, StrictBool, StrictStr

from tether.errors import Forbidden, InvalidRequest, RouteNotFound, TokenNotFound, UserNotFound
from tether.events import ID_PATTERN
from tether.http.accounts import (
    MAX_PASSWORD,
    MIN_PASSWORD,
    PRINCIPAL,
    USERNAME_PATTERN,
    AccountAuth,
    Principal,
    hash_token,
    new_token,
    valid_username,
)
from tether.http.errors import documented
from tether.http.schemas import Body
from tether.log.store import User

router = APIRouter(tags=["accounts"])


class Me(BaseModel):
    username: str
    admin: bool


class UserOut(Me):
    created_at: float


class UserList(BaseModel):
    users: list[UserOut]


class UserCreated(BaseModel):
    user: UserOut


class NewUser(Body):
    username: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    password: Annotated[StrictStr, Field(min_length=MIN_PASSWORD, max_length=MAX_PASSWORD)]
    admin: StrictBool = False


class NewToken(Body):
    name: Annotated[StrictStr, Field(min_length=1, max_length=100)]


class TokenOut(BaseModel):
    token_id: str
    name: str
    created_at: float


class TokenCreated(BaseModel):
    token_id: str
    name: str
    token: str


class TokenList(BaseModel):
    tokens: list[TokenOut]


class Ok(BaseModel):
    ok: bool


def _me(request: Request) -> tuple[AccountAuth, Principal]:
    accounts: AccountAuth | None = request.app.state.accounts
    principal = PRINCIPAL.get()
    if accounts is None or principal is None:
        raise RouteNotFound("There is no such route (accounts are off).")
    return accounts, principal


def _admin(request: Request) -> AccountAuth:
    accounts, principal = _me(request)
    if not principal.user.admin:
        raise Forbidden("Only an admin manages users.")
    return accounts


def _user_out(user: User) -> dict:
    return {"username": user.username, "admin": user.admin, "created_at": user.created_at}


@router.get("/api/me", summary="Who I am", response_model=None, responses=documented(404, ok=Me))
async def me(request: Request) -> dict:
    """The person this request acts for (its cookie, token or trusted header)."""
    _, principal = _me(request)
    return {"username": principal.user.username, "admin": principal.user.admin}


@router.get(
    "/api/users",
    summary="List users (admins)",
    response_model=None,
    responses=documented(403, 404, ok=UserList),
)
async def list_users(request: Request) -> dict:
    """Every user, oldest first."""
    accounts = _admin(request)
    return {"users": [_user_out(u) for u in await accounts.store.users()]}


@router.post(
    "/api/users",
    status_code=201,
    summary="Add a user (admins)",
    response_model=None,
    responses=documented(400, 403, 404, 409, ok=UserCreated, status=201),
)
async def add_user(request: Request, body: NewUser) -> dict:
    """A user who signs in with this password (at least 8 characters); 409 `user_exists`
    when the name is taken, ignoring case."""
    accounts = _admin(request)
    name = body.username.strip()
    if not valid_username(name):
        raise InvalidRequest(
            "A user name is 1-64 letters, digits and ._@+-, starting with a letter or digit."
        )
    password_hash = await asyncio.to_thread(accounts.hasher.hash, body.password)
    user = await accounts.store.add_user(name, password_hash, body.admin)
    return {"user": _user_out(user)}


@router.delete(
    "/api/users/{username}",
    summary="Remove a user (admins)",
    response_model=None,
    responses=documented(400, 403, 404, ok=Ok),
)
async def remove_user(
    request: Request,
    username: Annotated[str, Path(pattern=USERNAME_PATTERN, description="A user name")],
) -> dict:
    """Their tokens and login sessions end at once, and their runs stop as by Stop (their
    queued messages stay queued); their sessions are kept, shown to nobody else."""
    accounts, principal = _me(request)
    if not principal.user.admin:
        raise Forbidden("Only an admin manages users.")
    if username.casefold() == principal.user.username.casefold():
        raise InvalidRequest("You cannot remove yourself; ask another admin.")
    removed = await accounts.store.remove_user(username)
    if removed is None:
        raise UserNotFound(f"There is no user {username}.")
    accounts.credentials_changed(removed.user_id)
    await request.app.state.services.controls.stop_runs_of(removed.user_id)
    return {"ok": True}


@router.post(
    "/api/tokens",
    status_code=201,
    summary="Create an API token",
    response_model=None,
    responses=documented(400, 404, ok=TokenCreated, status=201),
)
async def create_token(request: Request, body: NewToken) -> dict:
    """The token is in this answer only; the server keeps its hash."""
    accounts, principal = _me(request)
    name = body.name.strip()
    if not name:
        raise InvalidRequest("Give the token a name.")
    token = new_token()
    stored = await accounts.store.add_token(principal.user.user_id, name, hash_token(token))
    return {"token_id": stored.token_id, "name": name, "token": token}


@router.get(
    "/api/tokens",
    summary="List my API tokens",
    response_model=None,
    responses=documented(404, ok=TokenList),
)
async def list_tokens(request: Request) -> dict:
    """The caller's live tokens, never their secret."""
    accounts, principal = _me(request)
    tokens = await accounts.store.tokens(principal.user.user_id)
    return {
        "tokens": [
            {"token_id": t.token_id, "name": t.name, "created_at": t.created_at} for t in tokens
        ]
    }


@router.delete(
    "/api/tokens/{token_id}",
    summary="Revoke an API token",
    response_model=None,
    responses=documented(400, 404, ok=Ok),
)
async def revoke_token(
    request: Request,
    token_id: Annotated[str, Path(pattern=ID_PATTERN, description="A token id")],
) -> dict:
    """It stops working at once, open event streams included."""
    accounts, principal = _me(request)
    if not await accounts.store.revoke_token(principal.user.user_id, token_id):
        raise TokenNotFound("You hold no such token.")
    accounts.credentials_changed(principal.user.user_id)
    return {"ok": True}
