"""A Markdown export's answer follows its row's timeline, as the page shows it (docs/api.md
§12): each text (interim progress too), tool call and notice where it happened, each its own
block in CommonMark viewers (markdown-it-py, cmark) and GitHub's renderer (cmark-gfm).
Layer: sessions/transfer (Markdown export); no run-state layer changes. Real server over
real HTTP, the fake OpenAI server at the model boundary, the workspace tools for real."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, error, hang, reasoning, reply, text, tool_call
from helpers import (
    ServerProcess,
    new_session,
    running_server,
    start_turn,
    wait_idle,
)
from markdown_kit import VIEWERS, as_the_page_shows, exported_answer, top_blocks

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
