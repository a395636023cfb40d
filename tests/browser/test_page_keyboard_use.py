"""A daily user at the keyboard: where the focus goes after a control they pressed has done
its work, and what the page says about keys and defaults chosen in another tab. One server
for the module (the browser suite is long already)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from helpers import ServerProcess, new_session, running_server
from pagekit import open_app, send, wait_settled

pytestmark = pytest.mark.slow


def say(page: Page, text: str) -> None:
    send(page, text)
    wait_settled(page)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data: Path = tmp_path_factory.mktemp("keyboard") / "data"
    with running_server(data, env={"TETHER_DEMO_DELAY": "0.005"}) as srv:
        yield srv


def test_a_branch_switched_from_the_keyboard_keeps_the_focus_on_its_switcher(
    context: BrowserContext, server: ServerProcess
) -> None:
    """‹ and › show another row in that place (another element) and one of them turns
    disabled at either end: the focus stays on the switcher, so the next key press switches
    on instead of starting again from the top of the page."""
    page = context.new_page()
    open_app(page, server.base_url)
    say(page, "first words")
    user = page.locator("#transcript .rows > .row.user").first
    user.get_by_role("button", name="Edit").click()
    user.get_by_role("textbox", name="Edit message").fill("better words")
    page.keyboard.press("Control+Enter")
    expect(user.get_by_label("Branch 2 of 2")).to_be_visible()
    wait_settled(page)

    user.get_by_role("button", name="Previous branch").focus()
    page.keyboard.press("Enter")
    expect(user.get_by_label("Branch 1 of 2")).to_be_visible()
    expect(user.locator(".user-text")).to_have_text("first words")
    # ‹ is disabled at the first branch: the focus is on ›, ready to go back
    expect(user.get_by_role("button", name="Next branch")).to_be_focused()
    page.keyboard.press("Enter")
    expect(user.get_by_label("Branch 2 of 2")).to_be_visible()
    expect(user.get_by_role("button", name="Previous branch")).to_be_focused()


def test_the_system_prompt_dialog_shows_a_default_changed_in_another_tab(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The default system prompt is what the model gets first in a session without its own:
    one changed elsewhere (another tab's Settings, another device) since this tab loaded is
    what its dialog and button show, not the one the tab read at load time."""
    page = context.new_page()
    open_app(page, server.base_url)
    say(page, "no prompt of its own")
    prompt_button = page.locator("#system-prompt-btn")
    expect(prompt_button).to_have_attribute("aria-label", "System prompt (none)")
    with server.client() as client:
        changed = client.patch("/api/settings", json={"default_system_prompt": "Be terse."})
        assert changed.status_code == 200, changed.text
    try:
        prompt_button.click()
        dialog = page.locator("#system-prompt-dialog")
        expect(dialog.get_by_role("textbox", name="System prompt text")).to_have_value("Be terse.")
        expect(dialog).to_contain_text("The server's default system prompt")
        page.keyboard.press("Escape")
        expect(prompt_button).to_have_attribute("aria-label", "System prompt (default)")
        expect(prompt_button).to_be_focused()
    finally:
        with server.client() as client:
            client.patch("/api/settings", json={"default_system_prompt": None})


def test_a_message_sent_while_scrolled_up_is_shown_with_its_answer(
    context: BrowserContext, server: ServerProcess
) -> None:
    """A reader scrolled up in a long session (reading back, or opened at a search result)
    who sends a message sees it and its answer come, as in other chat apps: sending follows
    the end of the transcript again, instead of leaving the message below, out of sight."""
    page = context.new_page()
    open_app(page, server.base_url)
    for i in range(3):
        say(page, f"turn {i} " + "words " * 80)
    transcript = page.locator("#transcript")
    transcript.evaluate("(t) => { t.scrollTop = 0; }")
    page.wait_for_function("document.querySelector('#transcript').scrollTop === 0")
    say(page, "sent while scrolled up")
    expect(page.locator("#transcript .rows > .row.assistant").last).to_be_in_viewport()
    expect(page.get_by_role("button", name="Jump to latest")).to_be_hidden()


def test_a_send_key_chosen_in_another_tab_is_the_one_this_tab_names(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The send key is this browser's (localStorage), so a choice made in one tab applies in
    every tab at once: the hint under each composer names the key that sends there now,
    not the one chosen when that tab loaded."""
    first, second = context.new_page(), context.new_page()
    open_app(first, server.base_url)
    open_app(second, server.base_url)
    hint = second.locator("#composer-hint")
    expect(hint).to_have_text("Enter sends · Shift+Enter for a new line")
    first.get_by_role("button", name="Settings").click()
    settings = first.locator("#settings-dialog")
    settings.get_by_label("Send key").select_option("mod-enter")
    settings.get_by_role("button", name="Save").click()
    expect(first.locator("#composer-hint")).to_have_text("Ctrl+Enter sends · Enter for a new line")
    expect(hint).to_have_text("Ctrl+Enter sends · Enter for a new line")
    box = second.get_by_role("textbox", name="Message")
    box.fill("two")
    box.press("Enter")  # what the hint says: a new line
    expect(box).to_have_value("two\n")
    first.evaluate("localStorage.removeItem('tether-send-key')")  # back to the default
    expect(hint).to_have_text("Enter sends · Shift+Enter for a new line")


def test_an_edit_box_sends_with_the_send_key_chosen_for_the_composer(
    context: BrowserContext, server: ServerProcess
) -> None:
    """An edit's "Save and send" is a send: with Enter chosen as the send key (the default),
    Enter in a message's edit box saves and sends it and Shift+Enter is a new line, as in
    the composer; with Ctrl+Enter chosen, Enter is a new line. Ctrl+Enter saves in either."""
    page = context.new_page()
    open_app(page, server.base_url)
    say(page, "a message to edit")
    user = page.locator("#transcript .rows > .row.user").first
    user.get_by_role("button", name="Edit").click()
    box = user.get_by_role("textbox", name="Edit message")
    box.fill("edited")
    box.press("Shift+Enter")
    box.press("End")
    box.type("twice")
    expect(box).to_have_value("edited\ntwice")
    box.press("Enter")
    expect(user.locator(".user-text")).to_have_text("edited\ntwice")
    wait_settled(page)

    page.evaluate("localStorage.setItem('tether-send-key', 'mod-enter')")
    user.get_by_role("button", name="Edit").click()
    box = user.get_by_role("textbox", name="Edit message")
    box.fill("again")
    box.press("Enter")
    expect(box).to_have_value("again\n")
    box.press("Control+Enter")
    expect(user.locator(".user-text")).to_have_text("again")
    wait_settled(page)


def test_a_regenerate_pressed_from_the_keyboard_leaves_the_focus_on_the_new_answer(
    context: BrowserContext, server: ServerProcess
) -> None:
    """Regenerate hides the answer it was pressed on (another element takes its place): the
    focus, left on nothing, goes to the new answer's Regenerate once it is settled, so the
    next key press goes on from there instead of from the top of the page."""
    page = context.new_page()
    open_app(page, server.base_url)
    say(page, "answer me twice")
    answer = page.locator("#transcript .rows > .row.assistant").last
    answer.get_by_role("button", name="Regenerate").focus()
    page.keyboard.press("Enter")
    expect(answer.get_by_label("Branch 2 of 2")).to_be_visible()
    wait_settled(page)
    expect(answer.get_by_role("button", name="Regenerate")).to_be_focused()
    page.keyboard.press("Shift+Tab")  # on, within that row: its branch switcher
    expect(answer.get_by_role("button", name="Previous branch")).to_be_focused()


def test_esc_while_the_settings_dialog_is_loading_closes_it(
    context: BrowserContext, server: ServerProcess
) -> None:
    """Settings opens at once, its server part off until the server's defaults are read (a
    slow server): an Esc pressed meanwhile closes it, as later, instead of being lost and the
    dialog opening after it."""
    page = context.new_page()
    open_app(page, server.base_url)
    held: list = []
    page.route("**/api/settings", lambda route: held.append(route))
    button = page.get_by_role("button", name="Settings")
    button.click()
    dialog = page.get_by_role("dialog", name="Settings")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("combobox", name="Default model")).to_be_disabled()
    expect(dialog.get_by_text("Reading the server's settings")).to_be_visible()
    expect(dialog.get_by_role("combobox", name="Theme")).to_be_focused()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(button).to_be_focused()
    held[0].continue_()
    page.unroute("**/api/settings")
    button.click()  # read again: the server's part is on
    expect(dialog.get_by_role("combobox", name="Default model")).to_be_enabled()
    expect(dialog.get_by_text("Reading the server's settings")).to_be_hidden()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()


def test_the_focus_stays_in_the_sidebar_after_a_row_menus_action(
    context: BrowserContext, server: ServerProcess
) -> None:
    """A row menu's item is gone once chosen, and Pin moves its row (a moved element loses
    the focus): a keyboard user who pinned a session, cancelled a Delete or deleted one was
    left on the page's body, Tab starting again from the top. Now the focus is on the row's
    Actions button when the row is still listed, else on the link of the row that took its
    place."""
    with server.client() as client:
        new_session(client, "kb one")
        new_session(client, "kb two")
    page = context.new_page()
    open_app(page, server.base_url)
    actions = page.get_by_role("button", name="Actions for kb two")

    def choose(item: str) -> None:
        actions.focus()
        page.keyboard.press("Enter")
        page.get_by_role("menuitem", name=item).focus()
        page.keyboard.press("Enter")

    choose("Pin")
    expect(page.locator(".session-row").first).to_contain_text("kb two")
    expect(actions).to_be_focused()
    choose("Delete…")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.keyboard.press("Escape")
    expect(actions).to_be_focused()
    choose("Delete…")
    page.locator("#confirm-ok").focus()
    page.keyboard.press("Enter")
    expect(actions).to_have_count(0)
    expect(page.get_by_role("link", name=re.compile(r"^kb one"))).to_be_focused()


def test_a_row_menu_is_walked_with_the_arrow_keys(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The row menu says it is a menu (role "menu"), whose items a screen reader's user moves
    between with the arrow keys; they did nothing there, and Tab, the only way on, left the
    menu open behind the focus. Now ↓ and ↑ go round the items, Home and End to either end,
    and Tab out of the menu closes it."""
    with server.client() as client:
        new_session(client, "arrow walk")
    page = context.new_page()
    open_app(page, server.base_url)
    page.get_by_role("button", name="Actions for arrow walk").focus()
    page.keyboard.press("Enter")
    item = lambda name: page.get_by_role("menuitem", name=name)  # noqa: E731
    expect(item("Rename")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(item("Pin")).to_be_focused()
    page.keyboard.press("End")
    expect(item("Delete…")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(item("Rename")).to_be_focused()
    page.keyboard.press("ArrowUp")
    expect(item("Delete…")).to_be_focused()
    page.keyboard.press("Home")
    expect(item("Rename")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("menu")).to_have_count(0)
    # on from the row's Actions button, as if the menu had not been opened
    expect(page.get_by_role("button", name="Actions for arrow walk")).not_to_be_focused()
    page.keyboard.press("Shift+Tab")
    expect(page.get_by_role("button", name="Actions for arrow walk")).to_be_focused()
