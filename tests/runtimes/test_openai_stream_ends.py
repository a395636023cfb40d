"""How a streamed answer ends, against the fake server's faults: only a stream the provider
finished (a `finish_reason`, or `[DONE]`) is an answer. Chunks of the wrong shape, a stream
closed before it finished and a provider that stops sending are errors that keep the text
streamed before them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from runtimes.openai_kit import content_events, run, turn

from tether.runtimes.base import (
    AnswerFinished,
    ProviderError,
    RuntimeEvent,
    TextDelta,
    ToolCompleted,
)
from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

from fake_openai import (
    FakeOpenAI,
    delay,
    end,
    error,
    hang,
    malformed,
    raw,
    reply,
    stall,
    text,
    tool_call,
    verbatim,
)


def runtime_for(fake: FakeOpenAI, tmp_path: Path, **settings: Any) -> OpenAIRuntime:
    return OpenAIRuntime(
        Settings(
            runtime="openai",
            base_url=fake.base_url,
            model="fake-model",
            data_dir=tmp_path / "data",
            **settings,
        )
    )


def failed_run(fake: FakeOpenAI, tmp_path: Path) -> tuple[ProviderError, list[RuntimeEvent]]:
    """One turn that must end in the provider's error: that error and what it sent first."""
    seen: list[RuntimeEvent] = []
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path), into=seen)
    return info.value, seen


@pytest.mark.parametrize(
    ("chunk", "says"),
    [
        pytest.param({"choices": [{"delta": "more text"}]}, "'delta' is not an object", id="delta"),
        pytest.param(
            {"choices": [{"index": 0, "message": {"content": "x"}}]}, "no 'delta'", id="message"
        ),
        pytest.param({"choices": [{"delta": {"content": 5}}]}, "not a string", id="content"),
        pytest.param({"choices": {"delta": {}}}, "not a list", id="choices"),
        pytest.param({"output": "hello"}, "neither 'choices' nor 'usage'", id="no-choices"),
        pytest.param(["a", "list"], "JSON list", id="list"),
        pytest.param('"a string"', "JSON str", id="string"),
    ],
)
def test_a_chunk_of_the_wrong_shape_is_a_bad_response_and_keeps_the_text(
    fake: FakeOpenAI, tmp_path: Path, chunk: Any, says: str
) -> None:
    # Before: these were skipped and the stream's [DONE] made an answer of what was left.
    fake.script(reply(text("partial "), raw(chunk), text("never seen")))
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "bad_response"
    assert says in error.message
    assert content_events(seen) == [TextDelta("partial ")]


def test_only_wrong_shaped_chunks_are_not_an_empty_answer(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(raw({"choices": [{"text": "legacy completions shape"}]})))
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path))
    assert info.value.code == "bad_response"


def test_a_stream_closed_without_finish_reason_or_done_is_a_network_error(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    # The HTTP body ends cleanly, as when llama.cpp's server crashes mid-answer.
    fake.script(reply(text("The answer is"), end()))
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "network"
    assert "before the answer was finished" in error.message
    assert content_events(seen) == [TextDelta("The answer is")]


def test_a_finished_stream_is_still_an_answer(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("complete")))
    events = run(runtime_for(fake, tmp_path))
    assert content_events(events) == [TextDelta("complete")]


def test_a_stalled_stream_ends_at_the_idle_timeout_and_keeps_the_text(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(reply(text("so far"), hang()))
    seen: list[RuntimeEvent] = []
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path, stream_idle_timeout=0.5), into=seen)
    elapsed = time.monotonic() - started
    assert info.value.code == "network"
    assert "nothing arrived for 0.5 s" in info.value.message
    assert "--stream-idle-timeout" in info.value.message
    assert content_events(seen) == [TextDelta("so far")]
    assert 0.5 <= elapsed < 5
    assert fake.wait_disconnects(1), "the stalled request is closed"


def test_a_provider_that_never_sends_the_headers_ends_at_the_idle_timeout(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(reply(stall()))
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path, stream_idle_timeout=0.5))
    assert info.value.code == "network"
    assert "sent no answer: nothing arrived for 0.5 s" in info.value.message
    assert time.monotonic() - started < 5
    assert fake.wait_disconnects(1), "the stalled request is closed"


def test_a_slow_stream_that_keeps_sending_is_not_cut(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("a"), delay(0.3), text("b"), delay(0.3), text("c")))
    events = run(runtime_for(fake, tmp_path, stream_idle_timeout=0.5))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "abc"


def test_the_idle_timeout_defaults_to_five_minutes() -> None:
    assert Settings().stream_idle_timeout == 300.0


def test_an_answer_cut_off_at_the_token_limit_is_reported(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("cut"), finish_reason="length"), reply(text("whole")))
    assert content_events(run(runtime_for(fake, tmp_path))) == [
        TextDelta("cut"),
        AnswerFinished("length"),
    ]
    assert content_events(run(runtime_for(fake, tmp_path))) == [TextDelta("whole")]


LLAMA_CPP_OVERFLOW = (
    'error: {"code":400,"message":"the request exceeds the available context size, try '
    'increasing it","type":"exceed_context_size_error"}\n\ndata: [DONE]\n\n'
)


def test_llama_cpp_s_error_line_is_the_error_it_reports(fake: FakeOpenAI, tmp_path: Path) -> None:
    # llama.cpp's server writes a streamed request's failure as an `error: {...}` line, then
    # `[DONE]`. Before: the line was skipped, so mid-answer the [DONE] made a complete answer of
    # the text so far, and before any text the provider's words were lost.
    fake.script(
        reply(text("Half an "), verbatim('error: {"code":500,"message":"slot crashed"}\n\n'))
    )
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "bad_response"
    assert "slot crashed" in error.message
    assert content_events(seen) == [TextDelta("Half an ")]


def test_llama_cpp_s_overflow_line_compresses_and_retries(fake: FakeOpenAI, tmp_path: Path) -> None:
    history = [
        {"role": "user", "content": "an earlier question"},
        {"role": "assistant", "content": "an earlier answer"},
        {"role": "user", "content": "hi"},
    ]
    fake.script(reply(verbatim(LLAMA_CPP_OVERFLOW)), reply(text("summary")), reply(text("fits")))
    events = run(runtime_for(fake, tmp_path), turn(history))
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("fits")]
    assert fake.requests_count == 3  # the turn, the summary, the turn again


def test_a_named_error_event_is_the_error_it_reports(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("so far"), verbatim('event: error\ndata: {"message":"Overloaded"}\n\n')))
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "bad_response"
    assert "Overloaded" in error.message
    assert content_events(seen) == [TextDelta("so far")]


def test_a_json_error_answered_with_200_is_the_provider_s_error(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    # Before: any 200 body without `data:` lines was taken for llama.cpp's empty stream, so
    # this was reported as `context_overflow` (and compressed and sent again).
    fake.script(error(200, "upstream provider unavailable"))
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path))
    assert info.value.code == "bad_response"
    assert "upstream provider unavailable" in info.value.message
    assert fake.requests_count == 1


def test_a_page_answered_with_200_is_a_bad_response(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(malformed("<html><head><title>Sign in</title></head><body>...</body></html>"))
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path))
    assert info.value.code == "bad_response"
    assert "not a stream" in info.value.message and "<html>" in info.value.message


def test_a_server_that_ignores_stream_still_answers(
    fake: FakeOpenAI, tmp_path: Path, workspace: Path
) -> None:
    fake.script(
        reply(
            text("Reading it."),
            tool_call("call_1", "read_file", {"path": "a.txt"}),
            unstreamed=True,
        ),
        reply(text("It says hello tools."), unstreamed=True),
    )
    events = content_events(run(runtime_for(fake, tmp_path, workspace=workspace)))
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert texts == ["Reading it.", "It says hello tools."]
    completed = [e for e in events if isinstance(e, ToolCompleted)]
    assert [(c.name, c.result, c.is_error) for c in completed] == [
        ("read_file", "hello tools", False)
    ]


def test_an_answer_the_provider_finished_with_error_is_an_error(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    # OpenRouter's `finish_reason: "error"` (its error object may be missing): before, the run
    # ended `completed` with the text so far, as if it were the whole answer.
    fake.script(reply(text("The first half"), finish_reason="error"))
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "bad_response"
    assert 'finish_reason "error"' in error.message
    assert content_events(seen) == [TextDelta("The first half")]


@pytest.mark.parametrize(
    "error",
    [
        pytest.param({"code": 429, "message": "Rate limit exceeded upstream"}, id="openrouter"),
        pytest.param(
            {"type": "rate_limit_error", "message": "Rate limit exceeded upstream"}, id="by-type"
        ),
    ],
)
def test_a_rate_limit_reported_in_the_stream_is_rate_limit(
    fake: FakeOpenAI, tmp_path: Path, error: dict[str, Any]
) -> None:
    # Before: `bad_response`, as if the provider had failed rather than asked to wait.
    fake.script(
        reply(
            text("partial"),
            raw(
                {"error": error, "choices": [{"delta": {"content": ""}, "finish_reason": "error"}]}
            ),
        )
    )
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "rate_limit"
    assert "Rate limit exceeded upstream" in error.message
    assert content_events(seen) == [TextDelta("partial")]


def test_empty_chunks_mid_answer_are_skipped(fake: FakeOpenAI, tmp_path: Path) -> None:
    # `choices: null` (vLLM, gateways in front of Claude) and `data: null` keep-alives come in
    # healthy streams; before, either ended the run `bad_response` mid-answer.
    fake.script(
        reply(
            text("The answer "),
            raw({"id": "x", "object": "chat.completion.chunk", "choices": None}),
            raw("null"),
            text("goes on."),
        )
    )
    events = run(runtime_for(fake, tmp_path))
    assert content_events(events) == [TextDelta("The answer "), TextDelta("goes on.")]


def test_a_stream_of_only_empty_chunks_is_no_answer(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(malformed('data: {"choices": null}\n\ndata: null\n\ndata: [DONE]\n\n'))
    with pytest.raises(ProviderError) as info:
        run(runtime_for(fake, tmp_path))
    assert info.value.code == "bad_response"


def test_vllm_s_unwrapped_error_chunk_is_the_error_it_reports(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    # Older vLLM sent its ErrorResponse itself as the chunk, not under `error`: before,
    # a wrong-shaped chunk, and the provider's words were lost.
    vllm_error = {"object": "error", "message": "CUDA out of memory", "type": "InternalServerError"}
    fake.script(reply(text("Half"), raw({**vllm_error, "param": None, "code": 500})))
    error, seen = failed_run(fake, tmp_path)
    assert error.code == "bad_response"
    assert "CUDA out of memory" in error.message
    assert content_events(seen) == [TextDelta("Half")]
