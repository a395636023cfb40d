"""What the user typed and has not sent (docs/page.md, "Drafts"): one draft per session, in
the composer of that session only. The real page in headless Chromium against the real
server."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle
from pagekit import open_app, session_id_of, wait_settled

pytestmark = pytest.mark.slow


def two_sessions(base_url: str) -> tuple[str, str]:
    """Two sessions, "Apples" and "Pears", each with one settled turn."""
    with httpx.Client(base_url=base_url) as client:
        sids = []
        for title in ("Apples", "Pears"):
            sid = new_session(client, title)
            start_turn(client, sid, f"about {title.lower()}")
            wait_idle(client, sid)
            sids.append(sid)
    return sids[0], sids[1]


def composer(page: Page):
    return page.get_by_role("textbox", name="Message", exact=True)


def chips(page: Page):
    return page.locator("#attachment-chips .chip-name")


def test_each_session_keeps_its_own_draft_in_the_composer(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Text half typed in one session's composer followed the user to every other session
    and to a New chat, where Enter sent it to the wrong conversation. Each session (and the
    New chat) has its own draft, text and files, shown again on coming back; the New chat's
    goes with the session its first send creates."""
    apples, pears = two_sessions(web_server.base_url)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{apples}")
    wait_settled(page)
    link = page.locator(".session-link")

    composer(page).fill("for the apples")
    page.locator("#file-input").set_input_files(
        files=[{"name": "apples.txt", "mimeType": "text/plain", "buffer": b"APPLES"}]
    )
    expect(chips(page)).to_have_text(["apples.txt"])
    link.filter(has_text="Pears").click()
    expect(page.locator("#transcript .rows > .row.user").first).to_contain_text("about pears")
    expect(composer(page)).to_have_value("")
    expect(chips(page)).to_have_count(0)
    composer(page).fill("for the pears")

    page.get_by_role("button", name="New chat", exact=True).click()
    expect(composer(page)).to_have_value("")
    composer(page).fill("a new question")

    link.filter(has_text="Apples").click()
    expect(page.locator("#transcript .rows > .row.user").first).to_contain_text("about apples")
    expect(composer(page)).to_have_value("for the apples")
    expect(chips(page)).to_have_text(["apples.txt"])
    page.go_back()  # the New chat, by the browser's Back
    expect(composer(page)).to_have_value("a new question")
    expect(chips(page)).to_have_count(0)
    link.filter(has_text="Pears").click()
    expect(composer(page)).to_have_value("for the pears")

    # The New chat's draft, sent: its session is created, and the draft is gone with it.
    page.get_by_role("button", name="New chat", exact=True).click()
    expect(composer(page)).to_have_value("a new question")
    composer(page).press("Enter")
    created = session_id_of(page)
    wait_settled(page)
    expect(composer(page)).to_have_value("")
    page.get_by_role("button", name="New chat", exact=True).click()
    expect(composer(page)).to_have_value("")

    # Nothing went anywhere it was not sent.
    with httpx.Client(base_url=web_server.base_url) as client:
        for sid, words in ((apples, ["about apples"]), (pears, ["about pears"])):
            users = [m for m in session_body(client, sid)["messages"] if m["role"] == "user"]
            assert [m["content"] for m in users] == words
        users = [m for m in session_body(client, created)["messages"] if m["role"] == "user"]
        assert [m["content"] for m in users] == ["a new question"]


def test_a_new_chats_draft_moves_to_the_session_a_setting_creates(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A system prompt saved in a New chat creates its session: the text being typed there
    stays in the composer, now that session's draft, and the next New chat starts empty."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    composer(page).fill("half a thought")
    page.get_by_role("button", name="System prompt").click()
    page.get_by_role("textbox", name="System prompt text").fill("Be brief.")
    page.get_by_role("button", name="Save").click()
    created = session_id_of(page)
    expect(composer(page)).to_have_value("half a thought")
    page.get_by_role("button", name="New chat", exact=True).click()
    expect(composer(page)).to_have_value("")
    page.go_back()
    expect(page).to_have_url(f"{web_server.base_url}/s/{created}")
    expect(composer(page)).to_have_value("half a thought")
