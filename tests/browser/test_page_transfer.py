"""The page's export and import (docs/page.md, docs/api.md §12), in headless Chromium against
the real server: Export as Markdown / JSON in a session's row menu, Export all and Import in
the sidebar, a progress indicator while an import runs, and imported HTML that stays text."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from chatgpt_kit import Conversation, many
from helpers import ServerProcess
from pagekit import open_app, send, wait_settled

pytestmark = pytest.mark.slow

EVIL = (
    '<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
    '[click me](javascript:window.__xss=3) <svg onload="window.__xss=4"></svg> **bold**'
)
EVIL_TITLE = '<img src=x onerror="window.__xss=5"><script>window.__xss=6</script>'

RECORD_STATUS_JS = """() => {
  window.__statusSeen = [];
  const text = document.getElementById("import-text");
  const bar = document.getElementById("import-progress");
  new MutationObserver(() => {
    window.__statusSeen.push([text.textContent, !bar.hidden]);
  }).observe(document.getElementById("import-status"),
             {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def hostile_export() -> bytes:
    evil = Conversation(EVIL_TITLE, 1_700_000_000, "evil")
    evil.add("user", "Question " + EVIL)
    evil.add("assistant", "Answer " + EVIL, model="gpt-4o")
    # 30 exchanges each (11 MiB, about 20,000 events): the server checks and writes for
    # a second or more, so the page's 250 ms polls see its progress. With 2 exchanges it was
    # done in the child's start-up time and a poll could miss every phase.
    return json.dumps([evil.data, *many(150, turns=30)]).encode()


def test_import_shows_progress_then_sessions_whose_html_stays_text(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    open_app(page, web_server.base_url)
    page.evaluate(RECORD_STATUS_JS)
    expect(page.get_by_role("button", name="Import…")).to_be_visible()
    page.set_input_files(
        "#import-input",
        files=[
            {
                "name": "conversations.json",
                "mimeType": "application/json",
                "buffer": hostile_export(),
            }
        ],
    )
    status = page.locator("#import-status")
    expect(status).to_have_attribute("data-state", "done", timeout=60_000)
    expect(status).to_contain_text("Imported 151 sessions")
    seen = page.evaluate("window.__statusSeen")
    assert any(text.startswith("Uploading") and bar for text, bar in seen), seen
    # the server's own progress (polled every 250 ms): at least one phase past the upload
    assert any(text.startswith(("Checking", "Writing")) and bar for text, bar in seen), seen

    row = page.locator(".session-link", has_text="window.__xss=6")
    expect(row).to_have_count(1)
    # an import is not activity (invariant 4): 151 new rows, and not one unread dot
    expect(page.locator(".session-row")).to_have_count(151, timeout=15_000)
    assert page.locator(".unread-dot:not([hidden])").count() == 0
    expect(row).to_contain_text(EVIL_TITLE)  # the title as text
    row.click()
    transcript = page.locator("#transcript")
    expect(transcript.locator(".row.user")).to_contain_text("<script>window.__xss=2</script>")
    expect(transcript.locator(".row.assistant .markdown strong")).to_have_count(
        1
    )  # Markdown renders
    _nothing_ran(page, dialogs)
    page.reload()
    expect(page.locator("#transcript .row.assistant")).to_contain_text("Answer")
    _nothing_ran(page, dialogs)


def _nothing_ran(page: Page, dialogs: list[str]) -> None:
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
    found = page.locator("#transcript, #sidebar").locator(
        "script, img[onerror], svg[onload], iframe, [onload]"
    )
    assert found.count() == 0
    hrefs = page.locator("#transcript a[href]").evaluate_all("(as) => as.map((a) => a.href)")
    assert all(h.startswith(("http:", "https:", "mailto:")) for h in hrefs), hrefs


def test_a_refused_import_says_why_and_adds_nothing(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    page.set_input_files(
        "#import-input",
        files=[{"name": "x.json", "mimeType": "application/json", "buffer": b'{"nope": 1}'}],
    )
    status = page.locator("#import-status")
    expect(status).to_have_attribute("data-state", "failed", timeout=30_000)
    expect(status).to_contain_text("Import failed: This is neither a Tether export")
    expect(page.locator(".session-link")).to_have_count(0)


def test_row_menu_exports_markdown_and_json_and_export_all_downloads_every_session(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "export me please")
    wait_settled(page)
    page.locator(".session-row").first.hover()
    page.locator(".row-menu-btn").first.click()
    menu = page.get_by_role("menu")
    expect(menu.get_by_role("menuitem", name="Export as Markdown")).to_be_visible()
    with page.expect_download() as markdown:
        menu.get_by_role("menuitem", name="Export as Markdown").click()
    assert markdown.value.suggested_filename.endswith(".md")
    text = open(markdown.value.path(), encoding="utf-8").read()  # noqa: PTH123, SIM115
    assert "## User" in text and "export me please" in text

    page.locator(".session-row").first.hover()
    page.locator(".row-menu-btn").first.click()
    with page.expect_download() as as_json:
        page.get_by_role("menuitem", name="Export as JSON").click()
    assert as_json.value.suggested_filename.endswith(".json")
    with open(as_json.value.path(), encoding="utf-8") as handle:  # noqa: PTH123
        assert json.load(handle)["format"] == "tether.session"

    with page.expect_download() as everything:
        page.get_by_role("link", name="Export all").click()
    assert everything.value.suggested_filename == "tether-sessions.jsonl"
    with open(everything.value.path(), encoding="utf-8") as handle:  # noqa: PTH123
        lines = handle.read().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["format"] == "tether.session"
