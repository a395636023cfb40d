"""The page's question cards for the real hermes-agent (`tether serve --runtime hermes`),
in headless Chromium: layers live UI scene -> `POST /api/chat/approve` -> the runtime, and
the visible transcript in a second tab."""

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
    tmp_path: Path, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path, workspace: Path
) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        "--runtime",
        "hermes",
        "--hermes-python",
        str(hermes_python),
        "--base-url",
        fake.base_url,
        "--model",
        fake.model,
        "--api-key-env",
        "TETHER_TEST_HERMES_KEY",
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
