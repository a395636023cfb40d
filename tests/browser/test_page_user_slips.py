"""What a user's slips and bad luck must not cost on the page: an Esc, an Enter typed before
the results caught up, a row moving under a rename, a Save the server did not take. Each test
drives the real page in headless Chromium against the real server."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import BrowserContext, Locator, Page, Route, expect

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle, wait_until
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow


def _queued_behind_a_held_run(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> tuple[Page, Locator, Locator, str]:
    """A page whose run is held at the barrier "hold", with "queued words" queued behind it:
    the page, its message box, the queue's rows and the session id."""
    page = context.new_page()
    open_app(page, openai_web.base_url)
    fake.script(reply(text("working"), barrier("hold")))
    send(page, "first")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    box = page.get_by_role("textbox", name="Message")
    box.fill("queued words")
    box.press("Enter")  # queued while the run goes
    queued = page.locator("#queue li")
    expect(queued).to_contain_text("queued words")
    return page, box, queued, session_id_of(page)


def test_esc_in_a_queued_messages_editor_discards_the_edit(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """Esc closes the editor of a queued message without saving: removing the box blurred
    it, and the blur saved what Esc was meant to throw away."""
    page, _, queued, sid = _queued_behind_a_held_run(context, openai_web, fake)

    queued.get_by_role("button", name="Edit").click()
    area = page.get_by_role("textbox", name="Edit queued message")
    area.fill("changed my mind")
    area.press("Escape")
    expect(area).to_have_count(0)
    page.wait_for_timeout(500)  # a PATCH, had one gone, has landed and come back as events
    expect(queued.locator(".queued-text")).to_have_text("queued words")
    with httpx.Client(base_url=openai_web.base_url) as client:
        assert [q["text"] for q in session_body(client, sid)["queued"]] == ["queued words"]

    # Enter still saves, once.
    queued.get_by_role("button", name="Edit").click()
    area.fill("edited for real")
    area.press("Enter")
    expect(queued.locator(".queued-text")).to_have_text("edited for real")
    with httpx.Client(base_url=openai_web.base_url) as client:
        assert [q["text"] for q in session_body(client, sid)["queued"]] == ["edited for real"]
    fake.release("hold")
    wait_settled(page)


def test_enter_in_message_search_opens_the_first_result_of_what_was_typed(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Enter in the search box opens the first result of the words in the box: typed quickly
    after changing the words, it opened the first result of the previous words, still shown
    while the new search waited out its debounce."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "alpha apples")
    wait_settled(page)
    apples = session_id_of(page)
    page.get_by_role("button", name="New chat").click()
    send(page, "bravo bananas")
    page.wait_for_url(lambda url: "/s/" in url and apples not in url)
    wait_settled(page)
    bananas = session_id_of(page)
    page.get_by_role("button", name="New chat").click()

    page.keyboard.press("Control+k")
    box = page.get_by_role("searchbox", name="Search messages")
    box.fill("apples")
    results = page.locator("#search-results button")
    expect(results.first).to_contain_text("alpha apples")
    box.fill("bananas")
    box.press("Enter")  # at once, as a fast typist does
    page.wait_for_url(lambda url: url.endswith(f"/s/{apples}") or url.endswith(f"/s/{bananas}"))
    assert page.url.endswith(f"/s/{bananas}"), "Enter opened the previous words' result"
    expect(page.locator(".row.search-hit")).to_contain_text("bravo bananas")


def test_a_sidebar_row_that_moves_keeps_its_rename_box_and_keyboard_focus(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A session renamed while activity elsewhere (another tab, the agent's CLI) moves its
    row to the top: moving the row blurred the box, which saved the half-typed title and
    closed it; a row reached with the arrow keys lost the focus the same way."""
    client = httpx.Client(base_url=web_server.base_url)
    older = new_session(client, "older one")
    start_turn(client, older, "hello older")
    wait_idle(client, older)
    newer = new_session(client, "newer one")
    start_turn(client, newer, "hello newer")
    wait_idle(client, newer)
    page = context.new_page()
    page.goto(web_server.base_url + "/")
    names = page.locator(".session-row .session-name")
    expect(names).to_have_text(["newer one", "older one"])

    # A keyboard user on the second row: it moves up, the focus stays on it.
    page.locator(".session-link").first.focus()
    page.keyboard.press("ArrowDown")
    expect(page.locator(".session-link").nth(1)).to_be_focused()
    start_turn(client, older, "activity elsewhere")
    expect(names).to_have_text(["older one", "newer one"])
    expect(page.locator(".session-link").first).to_be_focused()
    wait_idle(client, older)

    # Renaming the second row (now "newer one") while it moves up.
    expect(names).to_have_text(["older one", "newer one"])
    page.get_by_role("button", name="Actions for newer one").click()
    page.get_by_role("menuitem", name="Rename").click()
    box = page.get_by_role("textbox", name="New title")
    box.fill("Trip pl")
    start_turn(client, newer, "more activity elsewhere")
    expect(names.first).to_have_text("newer one")  # moved (the link is hidden: its old title)
    page.wait_for_timeout(300)  # a blur's PATCH, had one gone, has landed
    assert session_body(client, newer)["title"] == "newer one", "a half-typed title was saved"
    expect(box).to_be_focused()
    box.press("End")
    box.type("ans")
    box.press("Enter")
    expect(names.first).to_have_text("Trip plans")
    assert session_body(client, newer)["title"] == "Trip plans"
    wait_idle(client, newer)


def test_a_system_prompt_the_server_did_not_take_stays_in_its_dialog(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Save in the System prompt dialog while the server is unreachable: the dialog closed,
    the typed prompt was gone, and the error's notice was replaced by the offline banner,
    which cleared itself once the server was back: nothing said the prompt was not saved."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "hi")
    wait_settled(page)
    sid = session_id_of(page)
    prompt = "You are a careful reviewer. Answer in short sentences."
    page.get_by_role("button", name="System prompt (none)").click()
    dialog = page.get_by_role("dialog", name="System prompt")
    area = dialog.get_by_role("textbox", name="System prompt text")
    area.fill(prompt)
    web_server.stop()
    expect(page.locator("#conn")).to_have_text("Reconnecting…")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator("#system-prompt-note")).to_contain_text("Not saved")
    expect(dialog).to_be_visible()
    expect(area).to_have_value(prompt)

    web_server.start()
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_role("button", name="System prompt (this session's)")).to_be_visible()
    with httpx.Client(base_url=web_server.base_url) as client:
        assert session_body(client, sid)["system_prompt"] == prompt


def test_a_default_system_prompt_the_server_did_not_take_stays_in_settings(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Save in Settings while the server is unreachable: the dialog closed and the typed
    default system prompt was gone (the next open read the server's again)."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    page.get_by_role("button", name="Settings").click()
    dialog = page.get_by_role("dialog", name="Settings")
    prompt = dialog.get_by_label("Default system prompt")
    expect(prompt).to_be_enabled()
    prompt.fill("Be brief.")
    web_server.stop()
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.get_by_role("alert")).to_contain_text("Not saved")
    expect(dialog).to_be_visible()
    expect(prompt).to_have_value("Be brief.")

    web_server.start()
    dialog.get_by_role("button", name="Save").click()
    with httpx.Client(base_url=web_server.base_url) as client:
        wait_until(  # the PATCH goes once the dialog has closed
            lambda: client.get("/api/settings").json()["default_system_prompt"] == "Be brief.",
            what="the default system prompt saved",
        )
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Settings").click()
    expect(prompt).to_have_value("Be brief.")
    expect(dialog.get_by_role("alert")).to_be_hidden()


def test_a_queued_message_edit_the_server_did_not_take_stays_in_its_editor(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """Enter in a queued message's editor while the server is unreachable: the editor closed,
    the queue showed the old text again and the edit was gone, with nothing to say it was not
    saved. And an edit that came too late (the message was sent or removed meanwhile: 404)
    went the same way."""
    page, box, queued, sid = _queued_behind_a_held_run(context, openai_web, fake)

    queued.get_by_role("button", name="Edit").click()
    area = page.get_by_role("textbox", name="Edit queued message")
    area.fill("edited while offline")
    openai_web.stop()
    expect(page.locator("#conn")).to_have_text("Reconnecting…")
    area.press("Enter")
    expect(queued.get_by_role("alert")).to_contain_text("Not saved")
    expect(area).to_have_value("edited while offline")
    expect(area).to_be_focused()

    openai_web.start()
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
    area.press("Enter")
    expect(queued.locator(".queued-text")).to_have_text("edited while offline")
    expect(queued.get_by_role("alert")).to_have_count(0)
    client = httpx.Client(base_url=openai_web.base_url)
    assert [q["text"] for q in session_body(client, sid)["queued"]] == ["edited while offline"]

    # Removed elsewhere while the PATCH is on its way: the server answers 404, and the edit
    # goes to the composer rather than nowhere.
    [item] = session_body(client, sid)["queued"]

    def remove_first(route) -> None:
        client.delete("/api/chat/queue", params={"queue_id": item["queue_id"]})
        route.continue_()

    page.route("**/api/chat/queue?*", remove_first)
    queued.get_by_role("button", name="Edit").click()
    area.fill("too late")
    area.press("Enter")
    expect(queued).to_have_count(0)
    expect(box).to_have_value("too late")
    expect(page.locator("#notice-bar")).to_contain_text("Not saved")
    client.close()
    fake.release("hold")


def test_a_queued_edit_saved_by_clicking_away_reopens_without_taking_the_focus(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """A queued message's edit saved by clicking into the message box, while the server is
    unreachable: its editor opens again with the edit (not lost), and it took the focus back
    from the box, so what the user went on typing landed in the editor."""
    page, _, queued, _ = _queued_behind_a_held_run(context, openai_web, fake)
    box = page.get_by_role("textbox", name="Message", exact=True)
    queued.get_by_role("button", name="Edit").click()
    area = page.get_by_role("textbox", name="Edit queued message")
    area.fill("edited while offline")
    openai_web.stop()
    expect(page.locator("#conn")).to_have_text("Reconnecting…")
    box.click()  # the editor's blur saves, and the save fails
    expect(queued.get_by_role("alert")).to_contain_text("Not saved")
    expect(area).to_have_value("edited while offline")
    expect(box).to_be_focused()
    page.keyboard.type("next thought")
    expect(box).to_have_value("next thought")
    expect(area).to_have_value("edited while offline")
    openai_web.start()
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
    fake.release("hold")


def test_a_model_the_server_did_not_take_is_not_shown_as_picked(
    context: BrowserContext, openai_web: ServerProcess
) -> None:
    """A model picked while the server is unreachable: the PATCH failed, yet the picker kept
    showing the new model while the next turn would use the one in effect, and the error's
    notice was soon replaced by the offline banner."""
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "hi")
    wait_settled(page)
    sid = session_id_of(page)
    picker = page.get_by_role("combobox", name="Model")
    expect(picker).to_have_value("")  # Default (fake)
    openai_web.stop()
    expect(page.locator("#conn")).to_have_text("Reconnecting…")
    picker.select_option("fake-model")
    expect(picker).to_have_value("")
    expect(page.locator("#model-note")).to_contain_text("Not saved")

    openai_web.start()
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
    expect(picker).to_have_value("")
    expect(page.locator("#model-note")).to_contain_text("Not saved")
    with httpx.Client(base_url=openai_web.base_url) as client:
        assert session_body(client, sid)["model"] is None
        picker.select_option("fake-model")
        expect(page.locator("#model-note")).to_be_hidden()
        wait_until(lambda: session_body(client, sid)["model"] == "fake-model", what="saved")
    expect(picker).to_have_value("fake-model")


def test_a_picked_model_stays_shown_while_its_change_is_on_its_way(
    context: BrowserContext, openai_web: ServerProcess
) -> None:
    """Every redraw of the header before the PATCH answered (a run starting or ending, a
    rename in another tab) put the model in effect back in the picker, and the answer the
    picked one again: the picker flickered between the two while the server was slow."""
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "hi")
    wait_settled(page)
    sid = session_id_of(page)
    held: list[Route] = []
    page.route(
        "**/api/session",
        lambda route: held.append(route) if route.request.method == "PATCH" else route.continue_(),
    )
    picker = page.get_by_role("combobox", name="Model")
    picker.select_option("fake-model")
    for _ in range(100):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the PATCH never left the page"
    with httpx.Client(base_url=openai_web.base_url) as client:
        renamed = client.patch("/api/session", json={"session_id": sid, "title": "Elsewhere"})
        assert renamed.status_code == 200
        expect(page.locator("#session-title")).to_have_text("Elsewhere")  # the header redrawn
        expect(picker).to_have_value("fake-model")
        held[0].continue_()
        wait_until(lambda: session_body(client, sid)["model"] == "fake-model", what="saved")
    expect(picker).to_have_value("fake-model")
    expect(page.locator("#model-note")).to_be_hidden()


def test_a_queued_message_that_leaves_the_queue_while_edited_leaves_the_edit_in_the_composer(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """The queued message being edited leaves the queue (sent as it was when the run ended)
    before the edit is saved: its row goes, and what was typed in its editor must not go with
    it. It holds through the editor's blur as its row is removed (a save, refused with 404
    `queue_item_not_found`, which puts the edit in the composer)."""
    page, box, queued, sid = _queued_behind_a_held_run(context, openai_web, fake)

    queued.get_by_role("button", name="Edit").click()
    area = page.get_by_role("textbox", name="Edit queued message")
    area.fill("queued words, and a second thought")
    fake.script(reply(text("answered the queued one")))
    fake.release("hold")  # the run ends and the queue sends its message as it was
    expect(queued).to_have_count(0)
    expect(box).to_have_value("queued words, and a second thought")
    expect(page.locator("#notice-bar")).to_contain_text("Not saved")
    wait_settled(page)
    with httpx.Client(base_url=openai_web.base_url) as client:
        assert session_body(client, sid)["queued"] == []


def test_a_message_queued_before_a_stop_waits_for_send_now_through_a_retry(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """Queued while a run streamed, then Stop, then Retry (Regenerate on the stopped
    answer): when the new answer came, the queued message went by itself after it, onto
    the new branch, though after a Stop the queue waits for "Send now" (docs/api.md §4).
    It waits through the retry; "Send now" sends it after the answer shown."""
    page, _, queued, sid = _queued_behind_a_held_run(context, openai_web, fake)
    page.get_by_role("button", name="Stop").click()
    fake.release("hold")
    wait_settled(page)
    expect(queued.get_by_role("button", name="Send now")).to_be_visible()

    fake.script(reply(text("retried answer")), reply(text("answer to the queued one")))
    answer = page.locator("#transcript .rows > .row.assistant").first
    answer.get_by_role("button", name="Regenerate").click()
    expect(answer).to_contain_text("retried answer")
    wait_settled(page)
    page.wait_for_timeout(500)  # a queued start, had one gone, has come back as events
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(1)
    expect(queued.locator(".queued-text")).to_have_text("queued words")
    with httpx.Client(base_url=openai_web.base_url) as client:
        body = session_body(client, sid)
        assert [m["content"] for m in body["messages"]] == ["first", "retried answer"]
        assert [q["text"] for q in body["queued"]] == ["queued words"]

        queued.get_by_role("button", name="Send now").click()
        expect(page.locator("#transcript .rows > .row.user")).to_have_count(2)
        wait_settled(page)
        expect(queued).to_have_count(0)
        assert [m["content"] for m in session_body(client, sid)["messages"]] == [
            "first",
            "retried answer",
            "queued words",
            "answer to the queued one",
        ]
