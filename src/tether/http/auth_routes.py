"""Login routes (docs/api.md §8, docs/security.md): the login page, log in, log out, and status.
The Origin check and the session check of every other route live in `auth.AuthGate`."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import Field, StrictStr

from tether.errors import BadCredentials, RateLimited
from tether.http.auth import COOKIE_NAME, SESSION_MAX_AGE, Authenticator, safe_next
from tether.http.errors import error_response
from tether.http.pages import PAGE_HEADERS, WEB_ROOT
from tether.http.schemas import Body

log = logging.getLogger("tether.auth")
router = APIRouter()


class LoginRequest(Body):
    password: Annotated[StrictStr, Field(min_length=1, max_length=4096)]


def _auth(request: Request) -> Authenticator:
    return request.app.state.auth


def _cookie_options(request: Request) -> dict:
    return {
        "path": "/",
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
    }


@router.get("/login", include_in_schema=False)
async def login_page(request: Request, next: str | None = None) -> Response:
    auth = _auth(request)
    if not auth.password_required or auth.is_authenticated(request.cookies.get(COOKIE_NAME)):
        return RedirectResponse(
            safe_next(next), status_code=303, headers={"Cache-Control": "no-store"}
        )
    return HTMLResponse((WEB_ROOT / "login.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@router.post("/api/auth/login")
async def login(request: Request, body: LoginRequest) -> Response:
    auth = _auth(request)
    if not auth.password_required:
        return JSONResponse({"ok": True, "password_required": False})
    client = request.client.host if request.client else "unknown"
    wait = auth.limiter.retry_after(client)
    if wait:
        response = error_response(
            RateLimited(f"Too many failed attempts; try again in {wait} s.", retry_after=wait)
        )
        response.headers["Retry-After"] = str(wait)
        return response
    # Counted before the (slow) check, so guesses sent in parallel are limited too.
    auth.limiter.record_failure(client)
    if not await auth.verify_password(body.password):
        log.warning("failed login from %s", client)
        raise BadCredentials("That password is not right.")
    auth.limiter.reset(client)
    log.info("login from %s", client)
    response = JSONResponse(
        {"ok": True, "password_required": True}, headers={"Cache-Control": "no-store"}
    )
    response.set_cookie(
        COOKIE_NAME, auth.new_session_cookie(), max_age=SESSION_MAX_AGE, **_cookie_options(request)
    )
    return response


@router.post("/api/auth/logout")
async def logout(request: Request) -> Response:
    auth = _auth(request)
    revoked = await auth.revoke(request.cookies.get(COOKIE_NAME))
    response = JSONResponse(
        {"ok": True, "was_logged_in": revoked}, headers={"Cache-Control": "no-store"}
    )
    response.delete_cookie(COOKIE_NAME, **_cookie_options(request))
    return response


@router.get("/api/auth/status")
async def status(request: Request) -> JSONResponse:
    auth = _auth(request)
    return JSONResponse(
        {
            "authenticated": auth.is_authenticated(request.cookies.get(COOKIE_NAME)),
            "password_required": auth.password_required,
        },
        headers={"Cache-Control": "no-store"},
    )
