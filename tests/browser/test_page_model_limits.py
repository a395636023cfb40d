"""The model's limits in the page: an answer cut off at the token limit (`finish_reason:
"length"`) says so and offers Continue under the latest row only (Continue sends a new turn
asking for the rest); the context meter shows a window the server found after the page
loaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, running_server
from pagekit import open_app, send, wait_settled

pytestmark = pytest.mark.slow


@pytest.fixture
def openai_web(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data", "--runtime", "openai", "--base-url", fake.base_url, "--model", "m"
    ) as srv:
        yield srv


def test_a_cut_off_answer_offers_continue_which_asks_for_the_rest(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(text("The first half of a long"), finish_reason="length"),
        reply(text(" answer, now complete.")),
    )
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "Write something long")
    wait_settled(page)
    notice = page.locator(".row.assistant .terminal.length")
    expect(notice).to_have_count(1)
    expect(notice).to_contain_text("Cut off at the token limit")
    button = notice.locator("button.continue")
    expect(button).to_be_visible()
    button.click()
    wait_settled(page)
    expect(page.locator(".row.user")).to_have_count(2)
    expect(page.locator(".row.user").last).to_contain_text("Continue from where")
    expect(page.locator(".row.assistant").last).to_contain_text("now complete")
    # the earlier cut-off row keeps its notice, without a Continue of its own any more
    expect(notice).to_contain_text("Cut off at the token limit")
    expect(page.locator("button.continue:visible")).to_have_count(0)
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"].startswith("The first half of a long")
    assert "Cut off at the token limit" in sent[1]["content"]
    assert sent[2]["content"] == "Continue from where your answer was cut off."


def test_the_context_meter_shows_a_window_found_after_the_page_loaded(
    context: BrowserContext, tmp_path: Path
) -> None:
    # The first /api/health read starts the lookup, which takes a while here: the page's
    # boot-time read has no window yet, and it asks again once a row has usage.
    with FakeOpenAI() as fake:
        fake.models_delay = 4.0
        with running_server(
            tmp_path / "data",
            "--runtime",
            "openai",
            "--base-url",
            fake.base_url,
            "--model",
            "fake-model",
        ) as srv:
            page = context.new_page()
            open_app(page, srv.base_url)
            send(page, "hello")
            wait_settled(page)
            expect(page.locator("#meter-text")).to_contain_text("of 32,768 tokens")
