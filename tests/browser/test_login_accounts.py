"""The sign-in page of `--auth accounts` as a person uses it (docs/api.md §15): it asks for a
user name too, a wrong pair shows an error, the right one opens the app with that person's
sessions only, another person's session stays invisible even by its address, and "Log out"
returns to the sign-in page."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from accounts_kit import PASSWORDS, add_user, sign_in
from helpers import ServerProcess, new_session, running_server, start_turn, wait_idle

pytestmark = pytest.mark.slow

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
PICTURE = {"name": "dot.png", "mime": "image/png", "data_base64": base64.b64encode(PNG).decode()}


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[ServerProcess]:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    add_user(data, "bob")
    with running_server(data, "--auth", "accounts", env={"TETHER_DEMO_DELAY": "0.01"}) as srv:
        yield srv


def test_sign_in_with_a_user_name_shows_only_ones_own_sessions(
    context: BrowserContext, accounts_server: ServerProcess
) -> None:
    with sign_in(accounts_server, "bob") as bob:
        bobs = new_session(bob, "Bob's private plans")
    with sign_in(accounts_server, "alice") as alice:
        new_session(alice, "Alice's notes")
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(accounts_server.base_url + "/")
    expect(page).to_have_url(re.compile(r"/login$"))
    name = page.get_by_label("User name")
    expect(name).to_be_visible()
    expect(name).to_be_focused()

    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Enter your user name")
    name.fill("alice")
    page.get_by_label("Password").fill("not her password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Wrong user name or password")

    page.get_by_label("Password").fill(PASSWORDS["alice"])
    page.get_by_label("Password").press("Enter")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    expect(page.get_by_text("Alice's notes").first).to_be_visible()
    expect(page.get_by_text("Bob's private plans")).to_have_count(0)

    page.goto(accounts_server.base_url + f"/s/{bobs}")  # his session by its address
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    page.wait_for_timeout(500)
    expect(page.get_by_text("Bob's private plans")).to_have_count(0)

    logout = page.get_by_role("button", name="Log out")
    expect(logout).to_be_visible()
    logout.click()
    expect(page).to_have_url(re.compile(r"/login$"))
    assert not [e for e in errors if "Content Security Policy" in e], errors


def test_a_logout_in_one_tab_sends_the_other_tabs_to_the_sign_in_page(
    context: BrowserContext, accounts_server: ServerProcess
) -> None:
    """A tab following a session, and one showing no session (the sidebar's own stream),
    find their sign-in gone when another tab logs out: each goes to the sign-in page by
    itself, without waiting to be hidden and shown again, instead of saying for ever that
    the server is unreachable."""
    with sign_in(accounts_server, "alice") as alice:
        sid = new_session(alice, "Alice's long talk")
    following, empty, leaving = (context.new_page() for _ in range(3))
    leaving.goto(accounts_server.base_url + "/login")  # the profile's cookie signs in all three
    leaving.get_by_label("User name").fill("alice")
    leaving.get_by_label("Password").fill(PASSWORDS["alice"])
    leaving.get_by_label("Password").press("Enter")
    expect(leaving.get_by_role("textbox", name="Message")).to_be_visible()
    following.goto(accounts_server.base_url + f"/s/{sid}")
    expect(following.locator("#conn")).to_have_attribute("data-state", "live")
    empty.goto(accounts_server.base_url + "/")
    expect(empty.get_by_text("Alice's long talk").first).to_be_visible()

    leaving.get_by_role("button", name="Log out").click()
    expect(leaving).to_have_url(re.compile(r"/login$"))
    for tab in (following, empty):
        expect(tab).to_have_url(re.compile(r"/login(\?next=.*)?$"), timeout=10_000)
    assert "next=%2Fs%2F" + sid in following.url


def test_the_next_person_on_the_browser_never_sees_the_last_ones_files_from_its_cache(
    context: BrowserContext, accounts_server: ServerProcess
) -> None:
    """An attachment is kept an hour in the browser's cache (`private, max-age=3600`): after
    Alice logs out and Bob signs in on the same browser, her file's address (in the
    history: an image opens in a tab) must ask the server, which answers Bob 404, rather than
    show him her bytes from the cache."""
    with sign_in(accounts_server, "alice") as alice:
        sid = new_session(alice, "Alice's pictures")
        start_turn(alice, sid, "mine", attachments=[PICTURE])
        url = (
            accounts_server.base_url + wait_idle(alice, sid)["messages"][0]["attachments"][0]["url"]
        )
    page = context.new_page()

    def log_in(name: str) -> None:
        page.goto(accounts_server.base_url + "/login")
        page.get_by_label("User name").fill(name)
        page.get_by_label("Password").fill(PASSWORDS[name])
        page.get_by_label("Password").press("Enter")
        expect(page.get_by_role("textbox", name="Message")).to_be_visible()

    log_in("alice")
    seen = page.goto(url)
    assert seen is not None and seen.status == 200 and seen.body() == PNG
    page.goto(accounts_server.base_url + "/")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    log_in("bob")
    again = page.goto(url)
    assert again is not None and again.status == 404
    assert PNG not in again.body()
