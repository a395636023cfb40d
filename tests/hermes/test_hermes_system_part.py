"""The sidecar's reading of Hermes' own part of a system message (sidecar_system_prompt.py),
which the context view shows before the session's prompt (invariant 1): Hermes composes
`(own + "\\n\\n" + ephemeral).strip()`, and composing the part read back with the same
ephemeral must give the message sent, exactly."""

from __future__ import annotations

import pytest

from tether.projections.context import agent_system_message
from tether.runtimes.hermes.sidecar_system_prompt import SystemPrompt, own_system_part


@pytest.mark.parametrize(
    ("own", "ephemeral"),
    [
        ("You are Hermes.", "Answer in haiku."),
        ("You are Hermes.\n", "  Answer in haiku.\n\n"),
        ("  You are Hermes.", None),
        ("", "Answer in haiku."),
        ("You are Hermes.\n\nAnswer in haiku.", "Answer in haiku."),
    ],
)
def test_the_part_read_back_composes_to_the_message_sent(own: str, ephemeral: str | None) -> None:
    sent = (own + "\n\n" + ephemeral).strip() if ephemeral else own
    part = own_system_part(sent, ephemeral)
    assert part is not None
    assert agent_system_message(part, ephemeral) == sent


def test_a_message_not_so_composed_is_not_read() -> None:
    assert own_system_part("You are Hermes.", "Answer in haiku.") is None
    assert own_system_part("You are Hermes.\n\nAnswer in prose.", "Answer in haiku.") is None


def test_a_part_is_reported_when_it_changes_and_only_then() -> None:
    reported: list[str] = []
    prompt = SystemPrompt(reported.append)

    def request(system: str | None) -> dict:
        head = [{"role": "system", "content": system}] if system is not None else []
        return {"messages": [*head, {"role": "user", "content": "hi"}]}

    prompt.saw_request(request("A\n\nTether's"), "Tether's")
    prompt.saw_request(request("A\n\nTether's"), "Tether's")  # the same: nothing
    prompt.saw_request(request("A"), None)  # Tether's prompt cleared: the same part
    prompt.saw_request(request("B"), None)
    prompt.saw_request({"input": "another API shape"}, None)
    prompt.saw_request(request(None), None)  # no system message at all: an empty part
    assert reported == ["A", "B", ""]


def request_with(head: dict) -> dict:
    return {"messages": [head, {"role": "user", "content": "hi"}]}


def test_a_cached_or_developer_role_system_message_is_read_too() -> None:
    """Prompt caching sends the system message as text parts marked `cache_control`, and
    gpt-5 models get it as role `developer`: the part is read from both."""
    reported: list[str] = []
    prompt = SystemPrompt(reported.append)
    cached = [
        {"type": "text", "text": "A\n\n", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Tether's"},
    ]
    prompt.saw_request(request_with({"role": "system", "content": cached}), "Tether's")
    prompt.saw_request(request_with({"role": "developer", "content": "B\n\nTether's"}), "Tether's")
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
    prompt.saw_request(request_with({"role": "system", "content": image}), None)  # not text
    assert reported == ["A", "B"]


def test_each_turn_reports_the_part_again() -> None:
    """The last report may never have reached the log (a Stop before Tether recorded it, a
    run of another runtime since): a turn's first request reports the part again, and
    Tether keeps only a change (streaming.py)."""
    reported: list[str] = []
    prompt = SystemPrompt(reported.append)
    sent = request_with({"role": "system", "content": "A"})
    prompt.saw_request(sent, None)
    prompt.saw_request(sent, None)
    prompt.new_turn()
    prompt.saw_request(sent, None)
    assert reported == ["A", "A"]
