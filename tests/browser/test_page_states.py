"""States that tell the truth (issue 15.4): an unreachable server shown on the running turn
and the banner cleared when it is back; the header and tab title show a running session; a
new chat's title as soon as the server has it (during the first run, after a restart);
sidebar rows with relative time and a failed last run; empty states (no empty status pill).
Layers: the page, and the sidebar row's new `last_run_state` (a projection of
`run.finished`; invariant 4: it never moves `updated_at` or the order)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, barrier, error, reasoning, reply, text, tool_call
from helpers import ServerProcess, running_server
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow


@pytest.fixture
def openai_web(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    (tmp_path / "ws").mkdir()
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
        *("--workspace", str(tmp_path / "ws")),
    ) as srv:
        yield srv


def test_header_and_tab_show_a_running_session_and_its_title_from_the_first_run(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "/slow plan the garden")
    expect(page.locator(".row.live")).to_have_count(1)
    badge = page.locator("#run-badge")
    expect(badge).to_have_text("Running")
    expect(page.locator("#session-title")).to_have_text("/slow plan the garden")
    # the title isolated (U+2068 ... U+2069): a right-to-left one cannot reorder the rest
    expect(page).to_have_title("● \u2068/slow plan the garden\u2069 · Tether")
    sid = session_id_of(page)

    web_server.kill()
    web_server.start()  # after a restart the title is still the server's
    other = context.new_page()
    open_app(other, web_server.base_url, f"/s/{sid}")
    expect(other.locator("#session-title")).to_have_text("/slow plan the garden")
    wait_settled(page)
    expect(badge).to_be_hidden()
    expect(page).to_have_title("\u2068/slow plan the garden\u2069 · Tether")


def test_an_unreachable_server_shows_on_the_running_turn_and_clears_when_back(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "/slow keep going")
    expect(page.locator(".tool-card").first).to_be_attached(timeout=20_000)
    web_server.kill()
    working = page.locator(".row.live .working")
    expect(working).to_have_text("Server unreachable: reconnecting…", timeout=15_000)
    page.wait_for_timeout(1500)
    expect(working).to_have_text("Server unreachable: reconnecting…")  # the timer stopped
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_disabled()
    expect(stop).to_have_attribute("title", "The server is unreachable: Stop waits for it")
    banner = page.locator("#notice-bar")
    expect(banner).to_contain_text("The server is unreachable")
    web_server.start()
    expect(page.locator("#conn")).to_have_text("Live", timeout=20_000)
    expect(banner).to_be_hidden()  # the banner cleared itself
    wait_settled(page)


def test_a_session_opened_while_the_server_is_unreachable_opens_when_it_is_back(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A session clicked in the sidebar while the server was down showed a New chat ("Start
    a conversation", the address back to /) with no connection at all, and stayed so once
    the server was back: a message typed there started a new session instead of going on
    with the one chosen. Now the session stays chosen (its address, its draft), the page
    says the server is unreachable, and the session opens when the server answers."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "alpha words")
    wait_settled(page)
    alpha = session_id_of(page)
    page.get_by_role("textbox", name="Message").fill("alpha draft")
    page.get_by_role("button", name="New chat").click()
    send(page, "beta words")
    wait_settled(page)
    web_server.kill()
    expect(page.locator("#conn")).to_have_text(re.compile("Reconnecting|Stalled"), timeout=15_000)
    page.locator(f'.session-row[data-key="{alpha}"] .session-link').click()
    expect(page.locator("#notice-bar")).to_contain_text("The server is unreachable")
    page.wait_for_timeout(1500)
    assert page.evaluate("location.pathname") == f"/s/{alpha}"
    expect(page.locator("#empty-state")).to_be_hidden()
    expect(page.get_by_role("textbox", name="Message")).to_have_value("alpha draft")
    web_server.start()
    expect(page.locator("#conn")).to_have_text("Live", timeout=20_000)
    expect(page.locator("#transcript .row.user")).to_have_text(["alpha words"])
    expect(page.locator("#notice-bar")).to_be_hidden()


def test_sidebar_rows_show_relative_time_a_failed_run_and_empty_states(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    page = context.new_page()
    open_app(page, openai_web.base_url)
    sidebar = page.locator("#session-list")
    expect(sidebar).to_have_text("No sessions yet. Start one with New chat.")
    # no stream followed yet: no status to say, and no empty pill saying nothing
    expect(page.locator("#conn")).to_be_hidden()
    fake.script(error(500, "the provider broke"))
    send(page, "this will fail")
    expect(page.locator(".terminal.error")).to_have_count(1, timeout=20_000)
    expect(page.locator("#conn")).to_be_visible()
    row = page.locator(".session-row").first
    expect(row.locator(".session-when")).to_have_text("now")
    expect(row.locator(".session-failed")).to_have_text("failed")
    expect(page.get_by_role("link", name="this will fail, last run failed")).to_be_visible()
    page.reload()  # the server's row says so, not only this tab
    expect(page.locator(".session-row .session-failed")).to_have_text("failed")

    fake.script(reply(text("fine"), barrier("hold")))
    send(page, "again")
    expect(page.locator(".session-row .session-failed")).to_have_text("")  # running now
    fake.release("hold")
    wait_settled(page)
    expect(page.locator(".session-row .session-failed")).to_have_text("")
    page.get_by_role("searchbox", name="Search sessions").fill("zebra")
    expect(sidebar).to_have_text("No session matches “zebra”.")


def test_a_queued_message_offers_send_now_after_stop(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "/slow a long one")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    box = page.get_by_role("textbox", name="Message")
    box.fill("and then this")
    box.press("Enter")  # queued while running
    queued = page.locator("#queue li")
    expect(queued).to_contain_text("and then this")
    send_now = queued.get_by_role("button", name="Send now")
    expect(send_now).to_be_hidden()  # the run will start it when it completes
    page.get_by_role("button", name="Stop").click()
    wait_settled(page)
    expect(send_now).to_be_visible()  # stopped: the queue waits, and says how to go on
    page.reload()
    send_now = page.locator("#queue li").get_by_role("button", name="Send now")
    send_now.click()
    expect(page.locator(".row.user").last).to_have_text("and then this")
    expect(page.locator("#queue li")).to_have_count(0)
    wait_settled(page)


def test_the_worklog_says_what_happened_and_live_thinking_is_open(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(reasoning("weighing the options"), tool_call("c1", "list_files", {}), barrier("b")),
        reply(tool_call("c2", "list_files", {})),
        reply(text("All done.")),
    )
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "work")
    thinking = page.locator(".row.live .reasoning-text")
    expect(thinking).to_have_text("weighing the options")
    expect(thinking).to_be_visible()  # readable without a click
    fake.release("b")
    wait_settled(page)
    head = page.locator(".row.assistant .working")
    expect(head).to_have_text(re.compile(r"^Activity: Thought · 2 tools · Done in \d+ s$"))
    expect(page.locator(".row.assistant .reasoning-text")).to_be_hidden()  # folded when settled
    page.select_option("#display-mode", "final")
    expect(head).to_have_text(re.compile(r"^Done in \d+ s$"))


def test_compression_leaves_a_mark_in_settled_history_and_after_a_reload(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.context_length = 400
    fake.script(reply(text("word " * 300), usage={"prompt_tokens": 10, "completion_tokens": 330}))
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "first")
    wait_settled(page)
    fake.script(reply(text("handoff summary for the agent")), reply(text("second answer")))
    send(page, "second")
    wait_settled(page)
    for view in (page, context.new_page()):
        if view is not page:
            open_app(view, openai_web.base_url, f"/s/{session_id_of(page)}")
        mark = view.locator(".rows > .context-mark")
        expect(mark).to_have_text(
            re.compile(r"^Context compressed: [\d,]+ → [\d,]+ tokens\. The model sees the turns")
        )
        order = view.locator(".rows > [data-key]").evaluate_all(
            "(rows) => rows.map((r) => r.classList.contains('context-mark') ? 'mark'"
            " : (r.classList.contains('user') ? 'user' : 'assistant')"
            " + (r.classList.contains('excluded') ? '-excluded' : ''))"
        )
        assert order == ["user-excluded", "assistant-excluded", "mark", "user", "assistant"]
        expect(view.locator(".row.user.excluded .excluded-note")).to_contain_text(
            "Not in the model's context. Summarized by automatic context compression"
        )
        expect(view.locator("#transcript")).not_to_contain_text("handoff summary for the agent")
