"""Counting tokens: chars/4 scaled by the provider's own count (an earlier request's
`usage.prompt_tokens`, or a server's `/tokenize`), else by a safety margin, so compression
starts before a denser tokenizer overflows the window (the fake server over real HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.runtimes import compression as comp
from tether.runtimes.base import CompressionCompleted, RuntimeEvent, TurnInput
from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

from fake_openai import FakeOpenAI, reply, text

WINDOW = 2000  # the answer's room is 250: compression starts over 0.8 x 1,750 = 1,400


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def conversation(tokens: int) -> list[dict[str, Any]]:
    """An earlier exchange and a new question, about `tokens` by chars/4."""
    half = (tokens - 20) * 2  # characters per message
    return [user("q" * half), {"role": "assistant", "content": "a" * half}, user("next?")]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(context_length=None) as server:
        yield server


def run_turns(fake: FakeOpenAI, tmp_path: Path, *turns: TurnInput) -> list[list[RuntimeEvent]]:
    rt = OpenAIRuntime(
        Settings(
            runtime="openai",
            base_url=fake.base_url,
            model="fake-model",
            data_dir=tmp_path / "d",
            context_window=WINDOW,
        )
    )
    results: list[list[RuntimeEvent]] = []

    async def main() -> None:
        try:
            for turn in turns:
                results.append([e async for e in rt.stream(turn)])
        finally:
            await rt.aclose()

    asyncio.run(main())
    return results


def compressed(events: list[RuntimeEvent]) -> bool:
    return any(isinstance(e, CompressionCompleted) for e in events)


def test_an_unmeasured_tokenizer_gets_a_safety_margin(fake: FakeOpenAI, tmp_path: Path) -> None:
    # 1,200 by chars/4 fits under 1,400; with the margin (x1.25: 1,500) it does not
    fake.script(reply(text("SUMMARY")), reply(text("ok")))
    [events] = run_turns(fake, tmp_path, TurnInput("s1", "r1", "t1", conversation(1200)))
    assert compressed(events)
    assert comp.SAFETY_SCALE == 1.25


def test_usage_of_an_earlier_request_calibrates_the_count(fake: FakeOpenAI, tmp_path: Path) -> None:
    first = [user("hello there, how are you today?")]
    estimate = comp.estimate_tokens(first)
    fake.script(
        reply(text("fine"), usage={"prompt_tokens": 2 * estimate, "completion_tokens": 1}),
        reply(text("SUMMARY")),
        reply(text("ok")),
    )
    # another session (no anchor to reuse): 800 by chars/4 is 1,000 with the margin, but
    # 1,600 at the density this server measured
    one, two = run_turns(
        fake,
        tmp_path,
        TurnInput("s1", "r1", "t1", first),
        TurnInput("s2", "r2", "t2", conversation(800)),
    )
    assert not compressed(one)
    assert compressed(two)


def test_a_lighter_tokenizer_measured_compresses_later(fake: FakeOpenAI, tmp_path: Path) -> None:
    first = [user("hello there, how are you today?")]
    estimate = comp.estimate_tokens(first)
    fake.script(reply(text("fine"), usage={"prompt_tokens": estimate, "completion_tokens": 1}))
    # 1,200 by chars/4: over 1,400 with the margin, under it at the measured 1.0
    _, two = run_turns(
        fake,
        tmp_path,
        TurnInput("s1", "r1", "t1", first),
        TurnInput("s2", "r2", "t2", conversation(1200)),
    )
    assert not compressed(two)


@pytest.mark.parametrize("answer", ["llama.cpp", "vllm"])
def test_a_servers_tokenize_measures_before_the_first_request(
    fake: FakeOpenAI, tmp_path: Path, answer: str
) -> None:
    messages = conversation(800)
    sample = "\n".join(m["content"] for m in messages)
    count = 2 * comp.estimate_text_tokens(sample)
    fake.routes[("POST", "/tokenize")] = (
        {"tokens": list(range(count))} if answer == "llama.cpp" else {"count": count}
    )
    fake.script(reply(text("SUMMARY")), reply(text("ok")))
    [events] = run_turns(fake, tmp_path, TurnInput("s1", "r1", "t1", messages))
    assert compressed(events)  # 800 x 2.0 passes 1,400; x 1.25 would not
    [(method, path, body)] = fake.hits
    assert (method, path) == ("POST", "/tokenize")
    assert body["content"] == sample and body["prompt"] == sample and body["model"]


def test_measured_scale_is_bounded() -> None:
    assert comp.measured_scale(300, 6) == comp.SCALE_BOUNDS[1]
    assert comp.measured_scale(1, 100) == comp.SCALE_BOUNDS[0]
    assert comp.measured_scale(0, 10) is None
    assert comp.measured_scale(123, 100) == 1.23
