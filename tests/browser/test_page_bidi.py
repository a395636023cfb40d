"""Untrusted one-line names in the real page (Chromium): a session title is shown as the
server cleaned it (docs/api.md §3), and every name the page draws is isolated (`dir="auto"`,
`<bdi>`), so a bidi control that still reaches the page (a row an older Tether replica
serves, stored before titles were cleaned) cannot reorder the text around it, and a title
in a right-to-left script is laid out right to left without moving its row's time.
Layer: the page's sidebar and dialogs; the sidebar row fold gives the title (contract
invariant 5: folded from the log, the same on every replay)."""

from __future__ import annotations

import json

from names_kit import LEGITIMATE
from playwright.sync_api import BrowserContext, Page, Route, expect

from helpers import ServerProcess, new_session, start_turn, wait_idle
from pagekit import open_app

HOSTILE = "\u202eevil\u200b title"
SHOWN = "evil title"
HEBREW = LEGITIMATE["hebrew"]

# Where each part of a row is drawn: the name's and the time's boxes, and the name's
# resolved direction.
ROW_JS = """(title) => {
  const row = [...document.querySelectorAll('.session-row')]
    .find((r) => r.querySelector('.session-name').textContent === title);
  if (!row) return null;
  const name = row.querySelector('.session-name');
  const when = row.querySelector('.session-when');
  const n = name.getBoundingClientRect(), w = when.getBoundingClientRect();
  return {nameLeft: n.left, nameRight: n.right, whenLeft: w.left, whenText: when.textContent,
          direction: getComputedStyle(name).direction,
          bidi: getComputedStyle(name).unicodeBidi};
}"""

# Where a piece of a text node is drawn, left edge, by its own text.
LEFT_OF_JS = """([selector, piece]) => {
  const box = document.querySelector(selector);
  const walker = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const at = node.data.indexOf(piece);
    if (at < 0) continue;
    const range = document.createRange();
    range.setStart(node, at);
    range.setEnd(node, at + piece.length);
    return Math.min(...[...range.getClientRects()].map((r) => r.left));
  }
  return null;
}"""


def row_layout(page: Page, title: str) -> dict:
    page.wait_for_function(f"() => ({ROW_JS})({json.dumps(title)}) !== null")
    return page.evaluate(ROW_JS, title)


def test_the_sidebar_shows_the_cleaned_title_isolated_and_its_time_after_it(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    with web_server.client() as client:
        hostile = new_session(client)
        start_turn(client, hostile, HOSTILE)
        wait_idle(client, hostile)
        new_session(client, HEBREW)
    page = context.new_page()
    open_app(page, web_server.base_url)
    names = page.locator(".session-name")
    expect(names).to_have_count(2)
    assert sorted(names.all_text_contents()) == sorted([SHOWN, HEBREW])

    for title, direction in ((SHOWN, "ltr"), (HEBREW, "rtl")):
        row = row_layout(page, title)
        assert row["whenText"], row
        assert row["nameRight"] <= row["whenLeft"], (title, row)  # the time stays after it
        assert (row["direction"], row["bidi"]) == (direction, "isolate"), (title, row)


def _as_an_older_server(route: Route) -> None:
    """The session list as a replica running a Tether from before titles were cleaned
    serves it: every title with a bidi override in front."""
    body = route.fetch().json()
    for row in body["sessions"]:
        row["title"] = "\u202e" + row["title"]
    route.fulfill(json=body)


def test_a_bidi_override_that_reaches_the_page_reorders_nothing_around_it(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """The override stays inside the title: the row's time is still drawn after the name,
    and the delete dialog's sentence reads on after the quoted title (without the
    isolation, the override turned the rest of the sentence around: "Its messages..."
    was drawn reversed, left of the title)."""
    with web_server.client() as client:
        new_session(client, "quarterly report")
    page = context.new_page()
    page.route("**/api/sessions?*", _as_an_older_server)
    page.route("**/api/sessions", _as_an_older_server)
    open_app(page, web_server.base_url)
    title = "\u202equarterly report"
    row = row_layout(page, title)
    assert row["nameRight"] <= row["whenLeft"], row

    page.locator(".session-row").first.hover()
    page.get_by_role("button", name=f"Actions for {title}").click()
    page.get_by_role("menuitem", name="Delete…").click()
    expect(page.locator("#confirm-text")).to_be_visible()
    sentence_left = page.evaluate(LEFT_OF_JS, ["#confirm-text", "Its messages"])
    title_left = page.evaluate(LEFT_OF_JS, ["#confirm-text", "quarterly"])
    delete_left = page.evaluate(LEFT_OF_JS, ["#confirm-text", "Delete"])
    assert delete_left < title_left < sentence_left, (delete_left, title_left, sentence_left)
    page.keyboard.press("Escape")
