"""Layer: the OpenAI-compatible runtime's error classification. The streamed turn is sent with
the SDK's HTTP client but not its request building (0.9 ms of every first token), so a refusal is
turned into the SDK's own error by `status_error`. These pin it to what the SDK itself
makes of the same response, so `classify` keeps reading both paths alike."""

from __future__ import annotations

import openai
import pytest

from tether.runtimes.openai_errors import status_error

try:  # the SDK's own HTTP stack, which the runtime sends on: httpx2 in recent versions
    import httpx2 as http
except ImportError:
    import httpx as http
REQUEST = http.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
BODIES = [
    {"error": {"message": "maximum context length is 8192 tokens", "code": "context_length"}},
    {"error": "plain words"},
    {"detail": "Not Found"},
    "not json at all",
    "",
]


@pytest.mark.parametrize("status", [307, 400, 401, 403, 404, 409, 413, 422, 429, 500, 503])
@pytest.mark.parametrize("body", BODIES)
def test_a_refusal_becomes_the_error_the_sdk_itself_raises(status: int, body: object) -> None:
    raw = body if isinstance(body, str) else None
    ours = status_error(
        http.Response(status, request=REQUEST, text=raw)
        if raw is not None
        else http.Response(status, request=REQUEST, json=body)
    )
    sdk = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")
    theirs = sdk._make_status_error_from_response(  # the SDK's own mapping, for comparison
        http.Response(status, request=REQUEST, text=raw)
        if raw is not None
        else http.Response(status, request=REQUEST, json=body)
    )
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)
    assert ours.body == theirs.body
    assert ours.status_code == status and ours.code == theirs.code
