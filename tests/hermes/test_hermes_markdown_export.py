"""Hermes' approval prompts and clarify questions in a session's Markdown export (docs/api.md
§12): each where it happened in the answer's timeline, as the page shows it, and what the
model wrote in them (the command, the question, its choices) and what the user answered
stay text in CommonMark viewers (markdown-it-py, cmark) and GitHub's renderer (cmark-gfm):
no tag, link, heading or list of theirs, and the command's code block closes where it ends.
Layer: sessions/transfer (Markdown export); no run-state layer changes. End to end: `tether
serve --runtime hermes` with the real hermes-agent's terminal and clarify tools, the fake
OpenAI server at the model boundary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import (
    ServerProcess,
    live_timeline,
    new_session,
    running_server,
    start_turn,
    wait_idle,
    wait_until,
)
from markdown_kit import (
    VIEWERS,
    as_the_page_shows,
    code_blocks,
    exported_answer,
    live_html,
    shown_text,
    top_blocks,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# What the model asks and runs, and what the user answers: Markdown and HTML in every way a
# viewer could read them, the command with a fence of its own and a closing one.
QUESTION = "Which <b>colour</b>? `x` [y](javascript:alert(1))\n# big"
CHOICES = ["<i>red</i>", "blue | `x` *y*"]
ANSWER = "green <script>alert(1)</script> [z](javascript:1) `q`"
COMMAND = (
    'rm -r "<img src=x onerror=alert(1)>" \\\n'
    "  ```` [x](javascript:alert(1)) <b>bold</b>\n"
    "```\n"
    "</code></pre><script>alert(3)</script>"
)


@pytest.fixture
def server(
    tmp_path: Path, hermes_flags: list[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[ServerProcess]:
    monkeypatch.setenv("TETHER_HERMES_TOOLSETS", "terminal,clarify")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with running_server(tmp_path / "data", *hermes_flags, "--workspace", str(workspace)) as srv:
        yield srv


def asked(client: httpx.Client, sid: str, kind: str) -> dict[str, Any]:
    """The live scene's first `kind` item, once the agent has asked."""
    return wait_until(
        lambda: next((i for i in live_timeline(client, sid) if i["type"] == kind), None),
        90,
        f"the agent's {kind}",
    )


def test_a_question_and_an_approval_prompt_are_exported_as_the_text_they_are(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """The export left out what the agent asked and what the user answered. Now the
    question, its choices and the answer, then the command asked about and the answer
    chosen, are written where they happened, as the page words them."""
    fake.script(
        reply(
            text("Let me ask."),
            tool_call("call_1", "clarify", {"question": QUESTION, "choices": CHOICES}),
        ),
        reply(tool_call("call_2", "terminal", {"command": COMMAND})),
        reply(text("ESCALATE")),  # Hermes' smart approval asks its model first
        reply(text("I left it alone.")),
    )
    with server.client() as client:
        sid = new_session(client, "asked")
        run = start_turn(client, sid, "tidy up")
        question = asked(client, sid, "clarify")
        said = {
            "stream_id": run["stream_id"],
            "question_id": question["question_id"],
            "text": ANSWER,
        }
        assert client.post("/api/chat/answer", json=said).json()["accepted"] is True
        approval = asked(client, sid, "approval")
        assert approval["command"] == COMMAND
        deny = {
            "stream_id": run["stream_id"],
            "approval_id": approval["approval_id"],
            "choice": "deny",
        }
        assert client.post("/api/chat/approve", json=deny).json()["accepted"] is True
        wait_idle(client, sid, timeout=90)
        row, answer = exported_answer(client, sid)
    assert [i["type"] for i in row["timeline"]] == [
        "text",
        "tool",
        "clarify",
        "tool",
        "approval",
        "text",
    ]
    clarify = row["timeline"][2]
    assert (clarify["question"], clarify["choices"], clarify["text"]) == (QUESTION, CHOICES, ANSWER)
    description = " ".join(row["timeline"][4]["description"].split())
    assert live_html(answer) == []
    for viewer, render in VIEWERS.items():
        html = render(answer)
        assert top_blocks(html) == [
            ("p", "Let me ask.", []),
            ("p", "Tool call: clarify", []),
            ("p", " ".join(f"The agent asks: {QUESTION}".split()), []),
            ("p", "Choices: <i>red</i> · blue | `x` *y*", []),
            ("p", f"You answered: {ANSWER}", []),
            ("p", "Tool call: terminal", []),
            ("p", f"The agent asks to run this: {description}", []),
            ("pre", " ".join(COMMAND.split()), []),
            ("p", "Denied.", []),
            ("p", "I left it alone.", []),
        ], (viewer, answer)
        assert top_blocks(html) == as_the_page_shows(row, render), (viewer, answer)
        assert code_blocks(html) == [COMMAND], (viewer, answer)
        assert shown_text(html)[1] == {"p", "code", "pre", "strong"}, (viewer, answer)
