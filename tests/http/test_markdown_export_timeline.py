"""A Markdown export's answer follows its row's timeline, as the page shows it (docs/api.md
§12): each text (interim progress too), tool call, steer, approval prompt and notice where it
happened, each its own block in CommonMark viewers (markdown-it-py, cmark) and GitHub's
renderer (cmark-gfm). Layer: sessions/transfer (Markdown export); no run-state layer
changes. Real server over real HTTP, the fake OpenAI server at the model boundary, the
workspace tools for real, the demo runtime's `/approve` for an approval prompt
(tests/hermes/test_hermes_markdown_export.py: Hermes' own prompts and questions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, barrier, error, hang, reasoning, reply, text, tool_call
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

pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("The launch is on Tuesday.\n")
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
        *("--workspace", str(workspace)),
    ) as srv:
        yield srv


def test_tool_calls_are_exported_where_they_ran_between_the_texts(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """The answer's text came first and its tool calls after it, and the text written
    before a tool ran (interim progress, shown on the page) was left out: the export now
    reads text, tool call, text, as the page shows the timeline."""
    fake.script(
        reply(
            reasoning("The user wants the files."),
            text("Let me look at the workspace first."),
            tool_call("c1", "list_files", {"path": "."}),
        ),
        reply(text("There is **one** file: `notes.txt`.")),
    )
    with server.client() as client:
        sid = new_session(client, "files")
        start_turn(client, sid, "Which files are there?")
        wait_idle(client, sid)
        row, answer = exported_answer(client, sid)
    assert [item["type"] for item in row["timeline"]] == ["reasoning", "text", "tool", "text"]
    for viewer, render in VIEWERS.items():
        assert top_blocks(render(answer)) == [
            ("p", "Let me look at the workspace first.", []),
            ("p", "Tool call: list_files", []),
            ("p", "There is one file: notes.txt.", []),
        ], (viewer, answer)
        assert top_blocks(render(answer)) == as_the_page_shows(row, render), (viewer, answer)
    assert "The user wants the files." not in answer


@pytest.mark.parametrize("ending", ["stopped", "error"])
def test_a_notice_after_a_list_and_a_tool_call_is_its_own_block(
    server: ServerProcess, fake: FakeOpenAI, ending: str
) -> None:
    """A list, a tool call and the notice of how the run ended: the tool call was a list
    item that joined the answer's list, and the notice was written right under it (no
    blank line), where a viewer may read it as the item's lazy continuation. Each is now
    its own block, the notice a quote of its own holding only its text."""
    after_tool = reply(hang()) if ending == "stopped" else error(401, "bad key")
    fake.script(
        reply(
            text("Found these:\n\n- one\n- two"),
            tool_call("c1", "list_files", {"path": "."}),
        ),
        after_tool,
    )
    with server.client() as client:
        sid = new_session(client, "ended")
        start_turn(client, sid, "List them, then look.")
        if ending == "stopped":
            assert fake.wait_for_requests(2, timeout=20)
            client.post("/api/chat/cancel", json={"session_id": sid})
        wait_idle(client, sid)
        row, answer = exported_answer(client, sid)
    notice = row["timeline"][-1]
    assert [item["type"] for item in row["timeline"]] == ["text", "tool", "notice"]
    assert (notice["text"] == "Stopped.") if ending == "stopped" else ("bad key" in notice["text"])
    for viewer, render in VIEWERS.items():
        assert top_blocks(render(answer)) == [
            ("p", "Found these:", []),
            ("ul", "one two", ["one", "two"]),
            ("p", "Tool call: list_files", []),
            ("blockquote", " ".join(notice["text"].split()), []),
        ], (viewer, answer)
        assert top_blocks(render(answer)) == as_the_page_shows(row, render), (viewer, answer)


def test_texts_next_to_each_other_stay_apart_as_on_the_page(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Two texts with only reasoning between them are two blocks on the page; the export
    wrote them run together (`- b- c`, one list). Now the first text's list ends with it,
    and the second's list is a list of its own."""
    fake.script(reply(text("- a\n- b"), reasoning("And one more."), text("- c")))
    with server.client() as client:
        sid = new_session(client, "lists")
        start_turn(client, sid, "Three things?")
        wait_idle(client, sid)
        row, answer = exported_answer(client, sid)
    assert [item["type"] for item in row["timeline"]] == ["text", "reasoning", "text"]
    for viewer, render in VIEWERS.items():
        assert top_blocks(render(answer)) == [
            ("ul", "a b", ["a", "b"]),
            ("ul", "c", ["c"]),
        ], (viewer, answer)
        assert top_blocks(render(answer)) == as_the_page_shows(row, render), (viewer, answer)


# A user's steer that is Markdown and HTML in every way a viewer could read it.
HOSTILE_STEER = (
    "Use <img src=x onerror=alert(1)> and `code` ```here```\n"
    "[click](javascript:alert(1)) <https://evil.example> http://a_b\n"
    "# not a heading\n- not a list\n</p><script>alert(2)</script>"
)


def test_steers_are_exported_where_the_agent_took_them_as_the_text_they_are(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """What the user sent the running agent was left out of the export, which the page
    shows where the agent took it in ("You steered: ...") or, never taken in, at the end
    ("Not delivered (back in the composer): ..."). Each is now a paragraph there, the
    user's words shown as they were typed, line for line: no tag, link, heading or list,
    and none an item of the list the answer ends with."""
    fake.script(
        reply(
            text("Looking."),
            barrier("before-tool"),
            tool_call("c1", "list_files", {"path": "."}),
        ),
        reply(text("Nearly done:\n\n- one"), barrier("writing"), text("\n- two")),
    )
    with server.client() as client:
        sid = new_session(client, "steered")
        run = start_turn(client, sid, "Check the files")
        for at, said in (("before-tool", HOSTILE_STEER), ("writing", "too late <b>x</b>")):
            assert fake.wait_reached(at, 10)
            steer = {"stream_id": run["stream_id"], "text": said}
            assert client.post("/api/chat/steer", json=steer).json()["accepted"] is True
            fake.release(at)
        wait_idle(client, sid)
        row, answer = exported_answer(client, sid)
    assert [(i["type"], i.get("leftover")) for i in row["timeline"]] == [
        ("text", None),
        ("tool", None),
        ("steer", False),
        ("text", None),
        ("steer", True),
    ]
    assert live_html(answer) == []
    for viewer, render in VIEWERS.items():
        html = render(answer)
        assert top_blocks(html) == [
            ("p", "Looking.", []),
            ("p", "Tool call: list_files", []),
            ("p", " ".join(f"You steered: {HOSTILE_STEER}".split()), []),
            ("p", "Nearly done:", []),
            ("ul", "one two", ["one", "two"]),
            ("p", "Not delivered (back in the composer): too late <b>x</b>", []),
        ], (viewer, answer)
        assert top_blocks(html) == as_the_page_shows(row, render), (viewer, answer)
        shown, tags = shown_text(html)
        assert f"You steered: {HOSTILE_STEER}\n" in shown, (viewer, answer)
        assert tags == {"p", "code", "br", "ul", "li"}, (viewer, answer)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "demo", env={"TETHER_DEMO_DELAY": "0.002"}) as srv:
        yield srv


@pytest.mark.parametrize(
    ("choice", "outcome", "after"),
    [
        ("once", "Allowed once.", ("p", "You allowed it: the (pretend) folder is clear.", [])),
        ("deny", "Denied.", ("p", "You denied it, so I left the folder alone.", [])),
        (None, "Not answered.", ("blockquote", "Stopped.", [])),
    ],
)
def test_an_approval_prompt_is_exported_with_its_command_and_answer(
    demo: ServerProcess, choice: str | None, outcome: str, after: tuple
) -> None:
    """The demo's `/approve` asks, as Hermes does, before a command: the export left the
    question out, so the file did not say what the agent asked to run nor what the user
    chose. Now it reads as the page shows it: the question, the command as code, and the
    answer (or that none was given before Stop)."""
    with demo.client() as client:
        sid = new_session(client, "approval")
        run = start_turn(client, sid, "/approve")
        wait_until(
            lambda: any(i["type"] == "approval" for i in live_timeline(client, sid)),
            what="the question",
        )
        if choice is None:
            client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        else:
            answer = {"stream_id": run["stream_id"], "approval_id": "ap1", "choice": choice}
            assert client.post("/api/chat/approve", json=answer).json()["accepted"] is True
        wait_idle(client, sid)
        row, answer_md = exported_answer(client, sid)
    for viewer, render in VIEWERS.items():
        html = render(answer_md)
        assert top_blocks(html) == [
            ("p", "Demo: I would like to clear a scratch folder, which needs your approval.", []),
            ("p", "Tool call: terminal", []),
            ("p", "The agent asks to run this: recursive delete (demo: nothing is deleted)", []),
            ("pre", "rm -rf ./demo-scratch", []),
            ("p", outcome, []),
            after,
        ], (viewer, answer_md)
        assert top_blocks(html) == as_the_page_shows(row, render), (viewer, answer_md)
        assert code_blocks(html) == ["rm -rf ./demo-scratch"], (viewer, answer_md)
