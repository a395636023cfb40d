"""What the user typed and has not sent (docs/page.md, "Drafts"): one draft per session, in
the composer of that session only. The real page in headless Chromium against the real
server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, Route, expect

from accounts_kit import PASSWORDS, add_user
from helpers import ServerProcess, new_session, running_server, session_body, start_turn, wait_idle
from pagekit import (
    chips,
    composer,
    open_app,
    session_id_of,
    stored,
    stored_files,
    wait_settled,
    written,
)

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


def test_drafts_survive_a_reload_and_a_closed_tab_and_a_sent_one_is_gone(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A reload (or a crashed tab, a closed browser) lost every word typed and not sent: the
    composer's text and an edit left open on a message. Both come back, per session, from
    this browser's storage; what was sent is not offered again, and a deleted session's
    draft leaves the storage (into the composer shown, unsent)."""
    apples, pears = two_sessions(web_server.base_url)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{apples}")
    wait_settled(page)
    composer(page).fill("for the apples")
    row = page.locator("#transcript .rows > .row.user").first
    row.get_by_role("button", name="Edit").click()
    area = row.get_by_role("textbox", name="Edit message")
    area.fill("about apples, and their pips")
    written(page)
    page.reload()
    expect(area).to_have_value("about apples, and their pips")
    expect(composer(page)).to_have_value("for the apples")

    page.locator(".session-link").filter(has_text="Pears").click()
    composer(page).fill("for the pears")
    page.get_by_role("button", name="New chat", exact=True).click()
    composer(page).fill("a new question")
    written(page)
    page.close()  # the tab closed; another opened in the same browser
    page = context.new_page()
    open_app(page, web_server.base_url)
    expect(composer(page)).to_have_value("a new question")
    page.locator(".session-link").filter(has_text="Pears").click()
    expect(composer(page)).to_have_value("for the pears")

    # Sent: the draft goes at once, and a reload shows an empty composer.
    composer(page).press("Enter")
    wait_settled(page)
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(2)
    assert not [key for key in stored(page) if key.endswith(pears)]
    page.reload()
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(2)
    expect(composer(page)).to_have_value("")

    # Apples deleted elsewhere: its draft leaves the storage, its words come here unsent.
    assert [key for key in stored(page) if key.endswith(apples)]
    with httpx.Client(base_url=web_server.base_url) as client:
        client.delete("/api/session", params={"session_id": apples}).raise_for_status()
    expect(page.locator(".session-link").filter(has_text="Apples")).to_have_count(0)
    expect(composer(page)).to_have_value("about apples, and their pips\n\nfor the apples")
    expect(page.locator("#notice-bar")).to_contain_text("in the composer")
    written(page)
    assert not [key for key in stored(page) if key.endswith(apples)]


def test_drafts_are_bounded_and_work_without_storage(browser, web_server: ServerProcess) -> None:
    """The stored drafts stay under their cap (the oldest go first), and a browser whose
    storage refuses every write (a full quota, some private modes) keeps each session's
    draft for as long as the tab lives, with no error."""
    apples, pears = two_sessions(web_server.base_url)
    context = browser.new_context()
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{apples}")
    big = "x" * 600_000
    composer(page).fill(big)
    written(page)
    page.locator(".session-link").filter(has_text="Pears").click()
    composer(page).fill("y" * 600_000)
    written(page)
    keys = stored(page)
    assert [key for key in keys if key.endswith(pears)]
    assert not [key for key in keys if key.endswith(apples)]  # the older one made room
    assert sum(len(k) + len(v) for k, v in keys.items()) <= 1_000_000
    context.close()

    context = browser.new_context()
    context.add_init_script(
        "Storage.prototype.setItem = function () {"
        " throw new DOMException('full', 'QuotaExceededError'); };"
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    open_app(page, web_server.base_url, f"/s/{apples}")
    composer(page).fill("for the apples")
    page.locator(".session-link").filter(has_text="Pears").click()
    expect(composer(page)).to_have_value("")
    page.locator(".session-link").filter(has_text="Apples").click()
    expect(composer(page)).to_have_value("for the apples")
    written(page)
    assert errors == []
    context.close()


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[ServerProcess]:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with running_server(data, "--auth", "accounts", env={"TETHER_DEMO_DELAY": "0.01"}) as srv:
        yield srv


def sign_in_page(page: Page, base_url: str, name: str) -> None:
    page.goto(base_url + "/login")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(PASSWORDS[name])
    page.get_by_role("button", name="Log in").click()
    expect(composer(page)).to_be_visible()


def test_drafts_are_each_persons_and_leave_the_browser_at_log_out(
    context: BrowserContext, accounts_server: ServerProcess
) -> None:
    """Two people signing in on one browser (`--auth accounts`): a draft is stored under its
    author's name, another person never sees it, and Log out takes it out of the browser,
    its attached files (IndexedDB) with its text."""
    page = context.new_page()
    sign_in_page(page, accounts_server.base_url, "alice")
    composer(page).fill("alice's secret plan")
    page.locator("#file-input").set_input_files(
        files=[{"name": "plan.txt", "mimeType": "text/plain", "buffer": b"step one"}]
    )
    expect(chips(page)).to_have_text(["plan.txt"])
    written(page)
    assert list(stored(page)) == ["tether-draft:v1:alice:new"]
    assert stored_files(page) == {"tether-draft:v1:alice:new": [["plan.txt", "text/plain", 8]]}
    page.reload()
    expect(composer(page)).to_have_value("alice's secret plan")
    expect(chips(page)).to_have_text(["plan.txt"])

    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/login")
    assert stored(page) == {}
    assert stored_files(page) == {}
    sign_in_page(page, accounts_server.base_url, "bob")
    expect(composer(page)).to_have_value("")
    expect(chips(page)).to_have_count(0)
    composer(page).fill("bob's list")
    written(page)
    assert list(stored(page)) == ["tether-draft:v1:bob:new"]


def test_a_save_and_send_refused_after_leaving_goes_to_its_own_sessions_draft(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """An edit's "Save and send", then another session opened while it was on its way, and
    the server refused it (a run had started there meanwhile: 409 `session_busy`): the text
    went into the composer of the session shown then, ready to be sent to the wrong
    conversation. It goes to its own session's draft, and the notice names that session."""
    apples, _ = two_sessions(web_server.base_url)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{apples}")
    wait_settled(page)
    held: list[Route] = []
    page.route("**/api/chat/start", lambda route: held.append(route))
    row = page.locator("#transcript .rows > .row.user").first
    row.get_by_role("button", name="Edit").click()
    row.get_by_role("textbox", name="Edit message").fill("about apples, rewritten")
    row.get_by_role("button", name="Save and send").click()
    while not held:
        page.wait_for_timeout(50)
    page.locator(".session-link").filter(has_text="Pears").click()
    expect(page.locator("#transcript .rows > .row.user").first).to_contain_text("about pears")
    with httpx.Client(base_url=web_server.base_url) as client:
        start_turn(client, apples, "/slow keep it busy")  # the edit will find it busy
        held[0].continue_()
        page.unroute("**/api/chat/start")
        expect(page.locator("#notice-bar")).to_contain_text("Not sent in “Apples”")
        expect(composer(page)).to_have_value("")
        page.locator("#notice-bar").get_by_role("button", name="Open it").click()
        expect(page).to_have_url(f"{web_server.base_url}/s/{apples}")
        expect(composer(page)).to_have_value("about apples, rewritten")
        client.post("/api/chat/cancel", json={"session_id": apples})
        wait_idle(client, apples)
        users = [m for m in session_body(client, apples)["messages"] if m["role"] == "user"]
        assert [m["content"] for m in users] == ["about apples", "/slow keep it busy"]


def test_a_tab_that_only_shows_a_session_leaves_anothers_typing_alone(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Two tabs of one session share its stored draft, the last to write winning. A tab that
    only showed it (a click in it, the tab hidden or closed) wrote back the draft it had
    read, over what the other tab typed since: a crash of that one lost the newer words."""
    apples, _ = two_sessions(web_server.base_url)
    first = context.new_page()
    open_app(first, web_server.base_url, f"/s/{apples}")
    composer(first).fill("hello")
    written(first)
    second = context.new_page()
    open_app(second, web_server.base_url, f"/s/{apples}")
    expect(composer(second)).to_have_value("hello")
    composer(first).fill("hello, and more")
    written(first)
    second.locator("#transcript .rows > .row.user").first.click()
    written(second)
    second.close()
    third = context.new_page()  # as after a crash of the first tab
    open_app(third, web_server.base_url, f"/s/{apples}")
    expect(composer(third)).to_have_value("hello, and more")


def test_what_is_typed_and_attached_while_the_page_loads_is_kept(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """The composer is on screen before the page's script runs: a file picked then was
    dropped (its `change` came before anyone listened), and only the typed text stayed. Both
    are kept, after the draft the page opens on."""
    apples, _ = two_sessions(web_server.base_url)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{apples}")
    composer(page).fill("the draft")
    written(page)
    held: list[Route] = []
    page.route("**/static/js/main.js", lambda route: held.append(route))
    page.reload(wait_until="commit")  # the script, held, holds DOMContentLoaded back
    expect(composer(page)).to_be_visible()
    composer(page).fill("typed early")
    page.locator("#file-input").set_input_files(
        files=[{"name": "early.txt", "mimeType": "text/plain", "buffer": b"early"}]
    )
    while not held:
        page.wait_for_timeout(50)
    held[0].continue_()
    expect(composer(page)).to_have_value("the draft\n\ntyped early")
    expect(chips(page)).to_have_text(["early.txt"])
