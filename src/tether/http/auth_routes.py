"""Login routes (docs/api.md §8 and §15, docs/security.md): the login page, log in, log out,
status, and a person's own password change under `--auth accounts`. The Origin check and the
session check of every other route live in `auth.AuthGate`."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field, StrictStr

from tether.errors import (
    BadCredentials,
    InvalidRequest,
    NoPassword,
    RateLimited,
    RouteNotFound,
    WrongPassword,
)
from tether.http import oidc
from tether.http.accounts import MAX_PASSWORD, MIN_PASSWORD, PRINCIPAL, AccountAuth
from tether.http.auth import COOKIE_NAME, SESSION_MAX_AGE, Authenticator, safe_next
from tether.http.errors import documented, error_response
from tether.http.pages import PAGE_HEADERS, WEB_ROOT, card_page
from tether.http.schemas import Body
from tether.log.shared import PER_ADDRESS, PER_USER, LoginLimits, Rule

log = logging.getLogger("tether.auth")
router = APIRouter()


class LoginOut(BaseModel):
    ok: bool
    password_required: bool
    username: str | None = None


class LogoutOut(BaseModel):
    ok: bool
    was_logged_in: bool


class AuthStatus(BaseModel):
    authenticated: bool
    password_required: bool
    mode: str
    username: str | None


class LoginRequest(Body):
    username: Annotated[StrictStr | None, Field(max_length=200)] = None
    password: Annotated[StrictStr, Field(min_length=1, max_length=4096)]


class PasswordChange(Body):
    current_password: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PASSWORD)]
    new_password: Annotated[StrictStr, Field(max_length=MAX_PASSWORD)]


class PasswordChanged(BaseModel):
    ok: bool


def _auth(request: Request) -> Authenticator:
    return request.app.state.auth


def _accounts(request: Request) -> AccountAuth | None:
    return request.app.state.accounts


def _cookie_options(request: Request) -> dict:
    return {
        "path": "/",
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
    }


async def _signed_in(request: Request) -> bool:
    if _accounts(request) is not None:
        return PRINCIPAL.get() is not None
    return _auth(request).is_authenticated(request.cookies.get(COOKIE_NAME))


def _limits(request: Request) -> LoginLimits:
    return request.app.state.services.login_limits


async def _limited(limits: LoginLimits, checks: list[tuple[str, Rule]]) -> Response | None:
    """None: the attempt is counted, go on; else the 429 to answer (nothing counted)."""
    wait = await limits.attempt(checks)
    if not wait:
        return None
    response = error_response(
        RateLimited(f"Too many failed attempts; try again in {wait} s.", retry_after=wait)
    )
    response.headers["Retry-After"] = str(wait)
    return response


@router.get("/login", include_in_schema=False)
async def login_page(request: Request, next: str | None = None) -> Response:
    auth, accounts = _auth(request), _accounts(request)
    open_door = accounts is None and not auth.password_required
    if open_door or await _signed_in(request):
        return RedirectResponse(
            safe_next(next), status_code=303, headers={"Cache-Control": "no-store"}
        )
    if accounts is not None and accounts.mode == "oidc":  # the provider's sign-in page
        if request.cookies.get(oidc.SIGNED_OUT_COOKIE):  # not straight back in: a button
            return oidc.signed_out_page(safe_next(next))
        return RedirectResponse(
            "/api/auth/oidc/login?" + urlencode({"next": safe_next(next)}),
            status_code=303,
            headers={"Cache-Control": "no-store"},
        )
    if accounts is not None and accounts.mode == "trusted-header":  # no form can sign in
        words = (
            "Tether signs people in through the proxy in front of it, which names them; this "
            "request did not come through it. Open Tether at the address your proxy serves."
        )
        return card_page("Not signed in", words, "/", "Try again", 401)
    return HTMLResponse((WEB_ROOT / "login.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@router.post(
    "/api/auth/login",
    summary="Log in",
    response_model=None,
    responses=documented(400, 401, 429, ok=LoginOut),
)
async def login(request: Request, body: LoginRequest) -> Response:
    auth, accounts = _auth(request), _accounts(request)
    if accounts is not None:
        return await _account_login(request, body, accounts, _limits(request))
    if not auth.password_required:
        return JSONResponse({"ok": True, "password_required": False})
    client = request.client.host if request.client else "unknown"
    limits = _limits(request)
    # Counted before the (slow) check, so guesses sent in parallel are limited too.
    refused = await _limited(limits, [(client, PER_ADDRESS)])
    if refused is not None:
        return refused
    if not await auth.verify_password(body.password):
        log.warning("failed login from %s", client)
        raise BadCredentials("That password is not right.")
    await limits.reset([client])
    log.info("login from %s", client)
    response = JSONResponse(
        {"ok": True, "password_required": True}, headers={"Cache-Control": "no-store"}
    )
    response.set_cookie(
        COOKIE_NAME, auth.new_session_cookie(), max_age=SESSION_MAX_AGE, **_cookie_options(request)
    )
    return response


async def _account_login(
    request: Request, body: LoginRequest, accounts: AccountAuth, limits: LoginLimits
) -> Response:
    """A user name and password (`--auth accounts`): failures are limited per address and,
    so that many addresses cannot share the guessing of one password, per user name."""
    if accounts.mode != "accounts":
        raise InvalidRequest(
            "This server signs people in through its proxy or provider, not a password."
        )
    if not body.username or not body.username.strip():
        raise InvalidRequest("Send your user name with the password.")
    client = request.client.host if request.client else "unknown"
    name_key = "user:" + body.username.strip().casefold()
    refused = await _limited(limits, [(client, PER_ADDRESS), (name_key, PER_USER)])
    if refused is not None:
        return refused
    user = await accounts.verify(body.username.strip(), body.password)
    if user is None:
        log.warning("failed login for %r from %s", body.username[:64], client)
        raise BadCredentials("That user name and password do not match.")
    # The name's failures go; of the address's, only this attempt's: a sign-in to one's own
    # account must not wipe out the address's guesses at other names.
    await limits.reset([name_key])
    await limits.forgive(client)
    log.info("login of %s from %s", user.username, client)
    response = JSONResponse(
        {"ok": True, "password_required": True, "username": user.username},
        headers={"Cache-Control": "no-store"},
    )
    response.set_cookie(
        COOKIE_NAME, accounts.cookie_for(user), max_age=SESSION_MAX_AGE, **_cookie_options(request)
    )
    return response


@router.post(
    "/api/auth/logout", summary="Log out", response_model=None, responses=documented(ok=LogoutOut)
)
async def logout(request: Request) -> Response:
    accounts = _accounts(request)
    if accounts is not None:
        principal = PRINCIPAL.get()
        revoked = principal is not None and principal.via == "cookie"
        if principal is not None and revoked:  # every session of this person, everywhere
            await accounts.store.end_sessions(principal.user.user_id)
            accounts.credentials_changed(principal.user.user_id)
    else:
        revoked = await _auth(request).revoke(request.cookies.get(COOKIE_NAME))
    response = JSONResponse(
        {"ok": True, "was_logged_in": revoked}, headers={"Cache-Control": "no-store"}
    )
    response.delete_cookie(COOKIE_NAME, **_cookie_options(request))
    if accounts is not None and accounts.mode == "oidc":
        oidc.mark_signed_out(response, secure=request.url.scheme == "https")
    return response


@router.get(
    "/api/auth/status",
    summary="Whether this client is logged in",
    response_model=None,
    responses=documented(ok=AuthStatus),
)
async def status(request: Request) -> JSONResponse:
    auth, accounts = _auth(request), _accounts(request)
    principal = PRINCIPAL.get()
    return JSONResponse(
        {
            "authenticated": await _signed_in(request),
            "password_required": auth.password_required if accounts is None else True,
            "mode": accounts.mode if accounts is not None else "password",
            "username": principal.user.username if principal else None,
        },
        headers={"Cache-Control": "no-store"},
    )


@router.post(
    "/api/me/password",
    summary="Change my password",
    response_model=None,
    responses=documented(400, 403, 404, 409, 429, ok=PasswordChanged),
)
async def change_password(request: Request, body: PasswordChange) -> Response:
    """The signed-in person's own password (`--auth accounts`). The current one is checked
    as a login's is, and a wrong one counts as a failed login (the same limits): a stolen
    cookie or token cannot be used to guess it, nor to lock its owner out. Every other
    sign-in of theirs ends, as after `tether users password`; this one gets a new cookie.
    Their API tokens stay: each is a credential of its own, revoked one by one."""
    accounts, principal = _accounts(request), PRINCIPAL.get()
    if accounts is None or principal is None:
        raise RouteNotFound("There is no such route (accounts are off).")
    user = principal.user
    if accounts.mode != "accounts" or user.password_hash is None:
        raise NoPassword(
            "You sign in through this server's proxy or identity provider: there is no "
            "password here to change."
        )
    if len(body.new_password) < MIN_PASSWORD:
        raise InvalidRequest(f"A new password has at least {MIN_PASSWORD} characters.")
    if body.new_password == body.current_password:
        raise InvalidRequest("The new password is the current one; choose another.")
    client = request.client.host if request.client else "unknown"
    name_key = "user:" + user.username.casefold()
    limits = _limits(request)
    refused = await _limited(limits, [(client, PER_ADDRESS), (name_key, PER_USER)])
    if refused is not None:
        return refused
    if await accounts.verify(user.username, body.current_password) is None:
        log.warning("failed password change of %s from %s", user.username, client)
        raise WrongPassword("That is not your current password.")
    await limits.reset([name_key])
    await limits.forgive(client)  # as a sign-in does
    password_hash = await asyncio.to_thread(accounts.hasher.hash, body.new_password)
    await accounts.store.set_password(user.user_id, password_hash)
    await accounts.store.end_sessions(user.user_id)
    accounts.credentials_changed(user.user_id)
    log.info("password change of %s from %s", user.username, client)
    response = JSONResponse({"ok": True}, headers={"Cache-Control": "no-store"})
    renewed = await accounts.store.user_by_id(user.user_id)
    if principal.via == "cookie" and renewed is not None:
        response.set_cookie(
            COOKIE_NAME,
            accounts.cookie_for(renewed),
            max_age=SESSION_MAX_AGE,
            **_cookie_options(request),
        )
    return response
