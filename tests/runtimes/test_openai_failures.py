"""The OpenAI runtime's failures against a real (fake) OpenAI-compatible server on loopback:
provider errors mapped to codes, a dropped or refused connection, and cancellation closing
the request, all over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from runtimes.openai_kit import content_events, make_runtime, run, turn

from tether.runtimes.base import (
    ProviderError,
    ReasoningDelta,
    RuntimeEvent,
    TextDelta,
    ToolCompleted,
    ToolStarted,
)
from tether.runtimes.openai import OpenAIRuntime

from fake_openai import (
    FakeOpenAI,
    Text,
    barrier,
    drop_connection,
    error,
    error_page,
    hang,
    malformed,
    reasoning,
    reply,
    stream_error,
    text,
    tool_call,
)

# ---- errors ----------------------------------------------------------------------------------


def refused(fake: FakeOpenAI, runtime: OpenAIRuntime, scripted: Any) -> ProviderError:
    """The provider's error a turn against `scripted` must end in."""
    fake.script(scripted)
    with pytest.raises(ProviderError) as info:
        run(runtime)
    return info.value


@pytest.mark.parametrize(
    ("scripted", "code", "says"),
    [
        (
            error(401, "Incorrect API key provided", code="invalid_api_key"),
            "auth",
            "Incorrect API key provided",
        ),
        (error(403, "Project has no access"), "auth", "Project has no access"),
        (  # OpenRouter, out of credits: the person acts on their account, as for a key
            error(402, "Insufficient credits. Add more using https://openrouter.ai/credits"),
            "auth",
            "payment required (HTTP 402): Insufficient credits",
        ),
        (
            error(429, "Slow down please", code="rate_limit_exceeded"),
            "rate_limit",
            "Slow down please",
        ),
        (
            error(404, "The model 'fake-model' does not exist", code="model_not_found"),
            "model_not_found",
            "does not exist",
        ),
        (
            error(
                400,
                "This model's maximum context length is 4096 tokens",
                code="context_length_exceeded",
            ),
            "context_overflow",
            "maximum context length is 4096",
        ),
        (
            error(400, "the request exceeds the available context size, try increasing it"),
            "context_overflow",
            "available context size",
        ),
        (
            error(400, "tools are not supported by this model"),
            "internal",
            "tools are not supported",
        ),
        (error(500, "the GPU caught fire"), "bad_response", "the GPU caught fire"),
        (error(503, {"detail": "overloaded"}), "bad_response", "overloaded"),
        (malformed(), "bad_response", "not valid JSON"),
        (
            reply(text("a"), stream_error("upstream died", code="oops")),
            "bad_response",
            "upstream died",
        ),
        (drop_connection(text("half")), "network", "connection"),
    ],
)
def test_errors_map_to_codes(
    fake: FakeOpenAI, runtime: OpenAIRuntime, scripted: Any, code: str, says: str
) -> None:
    refusal = refused(fake, runtime, scripted)
    assert refusal.code == code
    assert says in refusal.message


NGINX_404 = (
    "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found"
    "</h1></center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n"
)
CLOUDFLARE_403 = (
    "<!DOCTYPE html><html lang='en-US'><head><title>Just a moment...</title>"
    "<style>body{font:13px}</style><script>window._cf_chl_opt={cvId: '3'};</script></head>"
    "<body><h1>Checking your browser</h1></body></html>"
)
UNTITLED_502 = (
    "<html><body><h1>Bad Gateway</h1><p>The upstream &amp; its proxy failed.</p></body></html>"
)


@pytest.mark.parametrize(
    ("scripted", "code", "says"),
    [
        (error_page(404, NGINX_404), "model_not_found", "HTML page: 404 Not Found"),
        (error_page(403, CLOUDFLARE_403), "auth", "HTML page: Just a moment..."),
        (error_page(502, UNTITLED_502), "bad_response", "Bad Gateway The upstream & its proxy"),
        (  # Gemini's OpenAI-compatible endpoint wraps its error in a list
            error(
                400,
                [
                    {
                        "error": {
                            "code": 400,
                            "message": 'Invalid JSON payload received. Unknown name "x".',
                            "status": "INVALID_ARGUMENT",
                        }
                    }
                ],
            ),
            "internal",
            'Unknown name "x"',
        ),
    ],
)
def test_refusals_in_pages_and_lists_are_told_in_words(
    fake: FakeOpenAI, runtime: OpenAIRuntime, scripted: Any, code: str, says: str
) -> None:
    # Before: a page's whole HTML was the message, and a list body left only "Error code: 400".
    refusal = refused(fake, runtime, scripted)
    assert refusal.code == code
    assert says in refusal.message
    assert "<" not in refusal.message and "cf_chl" not in refusal.message


@pytest.mark.parametrize(
    ("retry_after", "says"),
    [("20", "asks to wait 20 s"), ("1.5", "asks to wait 2 s"), (None, "Wait a moment")],
)
def test_a_rate_limit_says_how_long_the_provider_asks_to_wait(
    fake: FakeOpenAI, runtime: OpenAIRuntime, retry_after: str | None, says: str
) -> None:
    # Before: always "Wait a moment", though the provider said how long.
    headers = {"retry-after": retry_after} if retry_after else {}
    fake.script(error(429, "Rate limit reached for requests", headers=headers))
    with pytest.raises(ProviderError) as info:
        run(runtime)
    assert info.value.code == "rate_limit"
    assert says in info.value.message


def test_auth_error_names_the_key_variable(
    fake: FakeOpenAI, runtime: OpenAIRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_TEST_OPENAI_KEY", raising=False)
    fake.script(error(401, "no key"))
    with pytest.raises(ProviderError, match="Set TETHER_TEST_OPENAI_KEY"):
        run(runtime)


def test_text_before_a_dropped_connection_is_kept(fake: FakeOpenAI, runtime: OpenAIRuntime) -> None:
    fake.script(drop_connection(reasoning("hmm"), text("half")))
    seen: list[RuntimeEvent] = []
    with pytest.raises(ProviderError) as info:
        run(runtime, into=seen)
    assert info.value.code == "network"
    assert "ClientPayloadError" in info.value.message  # aiohttp's reason, not its httpx name
    assert seen == [ReasoningDelta("hmm"), TextDelta("half")]


def test_connection_refused_is_network(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rt = make_runtime(f"http://127.0.0.1:{port}/v1", tmp_path, None)
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        run(rt)
    assert info.value.code == "network"
    assert f"Could not reach the model provider at http://127.0.0.1:{port}" in info.value.message
    assert "timed out" not in info.value.message  # the HTTP transport calls it ConnectTimeout
    assert time.monotonic() - started < 5


def test_error_in_the_second_request_of_a_tool_loop(
    fake: FakeOpenAI, runtime: OpenAIRuntime
) -> None:
    fake.script(reply(tool_call("c1", "list_files", {})), error(429, "later"))
    seen: list[RuntimeEvent] = []
    with pytest.raises(ProviderError) as info:
        run(runtime, into=seen)
    assert info.value.code == "rate_limit"
    assert [type(e) for e in content_events(seen)] == [ToolStarted, ToolCompleted]


# ---- cancellation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param((text("partial"), hang()), id="mid-stream"),
        pytest.param((barrier("never"), text("x")), id="before-content"),
    ],
)
def test_cancelling_the_consumer_closes_the_request(
    fake: FakeOpenAI, runtime: OpenAIRuntime, steps: tuple[Any, ...]
) -> None:
    fake.script(reply(*steps))

    async def main() -> float:
        seen: list[RuntimeEvent] = []

        async def consume() -> None:
            async for event in runtime.stream(turn()):
                seen.append(event)

        task = asyncio.create_task(consume())
        if isinstance(steps[0], Text):
            while not seen:
                await asyncio.sleep(0.01)
            assert seen == [TextDelta("partial")]
        else:
            assert await asyncio.to_thread(fake.wait_reached, "never", 5)
        cancelled_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - cancelled_at < 1.0
        assert await asyncio.to_thread(fake.wait_disconnects, 1, 1.0)
        await runtime.aclose()
        return cancelled_at

    cancelled_at = asyncio.run(main())
    assert fake.disconnects == 1
    assert fake.disconnect_times[0] - cancelled_at < 1.0


def test_closing_the_stream_early_closes_the_request(
    fake: FakeOpenAI, runtime: OpenAIRuntime
) -> None:
    fake.script(reply(text("partial"), hang()))

    async def main() -> float:
        async with contextlib.aclosing(runtime.stream(turn())) as events:
            async for event in events:
                assert event == TextDelta("partial")
                break
        closed_at = time.monotonic()
        assert await asyncio.to_thread(fake.wait_disconnects, 1, 1.0)
        await runtime.aclose()
        return closed_at

    closed_at = asyncio.run(main())
    assert fake.disconnect_times[0] - closed_at < 1.0


def test_cancelling_during_a_tool_stops_the_loop(
    fake: FakeOpenAI, runtime: OpenAIRuntime, workspace: Path
) -> None:
    fake.script(reply(tool_call("c1", "list_files", {})), reply(text("never asked")))

    async def main() -> None:
        async def consume() -> None:
            async for event in runtime.stream(turn()):
                if isinstance(event, ToolStarted):
                    asyncio.current_task().cancel()  # type: ignore[union-attr]

        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(consume())
        await runtime.aclose()

    asyncio.run(main())
    assert fake.requests_count == 1
