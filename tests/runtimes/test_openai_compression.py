"""Automatic context compression in the OpenAI runtime, against the fake OpenAI-compatible
server over real HTTP, plus the pure counting and splitting helpers of
`runtimes.compression`."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tether.events import SUMMARY_PREFIX
from tether.runtimes import compression as comp
from tether.runtimes.base import (
    CompressionCompleted,
    CompressionStarted,
    Finished,
    ProviderError,
    RuntimeEvent,
    TextDelta,
    ToolCompleted,
    ToolStarted,
    TurnInput,
    Usage,
)
from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI, error, reply, text, tool_call


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def prior(pairs: int, chars: int) -> list[dict[str, Any]]:
    """`pairs` earlier exchanges whose messages are about `chars` characters long."""
    out: list[dict[str, Any]] = []
    for i in range(pairs):
        out.append(user(f"FACT-{i}: " + "u" * chars))
        out.append(assistant(f"ANSWER-{i}: " + "a" * chars))
    return out


def make_runtime(
    fake: FakeOpenAI, tmp_path: Path, workspace: Path | None = None, **settings: Any
) -> OpenAIRuntime:
    return OpenAIRuntime(
        Settings(
            runtime="openai",
            base_url=fake.base_url,
            model="fake-model",
            workspace=workspace,
            data_dir=tmp_path / "data",
            api_key_env="TETHER_TEST_OPENAI_KEY",
            **settings,
        )
    )


def turn(messages: list[dict[str, Any]], session: str = "s1", **kwargs: Any) -> TurnInput:
    return TurnInput(session, "st1", "t1", messages, **kwargs)


def run(
    rt: OpenAIRuntime, *turns: TurnInput, into: list[RuntimeEvent] | None = None
) -> list[list[RuntimeEvent]]:
    """Run `turns` one after the other on one runtime in one event loop."""
    results: list[list[RuntimeEvent]] = []

    async def main() -> None:
        try:
            for t in turns:
                events: list[RuntimeEvent] = [] if into is None else into
                results.append(events)
                async for event in rt.stream(t):
                    events.append(event)
        finally:
            await rt.aclose()

    asyncio.run(main())
    return results


def content(events: list[RuntimeEvent]) -> list[RuntimeEvent]:
    return [e for e in events if not isinstance(e, Usage)]


def compression_events(events: list[RuntimeEvent]) -> list[RuntimeEvent]:
    return [e for e in events if isinstance(e, CompressionStarted | CompressionCompleted)]


def assert_pass(events: list[RuntimeEvent], summary: str) -> CompressionCompleted:
    started, completed = compression_events(events)
    assert isinstance(started, CompressionStarted)
    assert isinstance(completed, CompressionCompleted)
    assert completed.pass_id == started.pass_id
    assert completed.summary == summary
    assert completed.boundary_turn_id == "t1"
    assert completed.tokens_before > completed.tokens_after > 0
    return completed


def is_summary_request(body: dict[str, Any]) -> bool:
    return not body.get("stream") and "tools" not in body


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


# ---- below the threshold ---------------------------------------------------------------------


def test_no_compression_below_the_threshold(tmp_path: Path) -> None:
    messages = [*prior(2, 200), user("and now?")]
    with FakeOpenAI() as fake:  # the model card says 32768 tokens
        fake.script(reply(text("fine")))
        [events] = run(make_runtime(fake, tmp_path), turn(messages))
        assert fake.requests_count == 1
        assert fake.requests[0]["stream"] is True
        assert fake.requests[0]["messages"] == messages
    assert content(events) == [TextDelta("fine")]


def test_no_compression_when_the_window_is_unknown(tmp_path: Path) -> None:
    # The provider does not know "other-model" (404 on /models/other-model, absent from the
    # /models list) and no --context-window is set: compression is off.
    messages = [*prior(4, 2000), user("and now?")]
    with FakeOpenAI(context_length=500) as fake:
        [events] = run(make_runtime(fake, tmp_path), turn(messages, model="other-model"))
        assert fake.requests_count == 1
        assert fake.requests[0]["messages"] == messages
    assert content(events) == [TextDelta("ok")]


# ---- level 1: the conversation before the current turn ---------------------------------------


def test_long_history_is_compressed_before_the_first_request(tmp_path: Path) -> None:
    messages = [*prior(3, 1200), user("what next?")]
    original = copy.deepcopy(messages)
    with FakeOpenAI(context_length=2000) as fake:  # the window comes from the model card
        fake.script(
            reply(text("The user wants X; files a.py and b.py; open: tests.")),
            reply(text("Next: "), text("tests.")),
        )
        [events] = run(make_runtime(fake, tmp_path), turn(messages))
        requests = fake.requests

    summary = "The user wants X; files a.py and b.py; open: tests."
    assert [type(e) for e in content(events)] == [
        CompressionStarted,
        CompressionCompleted,
        TextDelta,
        TextDelta,
    ]
    done = assert_pass(events, summary)
    assert done.tokens_before > 0.8 * 2000 > done.tokens_after

    assert len(requests) == 2
    ask = requests[0]
    assert is_summary_request(ask)
    assert ask["model"] == "fake-model"
    assert ask["messages"][0]["role"] == "system"
    assert "handoff summary" in ask["messages"][0]["content"]
    assert "not addressed to the user" in ask["messages"][0]["content"]
    assert "FACT-0" in ask["messages"][1]["content"]
    assert "ANSWER-2" in ask["messages"][1]["content"]
    assert "what next?" not in ask["messages"][1]["content"]  # the current turn is kept

    follow = requests[1]
    assert follow["stream"] is True
    assert follow["messages"] == [
        {"role": "system", "content": f"{SUMMARY_PREFIX}{summary}"},
        user("what next?"),
    ]
    assert messages == original  # only what is sent changes


def test_provider_usage_counts_the_previous_turn(tmp_path: Path) -> None:
    first = [user("hello")]
    second = [user("hello"), assistant("hi there"), user("and now?")]
    with FakeOpenAI() as fake:
        fake.script(
            reply(text("hi there"), usage={"prompt_tokens": 300, "completion_tokens": 40}),
            reply(text("SUMMARY")),
            reply(text("fine")),
        )
        _, events = run(make_runtime(fake, tmp_path, context_window=400), turn(first), turn(second))
        requests = fake.requests
    # By estimate the second request is ~20 tokens; the provider said 340 + the new message.
    done = assert_pass(events, "SUMMARY")
    assert done.tokens_before >= 340
    assert [is_summary_request(r) for r in requests] == [False, True, False]
    assert requests[2]["messages"] == [
        {"role": "system", "content": f"{SUMMARY_PREFIX}SUMMARY"},
        user("and now?"),
    ]


def test_usage_of_another_session_or_another_context_is_not_used(tmp_path: Path) -> None:
    first = [user("hello")]
    with FakeOpenAI() as fake:
        fake.script(reply(text("hi there"), usage={"prompt_tokens": 300, "completion_tokens": 40}))
        _, other_session, other_context = run(
            make_runtime(fake, tmp_path, context_window=400),
            turn(first),
            turn([*first, assistant("hi there"), user("?")], session="s2"),
            turn([user("hello!"), assistant("hi there"), user("?")]),
        )
        assert not any(is_summary_request(r) for r in fake.requests)
    assert not compression_events(other_session)
    assert not compression_events(other_context)


def test_compression_after_a_large_tool_result(tmp_path: Path, workspace: Path) -> None:
    body = "".join(f"line {i:05d} of the big file\n" for i in range(300))  # ~8,100 chars
    (workspace / "big.txt").write_text(body)
    messages = [*prior(1, 3200), user("read big.txt")]
    with FakeOpenAI() as fake:
        fake.script(
            reply(text("Reading."), tool_call("c1", "read_file", {"path": "big.txt"})),
            reply(text("SUMMARY")),
            reply(text("done")),
        )
        [events] = run(make_runtime(fake, tmp_path, workspace, context_window=4000), turn(messages))
        requests = fake.requests

    assert [type(e) for e in content(events)] == [
        TextDelta,
        ToolStarted,
        ToolCompleted,
        CompressionStarted,
        CompressionCompleted,
        TextDelta,
    ]
    assert_pass(events, "SUMMARY")
    assert [is_summary_request(r) for r in requests] == [False, True, False]
    assert requests[0]["messages"] == messages  # the first request fitted as it was
    assert "FACT-0" in requests[1]["messages"][1]["content"]
    sent = requests[2]["messages"]
    assert sent[0] == {"role": "system", "content": f"{SUMMARY_PREFIX}SUMMARY"}
    assert sent[1] == user("read big.txt")
    assert sent[2]["role"] == "assistant" and sent[2]["tool_calls"][0]["id"] == "c1"
    assert sent[3] == {"role": "tool", "tool_call_id": "c1", "content": body}
    assert len(sent) == 4


# ---- level 2: the current turn's own exchanges -----------------------------------------------


def test_second_level_summarizes_the_current_turns_earlier_exchanges(
    tmp_path: Path, workspace: Path
) -> None:
    one = "".join(f"one {i:05d} xxxxxxxxxxxxxxxxxxxxxxxxx\n" for i in range(200))  # 7,000
    two = "".join(f"two {i:05d} yyyyyyyyyyyyyyyyyyyyyyyyy\n" for i in range(200))
    (workspace / "one.txt").write_text(one)
    (workspace / "two.txt").write_text(two)
    messages = [user("compare one.txt and two.txt")]
    with FakeOpenAI() as fake:
        fake.script(
            reply(tool_call("c1", "read_file", {"path": "one.txt"})),
            reply(tool_call("c2", "read_file", {"path": "two.txt"})),
            reply(text("one.txt holds 200 'one' lines.")),
            reply(text("They differ.")),
        )
        [events] = run(make_runtime(fake, tmp_path, workspace, context_window=3000), turn(messages))
        requests = fake.requests

    work = "one.txt holds 200 'one' lines."
    assert [type(e) for e in content(events)] == [
        ToolStarted,
        ToolCompleted,
        ToolStarted,
        ToolCompleted,
        CompressionStarted,
        CompressionCompleted,
        TextDelta,
    ]
    # no turn before this one: the pass records no summary for later turns, which get this
    # turn's exchanges from the transcript; its own next request has the work summary
    assert_pass(events, "")
    assert [is_summary_request(r) for r in requests] == [False, False, True, False]
    ask = requests[2]["messages"]
    assert "current request" in ask[0]["content"]
    assert "compare one.txt and two.txt" in ask[1]["content"]
    assert "RESULT of read_file" in ask[1]["content"]
    assert "two 00000" not in ask[1]["content"]  # the latest exchange is kept, not summarized
    sent = requests[3]["messages"]
    assert sent[0] == {"role": "system", "content": f"{SUMMARY_PREFIX}{comp.WORK_LABEL}\n{work}"}
    assert sent[1] == messages[0]
    assert sent[2]["tool_calls"][0]["id"] == "c2"
    assert sent[3] == {"role": "tool", "tool_call_id": "c2", "content": two}
    assert len(sent) == 4


# ---- when nothing makes it fit ---------------------------------------------------------------


def test_compression_exhausted_sends_no_oversized_request(tmp_path: Path, workspace: Path) -> None:
    (workspace / "huge.txt").write_text("z" * 8000)
    messages = [*prior(1, 400), user("read huge.txt")]
    with FakeOpenAI() as fake:
        fake.script(
            reply(tool_call("c1", "read_file", {"path": "huge.txt"})),
            reply(text("SUMMARY")),
            reply(text("never asked")),
        )
        [events] = run(make_runtime(fake, tmp_path, workspace, context_window=1000), turn(messages))
        assert fake.requests_count == 2
        assert fake.pending == 1
        assert is_summary_request(fake.requests[1])

    assert [type(e) for e in content(events)] == [
        ToolStarted,
        ToolCompleted,
        CompressionStarted,
        CompressionCompleted,
        Finished,
    ]
    done = compression_events(events)[1]
    assert isinstance(done, CompressionCompleted) and done.tokens_after > 1000
    last = events[-1]
    assert isinstance(last, Finished) and last.state == "compression_exhausted"
    assert last.reason and "1,000" in last.reason and f"{done.tokens_after:,}" in last.reason


def test_an_oversized_first_request_is_never_sent(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        [events] = run(make_runtime(fake, tmp_path, context_window=1000), turn([user("x" * 8000)]))
        assert fake.requests_count == 0
    assert len(events) == 1
    assert isinstance(events[0], Finished) and events[0].state == "compression_exhausted"


# ---- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scripted", "code"),
    [
        (error(500, "the GPU caught fire"), "bad_response"),
        (error(400, "This model's maximum context length is 2000 tokens"), "context_overflow"),
        (reply(text("")), "bad_response"),
    ],
)
def test_a_failing_summary_request_is_a_provider_error(
    tmp_path: Path, scripted: Any, code: str
) -> None:
    seen: list[RuntimeEvent] = []
    with FakeOpenAI() as fake:
        fake.script(scripted)
        with pytest.raises(ProviderError) as info:
            run(
                make_runtime(fake, tmp_path, context_window=2000),
                turn([*prior(3, 1200), user("?")]),
                into=seen,
            )
        assert fake.requests_count == 1
    assert info.value.code == code
    assert [type(e) for e in seen] == [CompressionStarted]


# ---- summarize() -----------------------------------------------------------------------------


def test_summarize_returns_the_models_text(tmp_path: Path) -> None:
    messages = [
        user(
            [
                {"type": "text", "text": "look at this"},
                {
                    "type": "attachment",
                    "attachment_id": "a1",
                    "name": "notes.md",
                    "mime": "text/markdown",
                },
            ]
        ),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        assistant("It is a list."),
    ]
    with FakeOpenAI() as fake:
        fake.script(reply(text("<think>hmm</think>\nThe user shared notes.md.")))
        rt = make_runtime(fake, tmp_path)

        async def main() -> str:
            try:
                return await rt.summarize(messages, None)
            finally:
                await rt.aclose()

        assert asyncio.run(main()) == "The user shared notes.md."
        [body] = fake.requests
    assert is_summary_request(body) and body["model"] == "fake-model"
    transcript = body["messages"][1]["content"]
    assert "look at this" in transcript
    assert "[attached file notes.md (text/markdown)]" in transcript
    assert "list_files" in transcript and "It is a list." in transcript


def summary_refusal(tmp_path: Path, scripted: Any) -> ProviderError:
    """The provider's error a summary request answered by `scripted` ends in."""
    with FakeOpenAI() as fake:
        fake.script(scripted)
        rt = make_runtime(fake, tmp_path)

        async def main() -> str:
            try:
                return await rt.summarize([user("hi")], "fake-model")
            finally:
                await rt.aclose()

        with pytest.raises(ProviderError) as info:
            asyncio.run(main())
    return info.value


def test_summarize_maps_errors(tmp_path: Path) -> None:
    assert summary_refusal(tmp_path, error(429, "slow down")).code == "rate_limit"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"error": {"message": "Upstream provider overloaded", "code": 502}}, "bad_response"),
        (
            {"error": {"message": "This model's maximum context length is 8192 tokens"}},
            "context_overflow",
        ),
        ({"object": "error", "message": "CUDA out of memory", "code": 500}, "bad_response"),
    ],
    ids=["openrouter", "overflow", "vllm-object"],
)
def test_a_summary_answered_200_with_an_error_says_the_provider_s_words(
    tmp_path: Path, body: dict[str, Any], code: str
) -> None:
    # OpenRouter and gateways answer a failed non-streamed request with a 200 whose body is an
    # error. Before: "returned an empty summary", the provider's words lost.
    refusal = summary_refusal(tmp_path, error(200, body))
    assert refusal.code == code
    message = body.get("error", body)["message"]
    assert message in refusal.message


# ---- the pure helpers ------------------------------------------------------------------------


def test_estimates() -> None:
    assert comp.estimate_text_tokens("") == 0
    assert comp.estimate_text_tokens("abcd") == 1
    assert comp.estimate_text_tokens("abcde") == 2
    overhead = comp.MESSAGE_OVERHEAD_TOKENS
    assert comp.estimate_message_tokens(user("a" * 400)) == overhead + 100
    assert (
        comp.estimate_message_tokens(
            user(
                [
                    {"type": "text", "text": "a" * 40},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + "A" * 99999},
                    },
                ]
            )
        )
        == overhead + 10 + comp.IMAGE_TOKENS
    )
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read", "arguments": json.dumps({"path": "x" * 30})},
            }
        ],
    }
    assert comp.estimate_message_tokens(call) == overhead * 2 + comp.estimate_text_tokens(
        "read" + json.dumps({"path": "x" * 30})
    )
    assert comp.estimate_tools_tokens(None) == 0
    assert comp.estimate_tools_tokens([{"x": "y" * 100}]) > 25


def test_request_tokens_prefers_the_provider_count() -> None:
    messages = [user("a" * 40), assistant("b" * 40), user("c" * 40)]
    estimate = comp.estimate_tokens(messages)
    assert comp.request_tokens(messages, tools_tokens=7) == estimate + 7
    anchored = comp.request_tokens(messages, tools_tokens=7, anchor=comp.Anchor(2, 500))
    assert anchored == 500 + comp.estimate_message_tokens(messages[2])
    stale = comp.request_tokens(messages, tools_tokens=7, anchor=comp.Anchor(9, 500))
    assert stale == estimate + 7


def test_usage_anchor_and_reasoning() -> None:
    ctx = comp.WorkingContext([user("hi")], tools_tokens=50)
    answer = assistant("x" * 400)
    ctx.messages.append(answer)
    ctx.note_usage(1000, 2000, answer, reasoning=True)  # 2000 includes unsent reasoning
    assert ctx.anchor == comp.Anchor(2, 1000 + comp.estimate_message_tokens(answer))
    ctx.note_usage(1000, 120, answer)
    assert ctx.anchor == comp.Anchor(2, 1120)
    ctx.messages.append({"role": "tool", "tool_call_id": "c", "content": "y" * 40})
    assert ctx.size() == 1120 + comp.MESSAGE_OVERHEAD_TOKENS + 10
    ctx.note_usage(0, 0, None)  # a provider reporting zeros changes nothing
    assert ctx.anchor == comp.Anchor(2, 1120)

    snapshot = ctx.snapshot()
    later = comp.WorkingContext([user("hi"), answer, user("more")])
    later.adopt(snapshot)
    assert later.anchor == comp.Anchor(2, 1120)
    changed = comp.WorkingContext([user("hi!"), answer, user("more")])
    changed.adopt(snapshot)
    assert changed.anchor is None


def test_levels_split_at_the_current_turn() -> None:
    history = prior(2, 10)
    current = user("now")
    call1 = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        ],
    }
    result1 = {"role": "tool", "tool_call_id": "c1", "content": "r1"}
    call2 = {**call1, "tool_calls": [{**call1["tool_calls"][0], "id": "c2"}]}
    result2 = {"role": "tool", "tool_call_id": "c2", "content": "r2"}
    messages = [*history, current, call1, result1, call2, result2]
    original = copy.deepcopy(messages)
    ctx = comp.WorkingContext(messages)
    assert ctx.user_index == 4
    assert ctx.level2_messages() is None  # level 1 comes first
    assert ctx.level1_messages() == history
    ctx.apply_level1("S1")
    assert ctx.messages == [comp.summary_message("S1"), current, call1, result1, call2, result2]
    assert ctx.level1_messages() is None
    assert ctx.level2_messages() == [current, call1, result1]
    ctx.apply_level2("S2")
    assert ctx.summary == f"S1\n\n{comp.WORK_LABEL}\nS2"
    assert ctx.messages == [comp.summary_message(ctx.summary), current, call2, result2]
    assert ctx.level2_messages() is None  # only the latest exchange is left
    assert messages == original

    steered = comp.WorkingContext([user("first"), assistant("a"), user("steer")])
    assert steered.user_index == 2  # the last user message when the turn starts
    assert comp.WorkingContext([]).level1_messages() is None


def test_summary_request_is_plain_text_and_fits_the_window() -> None:
    messages = [
        user("start " + "u" * 50_000),
        assistant("end " + "a" * 50_000),
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]},
    ]
    request = comp.summary_request(messages, window=4000)
    assert [m["role"] for m in request] == ["system", "user"]
    body = request[1]["content"]
    assert comp.estimate_text_tokens(body) < 4000
    assert "USER:\nstart" in body and "ASSISTANT:\nend" in body and "[image]" in body
    assert "characters omitted" in body
    assert (
        "EARLIER SUMMARY:\nold"
        in comp.summary_request([user("q")], work=True, previous="old")[1]["content"]
    )


def test_clip_blocks_shares_the_budget() -> None:
    blocks = ["a" * 100, "b" * 10_000, "c" * 5_000]
    clipped = comp.clip_blocks(blocks, 3000)
    assert clipped[0] == blocks[0]
    assert clipped[1].startswith("b") and clipped[1].endswith("b")
    assert sum(len(b) for b in clipped) < 3200
    assert comp.clip_blocks(blocks, 20_000) == blocks


def test_clean_summary() -> None:
    assert comp.clean_summary("<think>\nplan\n</think>\n\nThe gist.") == "The gist."
    assert comp.clean_summary(None) == ""
    assert comp.clean_summary("  plain  ") == "plain"


def test_the_system_prompt_stays_first_and_is_never_summarized(tmp_path: Path) -> None:
    """Issue 16.2: a session's system prompt opens every request, a compressed one too, and
    never goes into what is summarized (it is a fixed part of each request)."""
    prompt = {"role": "system", "content": "PROMPT: be brief."}
    messages = [prompt, *prior(3, 1200), user("what next?")]
    with FakeOpenAI(context_length=2000) as fake:
        fake.script(reply(text("SUMMARY")), reply(text("ok")))
        [events] = run(
            make_runtime(fake, tmp_path), turn(messages, system_prompt=prompt["content"])
        )
        ask, follow = fake.requests
    assert_pass(events, "SUMMARY")
    assert is_summary_request(ask)
    assert "PROMPT" not in json.dumps(ask["messages"])
    assert follow["messages"] == [
        prompt,
        {"role": "system", "content": f"{SUMMARY_PREFIX}SUMMARY"},
        user("what next?"),
    ]
