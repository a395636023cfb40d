"""Message search in the page (issue 16.6): Ctrl+K or "/" opens a search dialog, results show
snippets with the match marked (built as text and <mark> elements, so markup a user or a
model wrote stays text: XSS-proof), and choosing one opens its session at that row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, running_server, session_body, start_turn, wait_idle
from pagekit import open_app

pytestmark = pytest.mark.slow

HOSTILE = 'porcupine <img src=x onerror="window.pwned=1"> <script>window.pwned=2</script>'


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


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
    expect(row).to_have_class("row assistant search-hit")
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
