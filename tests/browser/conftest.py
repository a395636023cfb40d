"""Headless Chromium (Debian's `chromium` package) driven by Playwright for Python."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Playwright, sync_playwright

from fake_openai import FakeOpenAI
from helpers import ServerProcess, running_server

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


# Module scope, not session: sync Playwright keeps an event loop running in the main thread,
# which would break later tests that call asyncio.run().
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium package is required (apt-get install chromium)"
    browser = playwright.chromium.launch(
        executable_path=executable, headless=True, args=CHROMIUM_ARGS
    )
    yield browser
    browser.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """One browser profile: its pages share localStorage, like two tabs."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    yield ctx
    ctx.close()


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "data", env={"TETHER_DEMO_DELAY": "0.01"}) as srv:
        yield srv


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """The model, as a real OpenAI-compatible server (tests/fake_openai/)."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def openai_web(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    """The page's server with the OpenAI runtime against `fake`."""
    with running_server(
        tmp_path / "data", "--runtime", "openai", "--base-url", fake.base_url, "--model", "fake"
    ) as srv:
        yield srv
