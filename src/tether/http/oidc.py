"""Sign-in through an OpenID Connect provider (`--auth oidc`, docs/api.md §15,
docs/security.md "Accounts"), with Authlib's Starlette client doing all of the protocol:
issuer discovery (`/.well-known/openid-configuration`), the authorization code flow with PKCE
(S256), the `state` check (kept in a signed, short-lived cookie of its own), and the ID
token's signature (the provider's JWKS), issuer, audience, expiry and `nonce`. Tether only
decides who the verified person is: their user name claim, created at first sign-in, and,
with `--oidc-allowed-group`, whether their `groups` claim names one of those groups.
"""

from __future__ import annotations

import contextlib
import copy
import html
import importlib
import logging
import os
from typing import Any
from urllib.parse import urlencode

import httpx
from authlib.integrations.starlette_client import OAuth, OAuthError
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from joserfc.errors import JoseError
from starlette.exceptions import HTTPException
from starlette.middleware.sessions import SessionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.errors import (
    ApiError,
    BadCredentials,
    Forbidden,
    RouteNotFound,
    SignInUnavailable,
    UserExists,
)
from tether.http.accounts import COOKIE_NAME, SESSION_MAX_AGE, AccountAuth, valid_username
from tether.http.auth import safe_next
from tether.http.head import asked_with_head
from tether.http.pages import PAGE_HEADERS, card_page
from tether.settings import Settings

log = logging.getLogger("tether.auth")
router = APIRouter()

STATE_COOKIE = "tether_oidc"  # the flow's state, nonce and PKCE verifier, for 10 minutes
# Set by a logout, until the next sign-in: `GET /login` then offers a button rather than going
# to the provider, which would sign the person straight back in (it keeps its own sign-in).
SIGNED_OUT_COOKIE = "tether_signed_out"
SIGNED_OUT_PATH = "/login"
LOGIN_PATH = "/api/auth/oidc/login"
CALLBACK_PATH = "/api/auth/oidc/callback"
USERNAME_CLAIMS = ("preferred_username", "email", "sub")


def _http_errors() -> tuple[type[Exception], ...]:
    """What the HTTP client Authlib talks to the provider with raises when the provider cannot
    be reached, does not answer in time (its 5 s timeout) or answers an error status: httpx's
    family, and httpx2's, which Authlib uses instead when it is installed."""
    errors: list[type[Exception]] = [httpx.HTTPError]
    with contextlib.suppress(ImportError):
        errors.append(importlib.import_module("httpx2").HTTPError)
    return tuple(errors)


HTTP_ERRORS = _http_errors()
# ... and its discovery document may be no JSON at all (a proxy's error page)
DISCOVERY_ERRORS: tuple[type[Exception], ...] = (*HTTP_ERRORS, ValueError)


def _unavailable(exc: Exception) -> SignInUnavailable:
    log.warning("the OIDC provider could not be used: %r", exc)
    return SignInUnavailable(
        "The identity provider could not be reached or answered with an error; try again "
        "in a moment."
    )


class FlowState:
    """Starlette's SessionMiddleware keeping the sign-in flow's state (Authlib's) in the
    `tether_oidc` cookie, `Secure` when the request came over https (directly or as a
    `--trusted-proxy` says), like the session cookie; SessionMiddleware alone sets one or the
    other for every request."""

    def __init__(self, app: ASGIApp, secret_key: str) -> None:
        options: dict[str, Any] = {
            "secret_key": secret_key,
            "session_cookie": STATE_COOKIE,
            "max_age": 600,
            "same_site": "lax",  # it must come back with the provider's redirect
            "path": "/api/auth/oidc/",
        }
        self.plain = SessionMiddleware(app, https_only=False, **options)
        self.secure = SessionMiddleware(app, https_only=True, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        https = scope.get("scheme") in ("https", "wss")
        await (self.secure if https else self.plain)(scope, receive, send)


class OIDCConfigError(Exception):
    """The OIDC settings are incomplete; the message says which."""


def client_secret(settings: Settings) -> str:
    """The client secret from `--oidc-client-secret-env`, removed from the environment."""
    var = settings.oidc_client_secret_env
    if not var:
        raise OIDCConfigError("--auth oidc needs --oidc-client-secret-env.")
    value = os.environ.pop(var, None)
    if not value:
        raise OIDCConfigError(
            f"The environment variable {var} (named by --oidc-client-secret-env) is not set."
        )
    return value


class OIDCLogin:
    def __init__(self, settings: Settings, secret: str) -> None:
        if not settings.oidc_issuer or not settings.oidc_client_id:
            raise OIDCConfigError("--auth oidc needs --oidc-issuer and --oidc-client-id.")
        self.allowed_groups = frozenset(settings.oidc_allowed_groups)
        # Checked by Authlib on the ID token. Its default checks only `iss`, and the audience
        # only through `azp`: a token for another client that names this one as its `azp`
        # would pass, so the audience is required here (tests/http/test_oidc.py). The issuer
        # is taken with or without a final `/`, as the provider writes it (Auth0's ends with
        # one, most do not): the same URL either way.
        issuer = settings.oidc_issuer.rstrip("/")
        self.claims_options = {
            "iss": {"essential": True, "values": [issuer, issuer + "/"]},
            "aud": {"essential": True, "values": [settings.oidc_client_id]},
        }
        self.oauth = OAuth()
        self.client = self.oauth.register(
            "tether",
            client_id=settings.oidc_client_id,
            client_secret=secret,
            server_metadata_url=settings.oidc_issuer.rstrip("/")
            + "/.well-known/openid-configuration",
            client_kwargs={"scope": "openid profile email", "code_challenge_method": "S256"},
        )

    def username(self, claims: dict[str, Any]) -> str:
        for claim in USERNAME_CLAIMS:
            value = claims.get(claim)
            if isinstance(value, str) and valid_username(value.strip()):
                return value.strip()
        raise BadCredentials("The provider named nobody Tether can call by a user name.")

    def check_groups(self, claims: dict[str, Any]) -> None:
        if not self.allowed_groups:
            return
        groups = claims.get("groups")
        if not isinstance(groups, list) or not self.allowed_groups & {str(g) for g in groups}:
            raise Forbidden("Your account is not in a group allowed to use this Tether.")


def _parts(request: Request) -> tuple[OIDCLogin, AccountAuth]:
    oidc: OIDCLogin | None = request.app.state.oidc
    if oidc is None:
        raise RouteNotFound("There is no such route (OIDC sign-in is off).")
    return oidc, request.app.state.accounts


def _onward(target: str) -> HTMLResponse:
    """A page that goes on to `target` at once. Not a redirect: the navigation that reached
    the callback was started by the provider's page, another site, and the browser withholds
    the SameSite=Strict session cookie from it and from every redirect it follows, so `next`
    would open signed out and go back to the provider. The page's own navigation is Tether's
    (tests/browser/test_login_oidc.py)."""
    where = html.escape(target)
    page = (
        '<!doctype html><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={where}">'
        f'<title>Signed in</title><a href="{where}">Continue</a>'
    )
    return HTMLResponse(page, headers={**PAGE_HEADERS, "Referrer-Policy": "no-referrer"})


def signed_out_page(target: str) -> HTMLResponse:
    """The login page after a logout: one button to sign in through the provider again."""
    link = LOGIN_PATH + "?" + urlencode({"next": target})
    return card_page("Signed out", "You are signed out.", link, "Sign in")


def _wants_page(request: Request) -> bool:
    """A browser's navigation (it asks for HTML first), not a client that reads JSON."""
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept


def mark_signed_out(response: Response, secure: bool) -> None:
    response.set_cookie(
        SIGNED_OUT_COOKIE,
        "1",
        max_age=SESSION_MAX_AGE,
        path=SIGNED_OUT_PATH,
        httponly=True,
        samesite="lax",
        secure=secure,
    )


@router.get(LOGIN_PATH, include_in_schema=False)
async def oidc_login(request: Request, next: str | None = None) -> Response:
    oidc, _ = _parts(request)
    request.session["next"] = safe_next(next)
    redirect_uri = str(request.url_for("oidc_callback"))
    try:  # the provider's discovery document, read at the first sign-in
        return await oidc.client.authorize_redirect(request, redirect_uri)
    except DISCOVERY_ERRORS as exc:
        raise _unavailable(exc) from None


@router.get(CALLBACK_PATH, include_in_schema=False, name="oidc_callback")
async def oidc_callback(request: Request) -> Response:
    """The provider sends the browser here: a refusal is a page for a person (with the API's
    status), the error object for a client that asks for JSON."""
    if asked_with_head(request):  # the code works once: a probe must not spend it
        raise HTTPException(405, "The sign-in callback takes GET only.", {"Allow": "GET"})
    try:
        return await _signed_in(request)
    except ApiError as exc:
        if not _wants_page(request):
            raise
        return card_page("Not signed in", exc.message, "/login", "Try again", exc.status)


async def _signed_in(request: Request) -> Response:
    oidc, accounts = _parts(request)
    try:
        token = await oidc.client.authorize_access_token(
            request, claims_options=copy.deepcopy(oidc.claims_options)
        )
    except HTTP_ERRORS as exc:  # the token endpoint or the keys: down, silent or failing
        raise _unavailable(exc) from None
    except OAuthError as exc:
        log.warning("OIDC sign-in refused: %s", exc)
        if exc.error == "access_denied":  # the person said no, or closed the provider's page
            raise BadCredentials("The sign-in was cancelled at the provider.") from None
        raise BadCredentials(f"The sign-in could not be verified ({exc}).") from None
    except (JoseError, ValueError) as exc:  # wrong state, nonce, audience, signature, expiry
        log.warning("OIDC sign-in refused: %s", exc)
        raise BadCredentials(f"The sign-in could not be verified ({exc}).") from None
    claims = token.get("userinfo")
    if not claims:
        raise BadCredentials("The provider sent no ID token.")
    oidc.check_groups(dict(claims))
    # The person is who the provider says (issuer and subject), never a name: a name they
    # can change at the provider must not open another person's account here.
    person = f"{claims['iss']}|{claims['sub']}"
    user = await accounts.store.user_by_external_id(person)
    if user is None:
        name = oidc.username(dict(claims))
        try:
            user = await accounts.store.add_user(name, None, admin=False, external_id=person)
            log.info("created user %s at their first OIDC sign-in", name)
        except UserExists:  # the name is someone else's, or a parallel sign-in made it
            user = await accounts.store.user_by_external_id(person)
            if user is None:
                raise UserExists(
                    f"The user name {name} is taken here by someone else; ask an admin."
                ) from None
    target = safe_next(request.session.pop("next", None))
    response = _onward(target)
    response.delete_cookie(SIGNED_OUT_COOKIE, path=SIGNED_OUT_PATH)
    response.set_cookie(
        COOKIE_NAME,
        accounts.cookie_for(user),
        max_age=accounts.max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response
