"""Accessibility of the page (issue 15.8): axe-core (the npm package pinned in package.json)
over the main states, in both themes and at 1280x800 and 390x844, finds no serious or
critical violation; messages are labelled by speaker; Attach is a real button; Esc on a menu
returns focus to its button; the context meter is a meter. Layers: the page only."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, running_server
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
RUN_AXE = """async () => {
  const result = await axe.run(document, { resultTypes: ['violations'] });
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => ({ id: v.id, impact: v.impact,
                   nodes: v.nodes.map((n) => n.target.join(" ")).slice(0, 5),
                   summary: v.nodes[0].failureSummary }));
}"""


def axe_violations(page: Page) -> list:
    assert AXE.is_file(), "run `npm ci --no-audit --no-fund` first (axe-core)"
    # evaluated over the DevTools protocol, so the page's CSP stays on and is not loosened
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.evaluate(AXE.read_text())
    return page.evaluate(RUN_AXE)


def new_page(browser: Browser, size: str, theme: str) -> Page:
    context = browser.new_context(viewport=SIZES[size])
    context.add_init_script(f"localStorage.setItem('tether-theme', '{theme}')")
    return context.new_page()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_main_states_have_no_serious_axe_violation(
    browser: Browser, web_server: ServerProcess, size: str, theme: str
) -> None:
    page = new_page(browser, size, theme)
    base = web_server.base_url
    found = {}
    open_app(page, base)
    found["empty"] = axe_violations(page)
    send(page, "hello there")
    wait_settled(page)
    found["settled"] = axe_violations(page)
    send(page, "/slow show the tools")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    expect(page.locator(".row.live .tool-card").first).to_be_attached(timeout=20_000)
    found["running"] = axe_violations(page)
    if size == "phone":
        page.get_by_role("button", name="Sessions", exact=True).click()
        expect(page.locator("#sidebar")).to_be_in_viewport()
        found["drawer"] = axe_violations(page)
        page.keyboard.press("Escape")
    wait_settled(page)
    page.locator("details").evaluate_all("(els) => els.forEach((d) => { d.open = true; })")
    found["settled with tools"] = axe_violations(page)
    problems = [
        f"{state}: {v['impact']} {v['id']} at {v['nodes']}: {v['summary']}"
        for state, violations in found.items()
        for v in violations
    ]
    assert not problems, "\n".join(problems)
    page.context.close()


def test_speakers_attach_button_and_menu_focus(browser: Browser, web_server: ServerProcess) -> None:
    page = new_page(browser, "desktop", "light")
    open_app(page, web_server.base_url)
    send(page, "hello")
    wait_settled(page)
    expect(page.get_by_role("article", name="You")).to_have_count(1)
    expect(page.get_by_role("article", name="Assistant")).to_have_count(1)

    page.get_by_role("textbox", name="Message").focus()
    page.keyboard.press("Shift+Tab")
    attach = page.get_by_role("button", name="Attach", exact=True)
    expect(attach).to_be_focused()  # a real button, in the Tab order beside the composer
    # Enter on the button opens the hidden file input. Chromium's file chooser event
    # (CDP Page.fileChooserOpened) is known to go missing under load, so the test
    # watches the input's own click instead and then gives it the file.
    page.evaluate(
        "() => document.getElementById('file-input').addEventListener('click',"
        " (e) => { window.__chooserOpened = true; e.preventDefault(); })"
    )
    page.keyboard.press("Enter")
    page.wait_for_function("() => window.__chooserOpened === true")
    page.locator("#file-input").set_input_files(
        {"name": "a.txt", "mimeType": "text/plain", "buffer": b"hi"}
    )
    expect(page.locator("#attachment-chips")).to_contain_text("a.txt")

    sid = session_id_of(page)
    menu_button = page.locator(f'.session-row[data-key="{sid}"] .row-menu-btn')
    menu_button.click()
    expect(page.get_by_role("menuitem", name="Rename")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.get_by_role("menu")).to_have_count(0)
    expect(menu_button).to_be_focused()
    page.context.close()


RECORD_STATUS = """() => {
  window.__announced = [];
  const start = () => {
    const conn = document.getElementById('conn');
    new MutationObserver(() => window.__announced.push(conn.textContent))
      .observe(conn, { childList: true, characterData: true, subtree: true });
  };
  document.addEventListener('DOMContentLoaded', start);
}"""


def test_context_meter_is_a_meter_and_statuses_are_announced_once(
    browser: Browser, tmp_path: Path
) -> None:
    with (
        FakeOpenAI() as fake,
        running_server(
            tmp_path / "data",
            *("--runtime", "openai", "--base-url", fake.base_url, "--model", "m"),
            *("--context-window", "32768"),
        ) as server,
    ):
        fake.script(reply(text("ok"), usage={"prompt_tokens": 8000, "completion_tokens": 192}))
        page = new_page(browser, "desktop", "light")
        page.add_init_script(f"({RECORD_STATUS})()")
        open_app(page, server.base_url)
        send(page, "hi")
        wait_settled(page)
        meter = page.get_by_role("meter", name="Context used")
        expect(meter).to_have_attribute("aria-valuenow", "25")  # 8,192 of 32,768 tokens
        page.reload()
        expect(page.get_by_role("meter", name="Context used")).to_be_visible()
        announced = page.evaluate("window.__announced")
        assert announced, "the connection status was never announced"
        repeats = [a for a, b in zip(announced, announced[1:], strict=False) if a == b]
        assert repeats == []
        assert not any(ch.isdigit() for text in announced for ch in text)
        # a replay counting down changes the count beside the status, not the status (once
        # the page's own reconnect after the reload has settled: under load it ends late)
        expect(page.locator("#conn")).to_have_text("Live", timeout=20_000)
        page.evaluate("window.__announced = []")
        for missing in (3, 2, 1):
            page.evaluate(f"window.tether.setConn('replaying', {{ missing: {missing} }})")
        expect(page.locator("#conn-count")).to_have_text("1")
        assert page.evaluate("window.__announced") == ["Replaying events…"]
        page.context.close()


@pytest.mark.parametrize("motion", ["no-preference", "reduce"])
def test_nothing_pulses_for_a_person_who_asks_for_less_motion(
    browser: Browser, web_server: ServerProcess, motion: str
) -> None:
    """The running dots and a running tool's mark pulse, except with the system's "reduce
    motion" setting (WCAG 2.3.3): then they are shown still."""
    context = browser.new_context(viewport=SIZES["desktop"], reduced_motion=motion)
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "/slow show the tools")
    expect(page.locator(".row.live .tool-card.running").first).to_be_attached(timeout=20_000)
    expect(page.locator("#sidebar .running-dot:visible")).to_have_count(1)
    animated = page.evaluate(
        """() => [...new Set(document.getAnimations().map((a) => a.animationName))]"""
    )
    if motion == "reduce":
        assert animated == []
    else:
        assert animated == ["pulse"]
    page.get_by_role("button", name="Stop").click()
    wait_settled(page)
    context.close()
