"""The page on a phone (issue 15.3), 390x844: the session drawer closes with Esc, a tap on
the dimmed page and its close button, and never covers ☰, its opener; touch targets are at
least 44 px; the View control, the model picker and the composer's placeholder are
readable. Layers: the page only."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from accounts_kit import PASSWORDS, add_user
from helpers import ServerProcess, running_server
from pagekit import open_app, send, wait_settled

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}
SMALL_TARGETS_JS = """() => {
  const seen = [];
  const targets = document.querySelectorAll(
    'button, a[href], select, textarea, summary, label.toggle,' +
    'input:not([type=checkbox]):not([type=file])');
  for (const el of targets) {
    if (el.closest('.markdown') && el.matches('a')) continue;  // links inside text are exempt
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || getComputedStyle(el).visibility === 'hidden') continue;
    if (r.width < 44 || r.height < 44) {
      seen.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className} ${r.width}x${r.height}`);
    }
  }
  return seen;
}"""
FITS_JS = """(el) => {
  const style = getComputedStyle(el);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const words = el.tagName === 'SELECT' ? el.selectedOptions[0].text : el.placeholder;
  const room = el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return { words, need: ctx.measureText(words).width, room, size: parseFloat(style.fontSize) };
}"""


def phone_page(browser: Browser, base: str) -> Page:
    page = browser.new_context(viewport=PHONE, has_touch=True).new_page()
    open_app(page, base)
    return page


def covers_opener(page: Page) -> bool:
    return page.evaluate("""() => {
      const t = document.getElementById('menu-toggle').getBoundingClientRect();
      const hit = document.elementFromPoint(t.x + t.width / 2, t.y + t.height / 2);
      return hit.id !== 'menu-toggle';
    }""")


def test_the_drawer_closes_every_way_and_never_covers_its_opener(
    browser: Browser, web_server: ServerProcess
) -> None:
    page = phone_page(browser, web_server.base_url)
    send(page, "hello")
    wait_settled(page)
    toggle = page.get_by_role("button", name="Sessions", exact=True)
    drawer = page.locator("#sidebar")

    toggle.click()
    expect(drawer).to_be_in_viewport()
    assert not covers_opener(page)
    page.keyboard.press("Escape")
    expect(drawer).not_to_be_in_viewport()
    expect(toggle).to_be_focused()
    expect(toggle).to_have_attribute("aria-expanded", "false")

    toggle.click()
    expect(drawer).to_be_in_viewport()
    page.touchscreen.tap(370, 500)  # the dimmed page beside the drawer
    expect(drawer).not_to_be_in_viewport()

    toggle.click()
    page.get_by_role("button", name="Close sessions").click()
    expect(drawer).not_to_be_in_viewport()
    expect(toggle).to_be_focused()
    page.context.close()


def test_touch_targets_view_control_and_placeholder(
    browser: Browser, web_server: ServerProcess
) -> None:
    page = phone_page(browser, web_server.base_url)
    send(page, "hello")
    wait_settled(page)
    assert page.evaluate(SMALL_TARGETS_JS) == []
    page.get_by_role("button", name="Sessions", exact=True).click()
    expect(page.locator("#sidebar")).to_be_in_viewport()
    assert page.evaluate(SMALL_TARGETS_JS) == []
    page.keyboard.press("Escape")

    view = page.get_by_role("combobox", name="Display mode")
    for mode in ("worklog", "stream", "final"):
        view.select_option(mode)
        fit = view.evaluate(FITS_JS)
        assert fit["size"] >= 12 and fit["need"] <= fit["room"], fit
    placeholder = page.get_by_role("textbox", name="Message").evaluate(FITS_JS)
    assert placeholder["need"] <= placeholder["room"], placeholder
    model = page.get_by_role("combobox", name="Model").evaluate(FITS_JS)  # its row's room
    assert model["words"] == "Default (tether-demo)" and model["need"] <= model["room"], model
    page.context.close()


def test_a_long_session_title_keeps_two_lines_of_the_top_bar(
    browser: Browser, web_server: ServerProcess
) -> None:
    """Beside ☰, Live and the View control the title had two letters ("Sh…"); on a phone it
    now wraps to two lines and the theme button, also in Settings, leaves the top bar."""
    page = phone_page(browser, web_server.base_url)
    send(page, "Show me a table of three fruits and a short Python snippet")
    wait_settled(page)
    title = page.locator("#session-title")
    expect(title).to_have_text("Show me a table of three fruits and a short Python snippet")
    shown = title.evaluate("""(el) => {
      const lineHeight = parseFloat(getComputedStyle(el).lineHeight);
      const range = document.createRange();
      range.selectNodeContents(el);
      const box = el.getBoundingClientRect();
      const lines = new Set([...range.getClientRects()]
        .filter((r) => r.bottom <= box.bottom + 1).map((r) => Math.round(r.top)));
      return { width: box.width, lines: lines.size, rows: Math.round(box.height / lineHeight) };
    }""")
    assert shown["width"] >= 90 and shown["lines"] == shown["rows"] == 2, shown
    expect(page.locator("#theme-toggle")).to_be_hidden()
    page.get_by_role("button", name="Sessions", exact=True).click()
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_label("Theme", exact=True)).to_be_visible()
    page.context.close()


def test_a_running_turn_leaves_the_title_its_room(
    browser: Browser, web_server: ServerProcess
) -> None:
    """While a run goes, its "Running" badge took the title's room ("Sh…"); on a phone it
    is a dot that keeps the word as its accessible name."""
    page = phone_page(browser, web_server.base_url)
    send(page, "/slow Show me a table of three fruits and a short Python snippet")
    badge = page.get_by_text("Running", exact=True)
    expect(badge).to_be_visible()
    box = badge.bounding_box()
    assert box is not None and box["width"] <= 12, box
    width = page.locator("#session-title").evaluate("(el) => el.getBoundingClientRect().width")
    assert width >= 75, width  # it was about 20 px ("Sh…") beside the word
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.context.close()


LINES_JS = """(e) => {
  const lines = new Set();
  const texts = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  while (texts.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(texts.currentNode);
    for (const r of range.getClientRects()) if (r.width) lines.add(Math.round(r.top));
  }
  return lines.size;
}"""


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, PHONE])
def test_the_sidebars_foot_keeps_each_label_on_one_line(
    browser: Browser, web_server: ServerProcess, viewport: dict[str, int]
) -> None:
    """The foot holds the Archived toggle, what answers (the demo's badge or the model's
    name, which may be long) and Settings. The badge now has a line of its own, cut with
    an ellipsis and whole in its tooltip; it used to break "Archived" and itself over two
    lines each."""
    page = browser.new_context(viewport=viewport, has_touch=True).new_page()
    open_app(page, web_server.base_url)
    if viewport is PHONE:
        page.get_by_role("button", name="Sessions").click()
        page.wait_for_function(  # the drawer slides in
            "() => document.getElementById('sidebar').getBoundingClientRect().x >= 0"
        )
    badge = page.locator("#runtime-badge")
    expect(badge).to_have_text("Demo runtime (offline)")
    expect(badge).to_have_attribute("title", "Demo runtime (offline)")
    drawer = page.locator("#sidebar").bounding_box()
    assert drawer is not None
    for element in (badge, page.locator("label.toggle"), page.locator("#settings-btn")):
        assert element.evaluate(LINES_JS) == 1, element
        box = element.bounding_box()
        assert box is not None
        assert drawer["x"] <= box["x"] and box["x"] + box["width"] <= drawer["x"] + drawer["width"]


def test_an_answers_head_line_keeps_its_width_beside_its_controls(
    browser: Browser, web_server: ServerProcess
) -> None:
    """An answer's head holds its activity summary ("Activity: Thought · 2 tools · Done in
    1 s"), the model, Copy and its controls ("‹ 2/2 ›", Regenerate: 44 px each on a phone):
    on one line, the summary was squeezed into a column a word wide, five lines tall. It
    keeps at most two lines; the controls go under it."""
    page = phone_page(browser, web_server.base_url)
    send(page, "hello")
    wait_settled(page)
    answer = page.locator("#transcript .rows > .row.assistant").first
    answer.get_by_role("button", name="Regenerate").click()
    expect(answer.get_by_label("Branch 2 of 2")).to_be_visible()
    wait_settled(page)
    summary = answer.locator(".working")
    expect(summary).to_contain_text("Activity:")
    lines = summary.evaluate(
        """(el) => el.getBoundingClientRect().height /
                   parseFloat(getComputedStyle(el).lineHeight)"""
    )
    assert lines <= 2.05, f"the summary takes {lines:.1f} lines"
    head = answer.locator(".assistant-head").bounding_box()
    assert head is not None and head["x"] + head["width"] <= PHONE["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.evaluate(SMALL_TARGETS_JS) == []
    page.context.close()


TEXT_OFFSET_JS = """(el) => {
  // How far the label's middle sits from the button's middle, vertically, in px.
  const range = document.createRange();
  range.selectNodeContents(el);
  const text = range.getBoundingClientRect();
  const box = el.getBoundingClientRect();
  return Math.abs(text.y + text.height / 2 - (box.y + box.height / 2));
}"""


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, PHONE])
def test_the_foot_with_accounts_keeps_its_buttons_on_one_row_and_labels_centred(
    browser: Browser, tmp_path: Path, viewport: dict[str, int]
) -> None:
    """With accounts the foot holds Settings, Password and Log out: in the phone's drawer
    they wrapped one by one, Log out alone on a third line; they now stay one row, inside
    the drawer. "Export all" (a link styled as a button) had its label at the top of its
    44 px box, beside Import's centred one."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    with running_server(data, "--auth", "accounts") as srv:
        page = browser.new_context(viewport=viewport, has_touch=True).new_page()
        page.goto(srv.base_url + "/login")
        page.get_by_label("User name").fill("alice")
        page.get_by_label("Password").fill(PASSWORDS["alice"])
        page.get_by_role("button", name="Log in").click()
        expect(page.locator("#conn")).to_have_attribute("data-state", "idle")
        if viewport is PHONE:
            page.get_by_role("button", name="Sessions").click()
            page.wait_for_function(
                "() => document.getElementById('sidebar').getBoundingClientRect().x >= 0"
            )
        drawer = page.locator("#sidebar").bounding_box()
        assert drawer is not None
        tops = set()
        for name in ("Settings", "Password", "Log out"):
            button = page.get_by_role("button", name=name, exact=True)
            expect(button).to_be_visible()
            box = button.bounding_box()
            assert box is not None
            assert (
                drawer["x"] <= box["x"] and box["x"] + box["width"] <= drawer["x"] + drawer["width"]
            )
            tops.add(round(box["y"]))
        assert len(tops) == 1, f"the foot's buttons are on {len(tops)} rows"
        for control in (page.locator("#import-btn"), page.locator("#export-all")):
            assert control.evaluate(TEXT_OFFSET_JS) <= 2, control
