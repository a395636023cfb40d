"""A small, real OpenID Connect provider for the tests, served over HTTP on loopback by
uvicorn in a thread: discovery, an authorization endpoint that signs in `user` at once (no
page), a token endpoint that checks the client secret, the redirect URI and the PKCE
verifier (S256) and issues an RS256 ID token signed by joserfc, and its JWKS.

It is not a mock of Tether's client: Tether's Authlib client talks to it over HTTP exactly as
to any provider. `flaw` makes it misbehave the way the tests need, one way at a time:
`wrong_nonce`, `no_nonce`, `expired`, `wrong_audience`, `audience_with_azp`, `wrong_issuer`,
`bad_signature`, and `token_down` (its token endpoint answers 502, as a provider behind a
proxy whose backend is down). `host` is the name its issuer URL uses (`localhost` makes it
another site than a Tether on 127.0.0.1, as a real provider is), `issuer_tail` what the
issuer ends with after it (some providers' issuer ends with `/`), and `sign_in_page` makes
the authorization endpoint answer a page with a "Continue" link to follow, as a person signs
in at a real one.
"""

from __future__ import annotations

import base64
import hashlib
import html
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode

import uvicorn
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route


class Provider:
    def __init__(self, client_id: str, client_secret: str, host: str = "127.0.0.1") -> None:
        self.host = host
        self.issuer_tail = ""
        self.sign_in_page = False
        self.client_id = client_id
        self.client_secret = client_secret
        self.key = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256"})
        self.other_key = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256"})
        self.user: dict[str, Any] = {"sub": "u-1", "preferred_username": "olga"}
        self.flaw: str | None = None
        self.codes: dict[str, dict[str, Any]] = {}
        self.authorize_requests: list[dict[str, str]] = []
        self.token_refusals: list[str] = []
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def issuer(self) -> str:
        return self.base + self.issuer_tail

    # -- endpoints ------------------------------------------------------------------------
    async def discovery(self, request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.base}/authorize",
                "token_endpoint": f"{self.base}/token",
                "jwks_uri": f"{self.base}/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": [
                    "client_secret_basic",
                    "client_secret_post",
                ],
            }
        )

    async def jwks(self, request: Request) -> Response:
        return JSONResponse(KeySet([self.key]).as_dict(private=False))

    async def authorize(self, request: Request) -> Response:
        q = dict(request.query_params)
        self.authorize_requests.append(q)
        if q.get("client_id") != self.client_id or q.get("response_type") != "code":
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return JSONResponse({"error": "invalid_request", "why": "PKCE"}, status_code=400)
        code = secrets.token_urlsafe(16)
        self.codes[code] = {
            "redirect_uri": q["redirect_uri"],
            "challenge": q["code_challenge"],
            "nonce": q.get("nonce"),
            "user": dict(self.user),
        }
        back = q["redirect_uri"] + "?" + urlencode({"code": code, "state": q.get("state", "")})
        if self.sign_in_page:  # the person acts on the provider's page: it starts what follows
            return HTMLResponse(f'<a href="{html.escape(back)}">Continue</a>')
        return RedirectResponse(back, status_code=302)

    def _client_ok(self, request: Request, form: dict[str, str]) -> bool:
        header = request.headers.get("authorization", "")
        if header.startswith("Basic "):
            given = base64.b64decode(header[6:]).decode()
            return given == f"{self.client_id}:{self.client_secret}"
        return (
            form.get("client_id") == self.client_id
            and form.get("client_secret") == self.client_secret
        )

    def _refuse(self, why: str) -> Response:
        self.token_refusals.append(why)
        return JSONResponse({"error": "invalid_grant", "error_description": why}, status_code=400)

    async def token(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode()))  # x-www-form-urlencoded
        if self.flaw == "token_down":
            return Response("<html>Bad Gateway</html>", status_code=502, media_type="text/html")
        if not self._client_ok(request, form):
            return self._refuse("client")
        grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return self._refuse("code")
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return self._refuse("redirect_uri")
        verifier = form.get("code_verifier", "")
        digest = hashlib.sha256(verifier.encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant["challenge"]:
            return self._refuse("pkce")
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": grant["user"]["sub"],
            "aud": self.client_id,
            "iat": now,
            "exp": now + 300,
            "nonce": grant["nonce"],
            **{k: v for k, v in grant["user"].items() if k != "sub"},
        }
        key = self.key
        if self.flaw == "wrong_nonce":
            claims["nonce"] = "not-the-one-sent"
        elif self.flaw == "no_nonce":
            del claims["nonce"]
        elif self.flaw == "expired":
            claims["iat"], claims["exp"] = now - 7200, now - 3600
        elif self.flaw == "wrong_audience":
            claims["aud"] = "another-client"
        elif self.flaw == "audience_with_azp":  # for another client, naming this one azp
            claims["aud"], claims["azp"] = "another-client", self.client_id
        elif self.flaw == "wrong_issuer":
            claims["iss"] = "http://127.0.0.1:1"
        elif self.flaw == "bad_signature":
            key = self.other_key
        id_token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
        return JSONResponse(
            {
                "access_token": secrets.token_urlsafe(16),
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": id_token,
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self.discovery),
                Route("/jwks", self.jwks),
                Route("/authorize", self.authorize),
                Route("/token", self.token, methods=["POST"]),
            ]
        )


@contextmanager
def running_provider(
    client_id: str, client_secret: str, host: str = "127.0.0.1"
) -> Iterator[Provider]:
    provider = Provider(client_id, client_secret, host)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    provider.port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(provider.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the OIDC provider did not start"
        time.sleep(0.02)
    try:
        yield provider
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
