"""The page's question cards (approvals, clarify) for the real hermes-agent (`tether serve
--runtime hermes`), in headless Chromium: layers live UI scene -> `POST /api/chat/approve` or
`POST /api/chat/answer` -> the runtime, and the visible transcript after a reload and in a
second tab."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, expect, sync_playwright

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import ServerProcess, running_server

sys.path.insert(0, str(Path(__file__).parents[1] / "browser"))
from pagekit import open_app, send, session_id_of, wait_settled  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium package is required (apt-get install chromium)"
    with sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    yield ctx
    ctx.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "scratch").mkdir(parents=True)
    return root


@pytest.fixture
def server(
    tmp_path: Path,
    hermes_flags: list[str],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ServerProcess]:
    monkeypatch.setenv("TETHER_HERMES_TOOLSETS", "terminal,clarify")
    with running_server(
        tmp_path / "data",
        *hermes_flags,
        "--workspace",
        str(workspace),
    ) as running:
        yield running


APPROVAL_BUTTONS = ["Allow once", "Allow for this session", "Always allow", "Deny"]


def test_the_approval_card_offers_hermes_choices(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI, workspace: Path
) -> None:
    """Every answer Hermes offers is a button, in its order; "Allow for this session" is
    recorded as such and shown in both tabs."""
    fake.script(
        reply(tool_call("call_1", "terminal", {"command": "rm -r scratch"})),
        reply(text("ESCALATE")),
        reply(text("All done.")),
    )
    page = context.new_page()
    open_app(page, server.base_url)
    send(page, "clear the scratch folder")
    card = page.locator(".item.approval")
    expect(card.locator(".approval-command")).to_have_text("rm -r scratch", timeout=90_000)
    expect(card.locator(".approval-actions button")).to_have_text(APPROVAL_BUTTONS)
    second = context.new_page()
    open_app(second, server.base_url, f"/s/{session_id_of(page)}")
    expect(second.locator(".item.approval .approval-actions button")).to_have_text(APPROVAL_BUTTONS)
    page.get_by_role("button", name="Allow for this session").click()
    wait_settled(page, timeout=90_000)
    for tab in (page, second):
        expect(tab.locator(".item.approval .approval-outcome")).to_have_text(
            "Allowed for this session."
        )
        expect(tab.get_by_role("button", name="Deny")).to_have_count(0)
    assert not (workspace / "scratch").exists()


def test_a_question_card_survives_a_reload_and_is_answered_from_another_tab(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Hermes' clarify tool: the card shows the question as text (never markup) and the
    agent's choices; it is there again after a reload and in a second tab, where typed free
    text answers it; both tabs then show the answer and offer nothing more."""
    question = "Which colour? <img src=x onerror=alert(1)>"
    fake.script(
        reply(tool_call("call_1", "clarify", {"question": question, "choices": ["red", "blue"]})),
        reply(text("Green it is.")),
    )
    page = context.new_page()
    open_app(page, server.base_url)
    send(page, "make me a button")
    card = page.locator(".item.clarify")
    expect(card.locator(".clarify-text")).to_have_text(question, timeout=90_000)
    expect(card.locator("img")).to_have_count(0)
    expect(card.locator(".clarify-choices button")).to_have_text(["red", "blue"])
    page.reload()
    expect(page.locator(".item.clarify .clarify-choices button")).to_have_text(["red", "blue"])
    second = context.new_page()
    open_app(second, server.base_url, f"/s/{session_id_of(page)}")
    box = second.get_by_role("textbox", name="Your answer")
    box.fill("green")
    box.press("Enter")
    wait_settled(page, timeout=90_000)
    for tab in (page, second):
        expect(tab.locator(".item.clarify .clarify-outcome")).to_have_text("You answered: green")
        expect(tab.get_by_role("textbox", name="Your answer")).to_have_count(0)
        expect(tab.locator(".row.assistant").last).to_contain_text("Green it is.")
