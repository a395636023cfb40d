"""Typing through an input method (Japanese, Chinese, Korean): the Enter that picks a
conversion and the Esc that cancels one are the input method's keys, not the page's. The
browser still sends them to the page as keydowns: Chromium and Firefox mark them
`isComposing` (keyCode 229); Safari gives the Enter that commits a conversion keyCode 229
with `isComposing` already false. Each test composes through Chromium's own IME path
(DevTools `Input.imeSetComposition`, then the key as the IME delivers it, keyCode 229) on
the real page against the real server, and checks that nothing typed is sent, saved,
cancelled or thrown away by such a key."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import ServerProcess, session_body
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow

KEYS = {"Enter": "Enter", "Escape": "Escape"}


def ime_key(page: Page, key: str, *, composing: str | None) -> None:
    """`key` as an input method delivers it: keyCode 229. With `composing`, a conversion of
    that text is open in the focused box (Chromium marks the key `isComposing`); without,
    none is (Safari's Enter committing a conversion)."""
    cdp = page.context.new_cdp_session(page)
    try:
        if composing is not None:
            end = len(composing)
            cdp.send(
                "Input.imeSetComposition",
                {"text": composing, "selectionStart": end, "selectionEnd": end},
            )
        for kind in ("rawKeyDown", "keyUp"):
            cdp.send(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": KEYS[key], "windowsVirtualKeyCode": 229},
            )
    finally:
        cdp.detach()


def commit(page: Page, chosen: str) -> None:
    """The input method commits its conversion as `chosen`."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("Input.insertText", {"text": chosen})
    finally:
        cdp.detach()


def test_composing_keys_in_the_composer_and_a_messages_edit_box_send_and_cancel_nothing(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """The composer: Safari's Enter committing a conversion (keyCode 229, not composing) sent
    the half-written message. A message's edit box: the Esc cancelling a conversion closed
    the box, and the edit typed there was gone."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    box = page.get_by_role("textbox", name="Message")
    box.fill("first question ")
    box.press("End")
    ime_key(page, "Enter", composing=None)
    page.wait_for_timeout(300)
    expect(box).to_have_value("first question ")
    assert "/s/" not in page.url, "the Enter that committed a conversion sent the message"
    box.type("asked")
    box.press("Enter")
    wait_settled(page)

    row = page.locator("#transcript .rows > .row.user").first
    row.get_by_role("button", name="Edit").click()
    edit = row.get_by_role("textbox", name="Edit message")
    edit.fill("an edit I typed ")
    edit.press("End")
    ime_key(page, "Escape", composing="にほん")
    page.wait_for_timeout(300)
    expect(edit).to_be_visible()  # the Esc was the input method's
    commit(page, "日本")
    expect(edit).to_have_value("an edit I typed 日本")
    edit.press("Control+Enter")
    expect(row.locator(".user-text")).to_have_text("an edit I typed 日本")
    wait_settled(page)


def test_composing_keys_in_a_queued_edit_a_rename_and_search_save_and_close_nothing(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """A queued message's editor saved and closed on the Enter that picked a conversion, and
    threw the edit away on the Esc that cancelled one; a session's rename box did the same
    to the title; message search closed on that Esc."""
    page = context.new_page()
    open_app(page, openai_web.base_url)
    fake.script(reply(text("working"), barrier("hold")))
    send(page, "first")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    sid = session_id_of(page)
    box = page.get_by_role("textbox", name="Message")
    box.fill("queued words")
    box.press("Enter")
    queued = page.locator("#queue li")
    expect(queued).to_contain_text("queued words")

    queued.get_by_role("button", name="Edit").click()
    area = page.get_by_role("textbox", name="Edit queued message")
    area.fill("queued ")
    area.press("End")
    ime_key(page, "Enter", composing="とうきょう")
    ime_key(page, "Escape", composing="とうきょう")
    page.wait_for_timeout(300)
    expect(area).to_be_visible()
    commit(page, "東京")
    area.press("Enter")
    expect(queued.locator(".queued-text")).to_have_text("queued 東京")
    with httpx.Client(base_url=openai_web.base_url) as client:
        assert [q["text"] for q in session_body(client, sid)["queued"]] == ["queued 東京"]

    page.get_by_role("button", name="Actions for first").click()
    page.get_by_role("menuitem", name="Rename").click()
    title = page.get_by_role("textbox", name="New title")
    title.fill("Trip to ")
    title.press("End")
    ime_key(page, "Enter", composing="きょうと")
    ime_key(page, "Escape", composing="きょうと")
    page.wait_for_timeout(300)
    expect(title).to_be_visible()
    commit(page, "京都")
    title.press("Enter")
    expect(page.locator(".session-row .session-name").first).to_have_text("Trip to 京都")

    page.keyboard.press("Control+k")
    search = page.get_by_role("searchbox", name="Search messages")
    search.fill("wor")
    ime_key(page, "Escape", composing="ど")
    page.wait_for_timeout(300)
    expect(search).to_be_visible()
    search.press("Escape")
    expect(search).to_be_hidden()

    fake.release("hold")
    wait_settled(page)
