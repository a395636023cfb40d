"""Reasoning a model writes into its content as `<think>...</think>` (Qwen3, QwQ, DeepSeek-R1
served without a reasoning parser: vLLM without --reasoning-parser, llama.cpp with
--reasoning-format none, LM Studio, older Ollama) is reasoning, not the answer: the answer's
text, and so the next model context, holds only what follows `</think>`. Before, the tags and
the thoughts were the answer's text. Mistral's content parts (`thinking`, `text`) likewise."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtimes.openai_kit import content_events, make_runtime, run

from tether.runtimes.base import AnswerFinished, ReasoningDelta, RuntimeEvent, TextDelta

from fake_openai import FakeOpenAI, raw, reply, text


def said(events: list[RuntimeEvent]) -> tuple[str, str]:
    """(reasoning, answer text) of a turn's events."""
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return thought, answer


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(["<think>Let me", " see.</think>\n\nThe answer."], id="whole-tags"),
        pytest.param(
            ["<thi", "nk>Let me see.</th", "ink>", "\n\n", "The answer."], id="tags-split"
        ),
        pytest.param(["\n", "<", "think>Let me see.<", "/think>The answer."], id="whitespace"),
        pytest.param(["<think>Let me see.", "</think>", "\n\nThe answer."], id="close-alone"),
    ],
)
def test_a_think_block_opening_the_content_is_reasoning(
    fake: FakeOpenAI, tmp_path: Path, chunks: list[str]
) -> None:
    fake.script(reply(*(text(c) for c in chunks)))
    assert said(run(make_runtime(fake.base_url, tmp_path, None))) == (
        "Let me see.",
        "The answer.",
    )


def test_a_think_tag_after_text_is_text(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("Use <think>"), text(" tags, like <think>this</think>.")))
    assert said(run(make_runtime(fake.base_url, tmp_path, None))) == (
        "",
        "Use <think> tags, like <think>this</think>.",
    )


def test_an_unclosed_think_block_cut_off_is_all_reasoning(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("<think>Still thinking about </"), finish_reason="length"))
    events = run(make_runtime(fake.base_url, tmp_path, None))
    assert said(events) == ("Still thinking about </", "")
    assert content_events(events)[-1] == AnswerFinished("length")


def test_what_only_looked_like_a_tag_s_start_is_kept(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(reply(text("<thi")), reply(text("  <"), text("b>bold</b>")))
    assert said(run(make_runtime(fake.base_url, tmp_path, None))) == ("", "<thi")
    assert said(run(make_runtime(fake.base_url, tmp_path, None))) == ("", "  <b>bold</b>")


def _parts(*parts: dict[str, object]) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": list(parts)}, "finish_reason": None}]}


def test_mistral_s_content_parts_are_reasoning_and_text(fake: FakeOpenAI, tmp_path: Path) -> None:
    # Mistral's API streams magistral's content as a list of parts, its thinking among them.
    # Before: `bad_response` at the first chunk, so these models could not answer at all.
    fake.script(
        reply(
            raw(_parts({"type": "thinking", "thinking": [{"type": "text", "text": "A greeting"}]})),
            raw(_parts({"type": "thinking", "thinking": [{"type": "text", "text": ", reply."}]})),
            raw(_parts({"type": "text", "text": "Hello"})),
            text(" there!"),
        )
    )
    events = run(make_runtime(fake.base_url, tmp_path, None))
    assert said(events) == ("A greeting, reply.", "Hello there!")
