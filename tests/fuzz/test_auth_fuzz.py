"""Layer: the sign-in and account routes (docs/api.md §15), fuzzed by schemathesis against a
real `tether serve --auth accounts`.

The server's own OpenAPI document drives the generation for every route under
`/api/auth/`, `/api/me`, `/api/users` and `/api/tokens`, schema-valid and schema-violating,
sent with an admin's token (so a generated logout cannot end the walk) and, for the sign-in,
without one. Every response must not be a 5xx, must have a documented status and body, a
request the schema forbids must be refused with a 4xx, and any 4xx must change nothing: the
users, the caller's tokens and who the caller is are snapshotted before and after it. Then
hand-made hostile inputs: odd `Authorization` headers, cookies, user names and bodies.

`TETHER_FUZZ_EXAMPLES` sets the examples per operation and mode (default 15).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from accounts_kit import add_user, bearer, new_token, sign_in
from helpers import ServerProcess, running_server

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("TETHER_FUZZ_EXAMPLES", "15"))
PREFIXES = ("/api/auth/", "/api/me", "/api/users", "/api/tokens")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class AuthFuzz:
    server: ServerProcess
    admin: httpx.Client  # alice's token
    token: str
    schema: Any
    statuses: dict[int, int] = field(default_factory=dict)

    def snapshot(self) -> tuple:
        return (
            self.admin.get("/api/users").json(),
            self.admin.get("/api/tokens").json(),
            self.admin.get("/api/me").json(),
        )


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthFuzz]:
    data: Path = tmp_path_factory.mktemp("auth-fuzz") / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with running_server(data, "--auth", "accounts") as server:
        with sign_in(server, "alice") as alice:
            token = new_token(alice, "fuzz")["token"]
        schema = schemathesis.openapi.from_url(
            f"{server.base_url}/api/openapi.json",
            headers={"Authorization": f"Bearer {token}"},
        )
        with bearer(server, token) as admin:
            yield AuthFuzz(server, admin, token, schema)


def auth_operations(fuzz: AuthFuzz) -> list[Any]:
    found = [result.ok() for result in fuzz.schema.get_all_operations()]
    return [op for op in found if op.path.startswith(PREFIXES)]


def fuzz_operation(fuzz: AuthFuzz, operation: Any, mode: GenerationMode, signed: bool) -> None:
    headers = {"Authorization": f"Bearer {fuzz.token}"} if signed else {}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        before = fuzz.snapshot()
        response = case.call(base_url=fuzz.server.base_url, headers=headers, timeout=15)
        checks = list(CHECKS)
        if mode is GenerationMode.NEGATIVE:
            checks.append(negative_data_rejection)
        case.validate_response(response, checks=checks)
        fuzz.statuses[response.status_code] = fuzz.statuses.get(response.status_code, 0) + 1
        if 400 <= response.status_code < 500:
            assert fuzz.snapshot() == before, (
                f"{case.operation.label} answered {response.status_code} {response.text[:300]} "
                f"but changed state.\nReproduce: {case.as_curl_command()}"
            )

    run()


@pytest.mark.timeout(300)
def test_fuzzed_auth_requests_never_fail_the_server_or_change_state_when_rejected(
    fuzz: AuthFuzz,
) -> None:
    ops = auth_operations(fuzz)
    labels = {op.label for op in ops}
    assert {"POST /api/auth/login", "POST /api/users", "DELETE /api/tokens/{token_id}"} <= labels
    failures: list[str] = []
    for operation in ops:
        modes = [GenerationMode.POSITIVE]
        if any(True for _ in operation.iter_parameters()) or operation.body:
            modes.append(GenerationMode.NEGATIVE)  # nothing to get wrong otherwise
        for mode in modes:
            for signed in (True, False) if operation.path == "/api/auth/login" else (True,):
                try:
                    fuzz_operation(fuzz, operation, mode, signed)
                except Exception as exc:  # report every operation, not only the first
                    failures.append(f"--- {operation.label} ({mode.value}, {signed=}) ---\n{exc}")
    print(f"\nauth fuzz statuses {dict(sorted(fuzz.statuses.items()))}")
    assert not failures, "\n\n".join(failures) + f"\n\nserver log:\n{fuzz.server.log()[-3000:]}"
    assert "Traceback" not in fuzz.server.log(), fuzz.server.log()[-3000:]
    assert fuzz.admin.get("/api/me").json()["username"] == "alice"  # still signed in


HOSTILE_AUTHORIZATION = [
    "",
    "Bearer",
    "Bearer ",
    "bearer tth_",
    "Bearer tth_" + "A" * 10_000,
    "Bearer \x00",
    "Bearer tth_é",
    "Basic YWxpY2U6YWxpY2UtcGFzcy0x",
    "Bearer a b c",
]


@pytest.mark.parametrize("header", HOSTILE_AUTHORIZATION)
def test_hostile_authorization_headers_are_a_plain_401(fuzz: AuthFuzz, header: str) -> None:
    before = fuzz.snapshot()
    try:
        response = httpx.get(
            f"{fuzz.server.base_url}/api/me", headers={"Authorization": header}, timeout=5
        )
    except (httpx.LocalProtocolError, UnicodeEncodeError):
        return  # the client refuses to send it: nothing reached the server
    assert response.status_code in (400, 401), (header[:40], response.text)
    if response.status_code == 401:
        assert response.json()["code"] == "unauthenticated"
    assert fuzz.snapshot() == before


@pytest.mark.parametrize(
    "cookie",
    ["", "x", "a.b.c", "eyJ1IjoidXNyX3gifQ.AAAA.BBBB", "\u00ff" * 100, "." * 5000],
)
def test_forged_cookies_are_not_a_session(fuzz: AuthFuzz, cookie: str) -> None:
    with httpx.Client(base_url=fuzz.server.base_url, timeout=5) as client:
        client.cookies.set("tether_session", cookie)
        try:
            response = client.get("/api/me")
        except (httpx.LocalProtocolError, UnicodeEncodeError):
            return
        assert response.status_code == 401 and response.json()["code"] == "unauthenticated"


@pytest.mark.parametrize(
    "body",
    [
        {"username": "alice", "password": ""},
        {"username": "", "password": "x"},
        {"username": 7, "password": "x"},
        {"username": ["alice"], "password": "x"},
        {"username": "alice", "password": "x" * 5000},
        {"username": "a" * 300, "password": "x"},
        {"username": "alice\ud800", "password": "x"},
        {"username": "alice"},
        [],
        "alice",
    ],
)
def test_malformed_sign_ins_are_a_400_and_change_nothing(fuzz: AuthFuzz, body: Any) -> None:
    before = fuzz.snapshot()
    with httpx.Client(base_url=fuzz.server.base_url, timeout=5) as client:
        response = client.post(  # ensure_ascii: a lone surrogate is sent as \ud800
            "/api/auth/login",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 400, (body, response.text)
    assert response.json()["code"] == "invalid_request"
    assert "set-cookie" not in response.headers
    assert fuzz.snapshot() == before
