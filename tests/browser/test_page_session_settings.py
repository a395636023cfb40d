"""The session's own settings in the page (issue 16.1-16.3): the header's model picker (the
next run uses the chosen model, and each assistant row shows the model that answered, also
after a reload), the system prompt (the header says whether one is in effect, a dialog edits
it, the next request opens with it, a reload shows it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, running_server, session_body, wait_until
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.other_models = ["big-model"]
        yield server


@pytest.fixture
def openai_web(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        "--runtime",
        "openai",
        "--base-url",
        fake.base_url,
        "--model",
        "fake-model",
    ) as srv:
        yield srv


def test_a_picked_model_answers_the_next_turn_and_its_row_says_so(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    page = context.new_page()
    open_app(page, openai_web.base_url)
    picker = page.get_by_role("combobox", name="Model")
    expect(picker.locator("option")).to_have_text(
        ["Default (fake-model)", "fake-model", "big-model"]
    )
    send(page, "first")
    wait_settled(page)
    sid = session_id_of(page)
    assert fake.last_request["model"] == "fake-model"
    expect(page.locator(".row.assistant .model")).to_have_text(["fake-model"])

    picker.select_option("big-model")
    with openai_web.client() as client:
        wait_until(
            lambda: session_body(client, sid)["model"] == "big-model", what="the PATCH landed"
        )
    send(page, "second")
    expect(page.locator(".row.assistant:not(.live)")).to_have_count(2)
    wait_settled(page)
    assert fake.last_request["model"] == "big-model"
    expect(page.locator(".row.assistant .model")).to_have_text(["fake-model", "big-model"])

    page.reload()
    expect(page.locator(".row.assistant .model")).to_have_text(["fake-model", "big-model"])
    expect(picker).to_have_value("big-model")


def test_the_system_prompt_is_shown_edited_and_sent_first(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    prompt = "You are a pirate. <b>not bold</b>"
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "first")
    wait_settled(page)
    sid = session_id_of(page)
    button = page.get_by_role("button", name="System prompt (none)")
    expect(button).to_be_visible()
    button.click()
    dialog = page.get_by_role("dialog", name="System prompt")
    dialog.get_by_role("textbox", name="System prompt text").fill(prompt)
    dialog.get_by_role("button", name="Save").click()
    expect(page.get_by_role("button", name="System prompt (this session's)")).to_be_visible()
    with openai_web.client() as client:
        wait_until(lambda: session_body(client, sid)["system_prompt"] == prompt, what="saved")

    send(page, "second")
    expect(page.locator(".row.assistant:not(.live)")).to_have_count(2)
    wait_settled(page)
    assert fake.last_request["messages"][0] == {"role": "system", "content": prompt}

    page.reload()
    button = page.get_by_role("button", name="System prompt (this session's)")
    expect(button).to_be_visible()
    button.click()
    box = page.get_by_role("dialog", name="System prompt").get_by_role(
        "textbox", name="System prompt text"
    )
    expect(box).to_have_value(prompt)
    page.get_by_role("dialog", name="System prompt").get_by_role(
        "button", name="Use default"
    ).click()
    expect(page.get_by_role("button", name="System prompt (none)")).to_be_visible()


def test_copy_puts_a_messages_markdown_source_on_the_clipboard(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    answer = "**Bold** and `code`:\n\n- one\n- two\n\n```python\nprint('hi')\n```\n"
    question = "Line one\n  indented <b>not html</b>"
    fake.script(reply(text(answer)))
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, question)
    wait_settled(page)
    page.reload()  # the settled rows, as a fresh page builds them
    assistant = page.get_by_role("article", name="Assistant")
    expect(assistant.locator(".markdown strong")).to_have_text("Bold")  # rendered ...
    assistant.locator(".assistant-head").get_by_role("button", name="Copy").click()
    expect(
        assistant.locator(".assistant-head").get_by_role("button", name="Copied")
    ).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == answer  # ... copied as source
    user = page.get_by_role("article", name="You")
    user.get_by_role("button", name="Copy").click()
    expect(user.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == question
