"""What the OpenAI runtime sends and how it reads refusals, against the fake server over real
HTTP: `max_tokens` (and room for it when compressing), `tool_choice`, servers that refuse
tools, an unknown model on a pinned server, and a context overflow (a 400, or llama.cpp's
empty 200 stream) answered by one compression pass and one retry."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from tether.events import SUMMARY_PREFIX
from tether.runtimes.base import (
    CompressionCompleted,
    CompressionStarted,
    ProviderError,
    RuntimeEvent,
    TextDelta,
    TurnInput,
    Usage,
)
from tether.runtimes.compression import answer_tokens
from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI, error, malformed, reply, text

OVERFLOW = error(
    400,
    "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens.",
    code="context_length_exceeded",
)


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def history(pairs: int = 2) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(pairs):
        out += [user(f"question {i}"), {"role": "assistant", "content": f"answer {i}"}]
    return [*out, user("and now?")]


def runtime(fake: FakeOpenAI, tmp_path: Path, **settings: Any) -> OpenAIRuntime:
    return OpenAIRuntime(
        Settings(
            runtime="openai",
            base_url=fake.base_url,
            model="fake-model",
            data_dir=tmp_path / "data",
            **settings,
        )
    )


def run(
    rt: OpenAIRuntime, messages: list[dict[str, Any]] | None = None, model: str | None = None
) -> list[RuntimeEvent]:
    events: list[RuntimeEvent] = []

    async def main() -> None:
        try:
            turn = TurnInput("s1", "st1", "t1", messages or [user("hi")], model=model)
            async for event in rt.stream(turn):
                events.append(event)
        finally:
            await rt.aclose()

    asyncio.run(main())
    return [e for e in events if not isinstance(e, Usage)]


def chat_requests(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r.get("stream")]


# ---- max_tokens -----------------------------------------------------------------------------


def test_max_tokens_defaults_to_an_eighth_of_the_window(fake: FakeOpenAI, tmp_path: Path) -> None:
    run(runtime(fake, tmp_path))  # the model card says 32768
    assert fake.requests[0]["max_tokens"] == 4096
    run(runtime(fake, tmp_path, context_window=2000))
    assert fake.requests[1]["max_tokens"] == 250
    run(runtime(fake, tmp_path, context_window=600))
    assert fake.requests[2]["max_tokens"] == 75


def test_max_tokens_is_configurable_and_not_sent_without_a_window(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    run(runtime(fake, tmp_path, max_tokens=100))
    run(runtime(fake, tmp_path), model="unknown-model")  # no window: nothing to derive from
    run(runtime(fake, tmp_path, max_tokens=100), model="unknown-model")
    first, second, third = fake.requests
    assert first["max_tokens"] == 100
    assert "max_tokens" not in second
    assert third["max_tokens"] == 100


def test_max_tokens_never_passes_what_the_prompt_leaves(fake: FakeOpenAI, tmp_path: Path) -> None:
    # window 1000, room 500 (--max-tokens, at most half the window); the prompt takes about
    # 560 x 1.25 (the safety scale of an unmeasured tokenizer) and cannot be compressed
    run(runtime(fake, tmp_path, context_window=1000, max_tokens=900), [user("x" * 2200)])
    sent = fake.requests[0]["max_tokens"]
    assert sent == 1000 - math.ceil((2200 // 4 + 4) * 1.25)


def test_the_answers_room_is_kept_free_when_compressing(fake: FakeOpenAI, tmp_path: Path) -> None:
    # ~1,500 tokens: under 0.8 of a 2,000 window (no compression before), over 0.8 of the
    # 1,750 the window leaves after the answer's 250.
    messages = [user("a" * 2900), {"role": "assistant", "content": "b" * 2900}, user("go on")]
    fake.script(reply(text("SUMMARY")), reply(text("done")))
    events = run(runtime(fake, tmp_path, context_window=2000), messages)
    assert [type(e) for e in events] == [CompressionStarted, CompressionCompleted, TextDelta]
    summary_request, answer_request = fake.requests
    assert not summary_request.get("stream") and summary_request["max_tokens"] == 250
    assert answer_request["messages"][0]["content"] == f"{SUMMARY_PREFIX}SUMMARY"


def test_answer_tokens_bounds() -> None:
    assert answer_tokens(None, None) is None
    assert answer_tokens(None, 77) == 77
    assert answer_tokens(131072, None) == 4096
    assert answer_tokens(8192, None) == 1024
    assert answer_tokens(512, None) == 64
    assert answer_tokens(1000, 5000) == 500


def test_a_server_asking_for_max_completion_tokens_gets_it(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(
        error(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            code="unsupported_parameter",
        ),
        reply(text("fine")),
        reply(text("again")),
    )
    rt = runtime(fake, tmp_path, max_tokens=64)

    async def two_turns() -> None:
        try:
            for _ in range(2):
                async for _event in rt.stream(TurnInput("s1", "st1", "t1", [user("hi")])):
                    pass
        finally:
            await rt.aclose()

    asyncio.run(two_turns())
    first, retried, later = fake.requests
    assert first["max_tokens"] == 64
    assert retried["max_completion_tokens"] == 64 and "max_tokens" not in retried
    assert later["max_completion_tokens"] == 64 and "max_tokens" not in later


# ---- tools ----------------------------------------------------------------------------------


def test_tool_choice_auto_goes_with_the_tools(fake: FakeOpenAI, tmp_path: Path) -> None:
    run(runtime(fake, tmp_path, workspace=tmp_path))
    run(runtime(fake, tmp_path))
    with_tools, without = fake.requests
    assert with_tools["tools"] and with_tools["tool_choice"] == "auto"
    assert "tools" not in without and "tool_choice" not in without


@pytest.mark.parametrize(
    "refusal",
    [
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        "Cannot use tools with stream",
        {"error": {"message": "tools param requires --jinja flag", "type": "not_supported"}},
    ],
)
def test_a_server_refusing_tools_says_so(fake: FakeOpenAI, tmp_path: Path, refusal: Any) -> None:
    fake.script(error(400, refusal))
    with pytest.raises(ProviderError) as info:
        run(runtime(fake, tmp_path, workspace=tmp_path))
    assert info.value.code == "internal"
    assert "refused the request with tools" in info.value.message
    assert "without --workspace" in info.value.message
    assert fake.requests_count == 1  # never silently retried without tools


# ---- error mapping --------------------------------------------------------------------------


def test_a_server_pinned_to_another_model_is_model_not_found(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(error(400, {"detail": "Server is pinned to 'tiny-llama'; requested 'fake-model'."}))
    with pytest.raises(ProviderError) as info:
        run(runtime(fake, tmp_path))
    assert info.value.code == "model_not_found"
    assert "pinned to 'tiny-llama'" in info.value.message
    assert "--model" in info.value.message


@pytest.mark.parametrize(
    "overflow", [pytest.param(OVERFLOW, id="400"), pytest.param(malformed(""), id="empty-200")]
)
def test_an_overflow_is_compressed_and_retried_once(
    fake: FakeOpenAI, tmp_path: Path, overflow: Any
) -> None:
    fake.script(overflow, reply(text("SUMMARY")), reply(text("fits now")))
    events = run(runtime(fake, tmp_path), history())
    assert [type(e) for e in events] == [CompressionStarted, CompressionCompleted, TextDelta]
    first, summary, retried = fake.requests
    assert first["messages"] == history()
    assert not summary.get("stream")
    assert retried["messages"] == [
        {"role": "system", "content": f"{SUMMARY_PREFIX}SUMMARY"},
        user("and now?"),
    ]


@pytest.mark.parametrize(
    "overflow", [pytest.param(OVERFLOW, id="400"), pytest.param(malformed(""), id="empty-200")]
)
def test_a_second_overflow_is_the_error(fake: FakeOpenAI, tmp_path: Path, overflow: Any) -> None:
    fake.script(overflow, reply(text("SUMMARY")), overflow, reply(text("never asked")))
    with pytest.raises(ProviderError) as info:
        run(runtime(fake, tmp_path), history())
    assert info.value.code == "context_overflow"
    assert len(chat_requests(fake)) == 2 and fake.pending == 1


def test_an_overflow_with_nothing_to_compress_is_the_error(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(malformed(""))
    with pytest.raises(ProviderError) as info:
        run(runtime(fake, tmp_path), [user("one huge message")])
    assert info.value.code == "context_overflow"
    assert "empty stream" in info.value.message
    assert fake.requests_count == 1


@pytest.mark.parametrize(
    ("status", "words"),
    [
        pytest.param(
            400,
            "This model's maximum prompt length is 131072 but the request contains 150000 tokens.",
            id="xai",
        ),
        pytest.param(
            400,
            [
                {
                    "error": {
                        "code": 400,
                        "message": "The input token count (1200000) exceeds the maximum number "
                        "of tokens allowed (1048576).",
                        "status": "INVALID_ARGUMENT",
                    }
                }
            ],
            id="gemini",
        ),
        pytest.param(
            422,
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be "
                "<= 4096. Given: 4000 `inputs` tokens and 512 `max_new_tokens`",
                "error_type": "validation",
            },
            id="text-generation-inference",
        ),
        pytest.param(
            400,
            "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
            "Make sure that `max_model_len` is no smaller than the number of text tokens.",
            id="vllm-v1",
        ),
    ],
)
def test_each_provider_s_words_for_an_overflow_are_an_overflow(
    fake: FakeOpenAI, tmp_path: Path, status: int, words: Any
) -> None:
    # Before: read as `internal` (a request Tether built wrong), so nothing was compressed.
    fake.script(error(status, words), reply(text("SUMMARY")), reply(text("fits now")))
    events = run(runtime(fake, tmp_path), history())
    assert [type(e) for e in events] == [CompressionStarted, CompressionCompleted, TextDelta]
