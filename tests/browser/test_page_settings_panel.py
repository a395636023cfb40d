"""The settings panel (issue 16.7): a dialog with labelled controls for the server's default
model and system prompt (`PATCH /api/settings`: the next run of a session without its own
uses them, and they survive a reload) and this browser's theme, view mode and send key
(localStorage: a second tab of the same profile gets them). Works on the phone layout, and
with the server away for this browser's part."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, running_server, wait_until
from pagekit import open_app, wait_settled

pytestmark = pytest.mark.slow

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.other_models = ["big-model"]
        yield server


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
    ) as srv:
        yield srv


def open_settings(page: Page):  # noqa: ANN201 - a Playwright locator
    page.get_by_role("button", name="Settings").click()
    dialog = page.get_by_role("dialog", name="Settings")
    expect(dialog).to_be_visible()
    return dialog


def test_server_defaults_apply_to_the_next_run_and_survive_a_reload(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("one")), reply(text("two")))
    page = context.new_page()
    open_app(page, server.base_url)
    dialog = open_settings(page)
    model = dialog.get_by_role("combobox", name="Default model")
    expect(model.locator("option")).to_have_text(  # the endpoint's list: slow under load
        ["Command line's (fake-model)", "fake-model", "big-model"], timeout=20_000
    )
    model.select_option("big-model")
    dialog.get_by_role("textbox", name="Default system prompt").fill("Answer <b>briefly</b>.")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    with server.client() as client:
        wait_until(
            lambda: (
                client.get("/api/settings").json()["saved"]
                == {"default_model": "big-model", "default_system_prompt": "Answer <b>briefly</b>."}
            ),
            what="the PATCH landed",
        )
    # the composer's picker and prompt button follow the new defaults
    picker = page.get_by_role("combobox", name="Model")
    expect(picker.locator("option").first).to_have_text("Default (big-model)")
    expect(page.get_by_role("button", name="System prompt (default)")).to_be_visible()

    box = page.get_by_role("textbox", name="Message")
    box.fill("hello")
    box.press("Enter")
    wait_settled(page)
    assert fake.last_request["model"] == "big-model"
    assert fake.last_request["messages"][0] == {
        "role": "system",
        "content": "Answer <b>briefly</b>.",
    }

    page.reload()
    dialog = open_settings(page)
    expect(dialog.get_by_role("combobox", name="Default model")).to_have_value("big-model")
    prompt = dialog.get_by_role("textbox", name="Default system prompt")
    expect(prompt).to_have_value("Answer <b>briefly</b>.")
    # Use the command line's, then Save: both go back to the flags
    dialog.get_by_role("button", name="Use the command line's").click()
    dialog.get_by_role("button", name="Save").click()
    with server.client() as client:
        wait_until(lambda: client.get("/api/settings").json()["saved"] == {}, what="reset")
    expect(picker.locator("option").first).to_have_text("Default (fake-model)")
    # Cancel changes nothing
    dialog = open_settings(page)
    dialog.get_by_role("combobox", name="Default model").select_option("big-model")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    with server.client() as client:
        assert client.get("/api/settings").json()["saved"] == {}


def test_settings_opened_before_the_model_list_arrives_fill_it_in_when_it_does(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    """A slow endpoint (or a busy server): Settings opened while `GET /api/models` is still
    on its way showed the command line's model alone, for as long as it stayed open."""
    fake.models_delay = 2.0
    page = context.new_page()
    page.goto(server.base_url + "/")  # not open_app: Settings is opened before the list is in
    dialog = open_settings(page)
    model = dialog.get_by_role("combobox", name="Default model")
    expect(model.locator("option")).to_have_text(["Command line's (fake-model)"])
    expect(model.locator("option")).to_have_text(
        ["Command line's (fake-model)", "fake-model", "big-model"], timeout=20_000
    )
    expect(model).to_have_value("")


def test_browser_preferences_apply_and_persist(
    context: BrowserContext, server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("sent by chord")))
    page = context.new_page()
    open_app(page, server.base_url)
    dialog = open_settings(page)
    dialog.get_by_role("combobox", name="Theme").select_option("dark")
    dialog.get_by_role("combobox", name="View mode").select_option("final")
    dialog.get_by_role("combobox", name="Send key").select_option("mod-enter")
    dialog.get_by_role("button", name="Save").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    expect(page.get_by_role("combobox", name="Display mode")).to_have_value("final")
    expect(page.locator("#composer-hint")).to_have_text("Ctrl+Enter sends · Enter for a new line")

    # Enter is a new line now; Ctrl+Enter sends
    box = page.get_by_role("textbox", name="Message")
    box.fill("line one")
    box.press("Enter")
    box.type("line two")
    expect(box).to_have_value("line one\nline two")
    assert fake.requests == []
    box.press("Control+Enter")
    wait_settled(page)
    assert fake.last_request["messages"][-1]["content"] == "line one\nline two"

    # another tab of the same browser profile starts with the same preferences
    other = context.new_page()
    open_app(other, server.base_url)
    expect(other.locator("html")).to_have_attribute("data-theme", "dark")
    expect(other.get_by_role("combobox", name="Display mode")).to_have_value("final")
    dialog = open_settings(other)
    expect(dialog.get_by_role("combobox", name="Send key")).to_have_value("mod-enter")
    dialog.get_by_role("combobox", name="Theme").select_option("light")
    dialog.get_by_role("button", name="Save").click()
    expect(other.locator("html")).to_have_attribute("data-theme", "light")


def test_a_theme_chosen_in_another_tab_applies_here_at_once(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The theme is this browser's (localStorage), like the send key: chosen in Settings or
    with ◐ in one tab, every open tab shows it at once, not only those opened after; and
    System follows the system's scheme as it changes."""
    first, second = context.new_page(), context.new_page()
    open_app(first, server.base_url)
    open_app(second, server.base_url)
    theme = second.locator("html")
    dialog = open_settings(first)
    dialog.get_by_role("combobox", name="Theme").select_option("dark")
    dialog.get_by_role("button", name="Save").click()
    expect(first.locator("html")).to_have_attribute("data-theme", "dark")
    expect(theme).to_have_attribute("data-theme", "dark")
    first.get_by_role("button", name="Switch theme").click()
    expect(theme).to_have_attribute("data-theme", "light")
    second.emulate_media(color_scheme="dark")  # a theme chosen stays, whatever the system's
    expect(theme).to_have_attribute("data-theme", "light")
    dialog = open_settings(first)
    dialog.get_by_role("combobox", name="Theme").select_option("system")
    dialog.get_by_role("button", name="Save").click()
    expect(theme).to_have_attribute("data-theme", "dark")
    second.emulate_media(color_scheme="light")
    expect(theme).to_have_attribute("data-theme", "light")


def test_a_view_mode_chosen_in_another_tab_applies_here_at_once(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The view mode is this browser's too: chosen in Settings or the header's View select
    in one tab, every open tab shows it at once, as the theme and the send key."""
    first, second = context.new_page(), context.new_page()
    open_app(first, server.base_url)
    open_app(second, server.base_url)
    view = second.get_by_role("combobox", name="Display mode")
    first.get_by_role("combobox", name="Display mode").select_option("final")
    expect(view).to_have_value("final")
    dialog = open_settings(first)
    dialog.get_by_role("combobox", name="View mode").select_option("stream")
    dialog.get_by_role("button", name="Save").click()
    expect(view).to_have_value("stream")


def test_a_default_model_saved_in_another_tab_is_the_one_this_tab_names(
    context: BrowserContext, server: ServerProcess
) -> None:
    """The composer's picker says which model a session without its own gets ("Default
    (…)"): saved in another tab's Settings, it is the one this tab's picker names at once,
    not the one read when it loaded (what would be sent is the new one)."""
    first, second = context.new_page(), context.new_page()
    open_app(first, server.base_url)
    open_app(second, server.base_url)
    picker = second.get_by_role("combobox", name="Model").locator("option").first
    expect(picker).to_have_text("Default (fake-model)")
    dialog = open_settings(first)
    model = dialog.get_by_role("combobox", name="Default model")
    expect(model.locator("option")).to_have_text(
        ["Command line's (fake-model)", "fake-model", "big-model"], timeout=20_000
    )
    model.select_option("big-model")
    dialog.get_by_role("textbox", name="Default system prompt").fill("Be brief.")
    dialog.get_by_role("button", name="Save").click()
    expect(first.get_by_role("combobox", name="Model").locator("option").first).to_have_text(
        "Default (big-model)"
    )
    expect(picker).to_have_text("Default (big-model)")
    expect(second.get_by_role("button", name="System prompt (default)")).to_be_visible()


def test_the_panel_works_on_a_phone(browser: Browser, server: ServerProcess) -> None:
    page = browser.new_context(viewport=PHONE, has_touch=True).new_page()
    open_app(page, server.base_url)
    page.get_by_role("button", name="Sessions").click()  # the drawer holds the button
    dialog = open_settings(page)
    box = dialog.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    for name in ("Default model", "Theme", "View mode", "Send key"):
        control = dialog.get_by_role("combobox", name=name)
        control.scroll_into_view_if_needed()
        size = control.bounding_box()
        assert size is not None and size["height"] >= 44, name
        # inside the dialog: "Enter sends (Shift+Enter: new line)" once pushed its group
        # past the phone's edge
        assert size["x"] + size["width"] <= box["x"] + box["width"], name
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 800}, PHONE])
def test_save_and_cancel_are_on_screen_when_the_panel_opens(
    browser: Browser, server: ServerProcess, viewport: dict[str, int]
) -> None:
    """The panel is taller than a laptop's window: its buttons stay in view at the bottom
    while the groups above them scroll (they were below the window's edge), and each group's
    title is one line (the server's ran over three lines and across its frame's border)."""
    page = browser.new_context(viewport=viewport, has_touch=True).new_page()
    open_app(page, server.base_url)
    if viewport is PHONE:
        page.get_by_role("button", name="Sessions").click()
    dialog = open_settings(page)
    frame = dialog.bounding_box()
    assert frame is not None
    for name in ("Save", "Cancel"):
        button = dialog.get_by_role("button", name=name).bounding_box()
        assert button is not None, name
        assert button["y"] >= 0 and button["y"] + button["height"] <= viewport["height"], name
        assert button["y"] + button["height"] <= frame["y"] + frame["height"], name
    for legend in dialog.locator("legend").all():
        height = legend.evaluate("e => e.getBoundingClientRect().height")
        line = legend.evaluate("e => parseFloat(getComputedStyle(e).lineHeight) || 20")
        assert height < 1.5 * line, legend.text_content()
    dialog.get_by_role("button", name="Save").click()  # a real click: nothing covers it
    expect(dialog).to_be_hidden()


def test_with_the_server_away_the_panel_still_opens_for_this_browsers_part(
    browser: Browser, server: ServerProcess
) -> None:
    """On a phone the theme is only in this panel: when `GET /api/settings` fails (the server
    stopped, the database away) the panel still opens; the server's part is off and says
    why, this browser's part saves."""
    page = browser.new_context(viewport=PHONE, has_touch=True).new_page()
    open_app(page, server.base_url)
    server.stop()
    page.get_by_role("button", name="Sessions").click()
    dialog = open_settings(page)
    expect(dialog.get_by_role("combobox", name="Default model")).to_be_disabled()
    expect(dialog.get_by_text("The server's settings could not be read")).to_be_visible()
    dialog.get_by_role("combobox", name="Theme").select_option("dark")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_open_dialogs_have_no_serious_axe_violation(
    browser: Browser, server: ServerProcess, theme: str
) -> None:
    """The settings and the search dialogs, open, in both themes (axe-core, as
    test_page_a11y.py runs it)."""
    from test_page_a11y import axe_violations, new_page

    page = new_page(browser, "phone", theme)
    open_app(page, server.base_url)
    page.get_by_role("button", name="Sessions").click()
    open_settings(page)
    assert axe_violations(page) == []
    page.keyboard.press("Escape")
    page.keyboard.press("Control+k")
    dialog = page.get_by_role("dialog", name="Search messages")
    dialog.get_by_role("searchbox", name="Search messages").fill("nothing")
    expect(dialog.get_by_role("status")).to_have_text("No messages match.")
    assert axe_violations(page) == []
