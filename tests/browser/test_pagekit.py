"""The browser tests' own kit keeps its word: a wait that returns early makes every test
built on it flaky (tests/browser/pagekit.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import BrowserContext

from helpers import ServerProcess
from pagekit import open_app, send, wait_settled

pytestmark = pytest.mark.slow

SLOW_START_JS = """(() => {
  const fetch = window.fetch.bind(window);
  window.fetch = async (url, init) => {
    if (String(url).endsWith("/api/chat/start")) await new Promise((r) => setTimeout(r, 300));
    return fetch(url, init);
  };
})()"""


def test_send_returns_once_the_page_shows_the_message(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Otherwise `wait_settled` after a second message sees the first one's settled page.
    The page's requests to start a turn leave 0.3 s late here, as on a slow link."""
    page = context.new_page()
    page.add_init_script(SLOW_START_JS)
    open_app(page, web_server.base_url)
    send(page, "one")
    wait_settled(page)
    send(page, "two")
    users = page.locator("#transcript .rows > .row.user .user-text")
    assert users.all_text_contents() == ["one", "two"]
