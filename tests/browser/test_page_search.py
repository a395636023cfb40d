"""Message search in the page (issue 16.6): Ctrl+K or "/" opens a search dialog, results show
snippets with the match marked (built as text and <mark> elements, so markup a user or a
model wrote stays text: XSS-proof), and choosing one opens its session at that row."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from chatgpt_kit import Conversation
from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, running_server, session_body, start_turn, wait_idle
from pagekit import open_app

pytestmark = pytest.mark.slow

HOSTILE = 'porcupine <img src=x onerror="window.pwned=1"> <script>window.pwned=2</script>'


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
    ) as srv:
        yield srv


def test_search_finds_marks_and_opens_the_row(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    long_answer = "\n\n".join(f"Paragraph {n} about nothing in particular." for n in range(40))
    fake.script(
        *(reply(text(long_answer)) for _ in range(3)),
        reply(text("The porcupine has quills. " + HOSTILE)),
    )
    with server.client() as client:
        target = new_session(client, "Animals")
        for message in ("first question", "second question", "third question", "tell me"):
            start_turn(client, target, message)
            wait_idle(client, target)
        answer_id = session_body(client, target)["messages"][-1]["id"]
        other = new_session(client, "Elsewhere")
        start_turn(client, other, "nothing to see")
        wait_idle(client, other)

    page = context.new_page()
    open_app(page, server.base_url, f"/s/{other}")
    page.keyboard.press("Control+k")
    dialog = page.get_by_role("dialog", name="Search messages")
    expect(dialog).to_be_visible()
    box = dialog.get_by_role("searchbox", name="Search messages")
    expect(box).to_be_focused()
    box.fill("porcu")
    results = dialog.get_by_role("list", name="Search results").get_by_role("button")
    expect(results).to_have_count(1)
    result = results.first
    expect(result).to_contain_text("Animals")
    expect(result).to_contain_text("Assistant")
    # the match is marked; the markup in the text is shown as text, never run
    expect(result.locator("mark").first).to_have_text("porcupine")
    expect(result).to_contain_text("<img src=x")
    assert result.locator("img, script").count() == 0
    assert page.evaluate("window.pwned") is None
    from test_page_a11y import axe_violations  # the suite's axe-core runner

    assert axe_violations(page) == []  # the marked snippets keep AA contrast too

    result.click()
    expect(dialog).to_be_hidden()
    page.wait_for_url(f"**/s/{target}")
    row = page.locator(f'#transcript .rows > [data-key="{answer_id}"]')
    expect(row).to_have_class(re.compile(r"\bsearch-hit\b"))
    expect(row).to_be_in_viewport()
    expect(row).to_be_focused()
    assert page.evaluate("window.pwned") is None

    # "/" outside a text field opens it too; Escape closes it; nothing found says so
    page.locator("#session-title").click()
    page.keyboard.press("/")
    expect(dialog).to_be_visible()
    box.fill("zebra")
    expect(dialog.get_by_role("status")).to_have_text("No messages match.")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    # typing "/" in the composer is text, not a shortcut
    composer = page.get_by_role("textbox", name="Message")
    composer.click()
    page.keyboard.type("a/b")
    expect(composer).to_have_value("a/b")
    expect(dialog).to_be_hidden()


def test_the_search_button_works_by_keyboard_and_a_bad_query_says_why(
    context: BrowserContext, server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, server.base_url)
    button = page.get_by_role("button", name="Search messages")
    button.focus()
    page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="Search messages")
    expect(dialog).to_be_visible()
    dialog.get_by_role("searchbox", name="Search messages").fill('"*()')
    expect(dialog.get_by_role("status")).to_contain_text("no words")


def test_a_row_of_a_hidden_branch_is_marked_and_choosing_it_shows_its_branch(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Nothing of any branch is lost from search, and what the user sees is what they get:
    an answer hidden two forks deep (regenerated, then its message edited) is found, marked
    "in another branch", and choosing it shows its branch (both forks switched)."""
    fake.script(
        reply(text("first armadillo answer")),
        reply(text("second armadillo answer")),
        reply(text("third armadillo answer")),
    )
    with server.client() as client:
        sid = new_session(client, "Branched")
        start_turn(client, sid, "the first armadillo")
        wait_idle(client, sid)
        first, answer = session_body(client, sid)["messages"]
        client.post("/api/chat/regenerate", json={"session_id": sid}).raise_for_status()
        wait_idle(client, sid)
        start_turn(client, sid, "the edited armadillo", edit_of=first["id"])
        wait_idle(client, sid)
        other = new_session(client, "Elsewhere")

    page = context.new_page()
    open_app(page, server.base_url, f"/s/{other}")
    page.keyboard.press("Control+k")
    dialog = page.get_by_role("dialog", name="Search messages")
    dialog.get_by_role("searchbox", name="Search messages").fill("armadillo")
    results = dialog.get_by_role("list", name="Search results").get_by_role("button")
    expect(results).to_have_count(5)
    expect(results.filter(has_text="in another branch")).to_have_count(3)
    expect(results.filter(has_text="the edited armadillo")).not_to_contain_text("another branch")
    hidden = results.filter(has_text="first armadillo answer")
    expect(hidden).to_contain_text("in another branch")
    hidden.click()
    expect(dialog).to_be_hidden()
    page.wait_for_url(f"**/s/{sid}")
    row = page.locator(f'#transcript .rows > [data-key="{answer["id"]}"]')
    expect(row).to_have_class(re.compile(r"\bsearch-hit\b"))
    expect(row).to_be_focused()
    expect(page.locator("#transcript")).not_to_contain_text("the edited armadillo")
    with server.client() as client:  # the server shows that branch too (branch.switched)
        shown = [m["content"] for m in session_body(client, sid)["messages"]]
    assert shown == ["the first armadillo", "first armadillo answer"]


def test_a_row_no_switch_can_show_says_it_is_on_another_branch(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    """An undo to nothing leaves the first fork showing no row: no switch can name it, so
    choosing the hidden message opens its session and says where it is."""
    fake.script(reply(text("an answer about it")))
    with server.client() as client:
        sid = new_session(client, "Undone")
        start_turn(client, sid, "the pangolin")
        wait_idle(client, sid)
        undo = {"session_id": sid, "keep_count": 0}
        client.post("/api/session/truncate", json=undo).raise_for_status()
        other = new_session(client, "Elsewhere")

    page = context.new_page()
    open_app(page, server.base_url, f"/s/{other}")
    page.keyboard.press("Control+k")
    dialog = page.get_by_role("dialog", name="Search messages")
    dialog.get_by_role("searchbox", name="Search messages").fill("the pangolin")
    results = dialog.get_by_role("list", name="Search results").get_by_role("button")
    expect(results).to_have_count(1)
    expect(results.first).to_contain_text("in another branch")
    results.first.click()
    page.wait_for_url(f"**/s/{sid}")
    expect(page.locator("#notice-bar")).to_contain_text("on another branch of this session")


def test_a_search_with_more_matches_than_shown_does_not_claim_a_count(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The page asks for the best 30 rows: when 30 come back there may be many more, so the
    status must not say "30 matches" as if that were all of them."""
    chat = Conversation("Many ocelots", time.time() - 3600)
    for n in range(20):
        chat.add("user", f"ocelot question {n}", step=1)
        chat.add("assistant", f"ocelot answer {n}", step=1)
    few = Conversation("Few lynxes", time.time() - 3600)
    few.add("user", "one lynx", step=1)
    with server.client() as client:
        imported = client.post("/api/sessions/import", content=json.dumps([chat.data, few.data]))
        assert imported.status_code == 201, imported.text

    page = context.new_page()
    open_app(page, server.base_url)
    page.keyboard.press("Control+k")
    dialog = page.get_by_role("dialog", name="Search messages")
    box = dialog.get_by_role("searchbox", name="Search messages")
    results = dialog.get_by_role("list", name="Search results").get_by_role("button")
    box.fill("ocelot")
    expect(results).to_have_count(30)
    expect(dialog.get_by_role("status")).to_have_text("The 30 best matches; more words narrow it.")
    box.fill("lynx")
    expect(results).to_have_count(1)
    expect(dialog.get_by_role("status")).to_have_text("1 match")
