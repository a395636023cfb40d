"""The page's controls: display modes from one scene, the composer (Enter, Shift+Enter, steer,
queue), keyboard navigation of the sidebar, mobile width, and a stale tab on a rotated
session (409 session_rotated: the continuation opens with the text restored, never resent)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, expect

from helpers import (
    ServerProcess,
    new_session,
    running_server,
    session_body,
    wait_idle,
    wait_until,
)
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow


def test_three_display_modes_show_one_scene(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "modes please")
    wait_settled(page)
    row = page.locator(".row.assistant")
    # Compact Worklog (default): progress text stays visible, activity collapsed to one line
    expect(row.locator(".item.interim")).to_contain_text("Let me look at your message")
    activity = row.locator("details.activity")
    expect(activity).to_have_count(2)
    expect(activity.last.locator(":scope > summary")).to_have_text("Thought · 2 tools")
    assert activity.last.evaluate("(d) => d.open") is False
    # Transparent Stream: every item is its own row, in order
    page.select_option("#display-mode", "stream")
    expect(row.locator(".items > [data-key]")).to_have_count(6)  # re-rendered on the next frame
    kinds = row.locator(".items > [data-key]").evaluate_all(
        "(els) => els.map((e) => e.classList[1])"
    )
    assert kinds == ["thinking", "markdown", "tool-card", "tool-card", "thinking", "markdown"]
    # Final answer only
    page.select_option("#display-mode", "final")
    expect(row.locator(".items > [data-key]")).to_have_count(1)
    expect(row).to_contain_text("offline demo runtime")
    expect(row).not_to_contain_text("Let me look at your message")
    page.reload()  # the choice is remembered
    expect(page.locator("#display-mode")).to_have_value("final")


def test_composer_keys_steer_and_queue(context: BrowserContext, web_server: ServerProcess) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    box = page.get_by_role("textbox", name="Message")
    box.fill("line one")
    box.press("Shift+Enter")
    box.type("line two")
    expect(box).to_have_value("line one\nline two")
    box.press("Enter")
    expect(page.locator(".row.user").first).to_have_text("line one\nline two")
    wait_settled(page)
    send(page, "/slow long task")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    box.fill("waiting in line")
    page.get_by_role("button", name="Queue").click()
    expect(page.locator("#queue li")).to_contain_text("waiting in line")
    box.fill("mind the budget")
    page.get_by_role("button", name="Steer").click()
    expect(box).to_have_value("")
    wait_settled(page)
    sid = session_id_of(page)
    with httpx.Client(base_url=web_server.base_url) as client:
        body = wait_idle(client, sid)
        for _ in range(100):  # the queued message starts once the run completes
            body = wait_idle(client, sid)
            if len(body["messages"]) == 6:
                break
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        assert users == ["line one\nline two", "/slow long task", "waiting in line"]
        steers = [i for i in body["messages"][3]["timeline"] if i["type"] == "steer"]
        assert steers and steers[0]["text"] == "mind the budget"
    expect(page.locator("#queue li")).to_have_count(0)


def test_sidebar_is_keyboard_navigable_and_names_state(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    with httpx.Client(base_url=web_server.base_url) as client:
        first = new_session(client, "Alpha")
        new_session(client, "Beta")
        client.patch("/api/session", json={"session_id": first, "pinned": True})
    page = context.new_page()
    open_app(page, web_server.base_url)
    expect(page.locator(".group-label")).to_have_text(["Pinned", "Today"])
    alpha = page.get_by_role("link", name="Alpha, pinned")
    alpha.focus()
    page.keyboard.press("ArrowDown")
    expect(page.get_by_role("link", name="Beta")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#session-title")).to_have_text("Beta")
    page.get_by_role("button", name="Actions for Beta").click()
    page.get_by_role("menuitem", name="Rename").click()
    page.get_by_role("textbox", name="New title").fill("Gamma")
    page.keyboard.press("Enter")
    expect(page.get_by_role("link", name="Gamma")).to_be_visible()
    page.get_by_role("button", name="Actions for Gamma").click()
    page.get_by_role("menuitem", name="Delete…").click()
    page.get_by_role("button", name="Delete").click()
    expect(page.get_by_role("link", name="Gamma")).to_have_count(0)


def test_mobile_width_opens_the_sidebar_from_a_menu(
    browser: Browser, web_server: ServerProcess
) -> None:
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    open_app(page, web_server.base_url)
    send(page, "hello from a phone")
    wait_settled(page)
    sidebar = page.locator("#sidebar")
    assert sidebar.bounding_box()["x"] < 0  # off-canvas
    page.get_by_role("button", name="Sessions").click()
    expect(page.get_by_role("link", name="hello from a phone")).to_be_in_viewport()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    ctx.close()


def test_a_stale_tab_on_a_rotated_session_restores_its_draft_in_the_continuation(
    context: BrowserContext, tmp_path: Path
) -> None:
    with running_server(
        tmp_path / "data",
        "--context-window",
        "256",
        "--compression-mode",
        "rotate",
        env={"TETHER_DEMO_DELAY": "0.002"},
    ) as server:
        with httpx.Client(base_url=server.base_url) as client:
            parent = new_session(client, "Long talk")
        stale = context.new_page()
        open_app(stale, server.base_url, f"/s/{parent}")
        with httpx.Client(base_url=server.base_url) as client:
            long_message = "hello " * 150  # the demo's usage then crosses 80% of 256
            client.post("/api/chat/start", json={"session_id": parent, "message": long_message})
            for _ in range(200):
                child = session_body(client, parent)["continuation_session_id"]
                if child:
                    break
                stale.wait_for_timeout(50)
            assert child
            before_child = session_body(client, child)["last_seq"]
        stale.evaluate("window.tether.stream.stop()")  # a tab that missed it all
        send(stale, "my carefully typed follow-up")
        expect(stale).to_have_url(f"{server.base_url}/s/{child}")
        expect(stale.get_by_role("textbox", name="Message")).to_have_value(
            "my carefully typed follow-up"
        )
        expect(stale.locator("#notice-bar")).to_contain_text("continues here")
        with httpx.Client(base_url=server.base_url) as client:
            assert session_body(client, child)["last_seq"] == before_child  # never resent
            assert [m["role"] for m in session_body(client, parent)["messages"]] == [
                "user",
                "assistant",
            ]
        expect(stale.locator(".inherited .row.user")).to_have_text(long_message)


def test_a_stale_tabs_attachments_come_back_with_its_draft_after_a_409(
    context: BrowserContext, tmp_path: Path
) -> None:
    """Contract: after 409 `session_rotated` the browser "restores the rejected text and
    attachments as a draft" in the continuation; nothing is resent until the user sends."""
    note = tmp_path / "notes.txt"
    note.write_bytes(b"the launch is on Tuesday\n")
    with running_server(
        tmp_path / "data",
        "--context-window",
        "256",
        "--compression-mode",
        "rotate",
        env={"TETHER_DEMO_DELAY": "0.002"},
    ) as server:
        with httpx.Client(base_url=server.base_url) as client:
            parent = new_session(client, "Long talk")
        stale = context.new_page()
        open_app(stale, server.base_url, f"/s/{parent}")
        with httpx.Client(base_url=server.base_url) as client:
            client.post("/api/chat/start", json={"session_id": parent, "message": "hello " * 150})
            for _ in range(200):
                child = session_body(client, parent)["continuation_session_id"]
                if child:
                    break
                stale.wait_for_timeout(50)
            assert child
            wait_idle(client, parent)
            before_child = session_body(client, child)["last_seq"]
        stale.evaluate("window.tether.stream.stop()")  # a tab that missed it all
        stale.locator("#file-input").set_input_files(str(note))
        expect(stale.locator("#attachment-chips .chip-name")).to_have_text(["notes.txt"])
        send(stale, "see the attached notes")
        expect(stale).to_have_url(f"{server.base_url}/s/{child}")
        box = stale.get_by_role("textbox", name="Message")
        expect(box).to_have_value("see the attached notes")
        expect(stale.locator("#attachment-chips .chip-name")).to_have_text(["notes.txt"])
        with httpx.Client(base_url=server.base_url) as client:
            assert session_body(client, child)["last_seq"] == before_child  # never resent
        box.press("Enter")  # the user sends again: text and file go to the continuation
        with httpx.Client(base_url=server.base_url) as client:
            wait_until(lambda: session_body(client, child)["messages"], what="the sent turn")
            body = wait_idle(client, child)
            [user] = [m for m in body["messages"] if m["role"] == "user"]
            assert user["content"] == "see the attached notes"
            assert [a["name"] for a in user["attachments"]] == ["notes.txt"]
            stored = client.get(user["attachments"][0]["url"])
            assert stored.content == b"the launch is on Tuesday\n"
        expect(stale.locator("#attachment-chips .chip-name")).to_have_count(0)
