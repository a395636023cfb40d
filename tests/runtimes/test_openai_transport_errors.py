"""Layer: the OpenAI-compatible runtime's error classification, on the SDK's aiohttp transport
(`openai.DefaultAioHttpClient`, chosen for its CPU per streamed chunk; bench/README.md). That
transport raises httpx's ConnectTimeout for every aiohttp connection error, so a refused
connection would read "timed out"; these check that the message names what happened (a closed port
for real; the chains the transport builds, with aiohttp's own errors). A connection dropped
mid-answer: `test_openai_failures.py::test_text_before_a_dropped_connection_is_kept`."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import aiohttp
import openai
import pytest
from runtimes.openai_kit import make_runtime

from tether.runtimes.base import ProviderError
from tether.runtimes.openai_errors import classify

try:  # the SDK's own HTTP stack: httpx2 in recent versions
    import httpx2 as http
except ImportError:
    import httpx as http


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_summary_asked_of_a_closed_port_could_not_reach_the_provider(tmp_path: Path) -> None:
    """The SDK's own request path (compression's summary), not only the streamed turn."""
    port = closed_port()
    rt = make_runtime(f"http://127.0.0.1:{port}/v1", tmp_path, None)

    async def ask() -> None:
        try:
            await rt.summarize([{"role": "user", "content": "hello"}], None)
        finally:
            await rt.aclose()

    with pytest.raises(ProviderError) as info:
        asyncio.run(ask())
    assert info.value.code == "network"
    assert f"Could not reach the model provider at http://127.0.0.1:{port}" in info.value.message
    assert "ClientConnectorError" in info.value.message
    assert "timed out" not in info.value.message


def timeout_as_the_transport_raises_it(cause: Exception) -> openai.APITimeoutError:
    """The chain the SDK builds over its aiohttp transport: APITimeoutError from httpx's
    ConnectTimeout (or ReadTimeout) from aiohttp's own error."""
    request = http.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    try:
        try:
            try:
                raise cause
            except Exception as exc:
                raise http.ConnectTimeout(str(exc)) from exc
        except http.TimeoutException as exc:
            raise openai.APITimeoutError(request=request) from exc
    except openai.APITimeoutError as error:
        return error


@pytest.mark.parametrize(
    ("cause", "timed_out"),
    [
        (aiohttp.ServerTimeoutError("Timeout on reading data from socket"), True),
        (aiohttp.ConnectionTimeoutError("Connection timeout to host"), True),
        (aiohttp.ServerDisconnectedError(), False),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), False),
    ],
)
def test_only_a_timeout_under_the_transport_s_timeout_is_called_one(
    cause: Exception, timed_out: bool
) -> None:
    error = classify(
        timeout_as_the_transport_raises_it(cause),
        model="m",
        where="http://127.0.0.1:9/v1",
        streaming=False,
        key_env="KEY",
        key_set=False,
    )
    assert isinstance(error, ProviderError) and error.code == "network"
    assert ("did not answer in time" in error.message) is timed_out
    if not timed_out:
        assert type(cause).__name__ in error.message
