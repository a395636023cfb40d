"""The page's Edit, Regenerate and "‹ 2/3 ›" branch switcher (docs/page.md, docs/api.md §10):
the real page in headless Chromium against the real server. Layers: the page (reducer and
renderer fold `transcript.truncated` / `branch.switched` live), the transcript and the model
context (invariant 1: the page shows the branch the model gets), the sidebar row
(invariant 4: a switch marks nothing unread in another tab)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

from helpers import ServerProcess, running_server, session_body, wait_idle, wait_until
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow


def user_texts(page: Page) -> list[str]:
    return page.locator("#transcript .rows > .row.user .user-text").all_inner_texts()


def context_users(base_url: str, sid: str) -> list[str]:
    context = httpx.get(base_url + "/api/session/context", params={"session_id": sid}).json()
    return [m["content"] for m in context["context_messages"] if m["role"] == "user"]


def test_edit_regenerate_and_switch_from_the_page(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "first question")
    wait_settled(page)
    send(page, "second question")
    wait_settled(page)
    sid = session_id_of(page)
    rows = page.locator("#transcript .rows > .row")

    # Edit the second message: it becomes a new branch beside the old one.
    second = page.locator("#transcript .rows > .row.user").nth(1)
    second.get_by_role("button", name="Edit").click()
    box = second.get_by_role("textbox", name="Edit message")
    expect(box).to_have_value("second question")
    box.fill("second, edited")
    second.get_by_role("button", name="Save and send").click()
    expect(second.locator(".user-text")).to_have_text("second, edited")  # the events came
    wait_settled(page)
    assert user_texts(page) == ["first question", "second, edited"]
    expect(second.get_by_label("Branch 2 of 2")).to_be_visible()
    expect(second.get_by_role("button", name="Next branch")).to_be_disabled()
    assert context_users(web_server.base_url, sid) == ["first question", "second, edited"]
    # A row's text is the message alone: the controls draw their labels from CSS.
    assert second.locator(".user-text").inner_text() == "second, edited"

    # Another tab on the same session follows the switch live.
    other = context.new_page()
    open_app(other, web_server.base_url, f"/s/{sid}")
    expect(other.locator("#transcript .rows > .row.user")).to_have_count(2)

    second.get_by_role("button", name="Previous branch").click()
    expect(second.get_by_label("Branch 1 of 2")).to_be_visible()
    assert user_texts(page) == ["first question", "second question"]
    assert context_users(web_server.base_url, sid) == ["first question", "second question"]
    expect(
        other.locator("#transcript .rows > .row.user").nth(1).get_by_label("Branch 1 of 2")
    ).to_be_visible()
    expect(other.locator("#transcript .rows > .row.user .user-text").nth(1)).to_have_text(
        "second question"
    )
    # ... and a reload shows the same branch.
    page.reload()
    wait_settled(page)
    assert user_texts(page) == ["first question", "second question"]

    # Regenerate the last answer: a new answer beside the old one.
    answer = page.locator("#transcript .rows > .row.assistant").last
    old_id = answer.get_attribute("data-row-id")
    answer.get_by_role("button", name="Regenerate").click()
    answer = page.locator("#transcript .rows > .row.assistant").last
    expect(answer.get_by_label("Branch 2 of 2")).to_be_visible()  # the events came
    wait_settled(page)
    expect(rows).to_have_count(4)
    assert answer.get_attribute("data-row-id") != old_id
    answer.get_by_role("button", name="Previous branch").click()
    expect(page.locator("#transcript .rows > .row.assistant").last).to_have_attribute(
        "data-row-id", str(old_id)
    )
    body = session_body(httpx.Client(base_url=web_server.base_url), sid)
    assert body["messages"][-1]["id"] == old_id
    assert body["messages"][-1]["branch"] == {"index": 1, "count": 2}

    # The other tab, which saw every switch, marks nothing unread; both tabs show one scene.
    other.goto(web_server.base_url + "/")
    item = other.get_by_role("button", name="first question")
    expect(item).to_be_visible()
    expect(item).not_to_contain_text("unread")
    assert "unread" not in (item.get_attribute("aria-label") or "")


def test_controls_wait_for_the_run_and_retry_after_stop_is_a_regenerate(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "warm up")
    wait_settled(page)
    sid = session_id_of(page)
    send(page, "/slow a long one")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_visible()
    first = page.locator("#transcript .rows > .row.user").first
    expect(first.get_by_role("button", name="Edit")).to_be_disabled()
    expect(
        page.locator("#transcript .rows > .row.assistant").first.get_by_role(
            "button", name="Regenerate"
        )
    ).to_be_disabled()
    stop.click()
    wait_settled(page)
    stopped = page.locator("#transcript .rows > .row.assistant").last
    expect(stopped).to_contain_text("Stopped")
    stopped.get_by_role("button", name="Regenerate").click()
    with httpx.Client(base_url=web_server.base_url) as client:
        body = wait_idle(client, sid, timeout=60)
    wait_settled(page)
    assert body["messages"][-1]["state"] == "completed"
    assert body["messages"][-1]["branch"] == {"index": 2, "count": 2}
    expect(page.locator("#transcript .rows > .row.assistant").last).not_to_contain_text("Stopped")
    expect(page.locator("#transcript .rows > .row")).to_have_count(4)


def test_an_edit_keeps_or_drops_the_messages_attachments(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        data = base64.b64encode(b"ZEBRA-42").decode()
        attachment = {"name": "notes.txt", "mime": "text/plain", "data_base64": data}
        client.post(
            "/api/chat/start",
            json={"session_id": sid, "message": "see file", "attachments": [attachment]},
        ).raise_for_status()
        wait_idle(client, sid)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    wait_settled(page)
    row = page.locator("#transcript .rows > .row.user").first
    expect(row.locator(".file-chip")).to_have_text("notes.txt")

    row.get_by_role("button", name="Edit").click()
    kept = row.get_by_role("list", name="Attachments")
    expect(kept).to_contain_text("notes.txt")
    row.get_by_role("textbox", name="Edit message").fill("same file, new words")
    row.get_by_role("button", name="Save and send").click()
    expect(row.locator(".user-text")).to_have_text("same file, new words")
    wait_settled(page)
    expect(row.locator(".file-chip")).to_have_text("notes.txt")  # kept

    row.get_by_role("button", name="Edit").click()
    row.get_by_role("button", name="Remove notes.txt").click()
    row.get_by_role("textbox", name="Edit message").fill("no file now")
    row.get_by_role("button", name="Save and send").click()
    expect(row.get_by_label("Branch 3 of 3")).to_be_visible()
    wait_settled(page)
    expect(row.locator(".file-chip")).to_have_count(0)
    with httpx.Client(base_url=web_server.base_url) as client:
        body = session_body(client, sid)
        assert body["messages"][0]["attachments"] == []
        assert [a["name"] for a in body["branches"]["hidden"][0]["attachments"]] == ["notes.txt"]
    row.get_by_role("button", name="Previous branch").click()
    expect(row.get_by_label("Branch 2 of 3")).to_be_visible()
    expect(row.locator(".file-chip")).to_have_text("notes.txt")


def test_an_edit_whose_message_leaves_the_branch_shown_goes_to_the_composer(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """The message being edited stops being shown before the edit is saved (another tab
    regenerated an earlier answer, hiding it with the rest of its branch): its row goes, and
    what was typed in its box must not go with it. It lands in the composer, unsent, with the
    files the edit kept."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "first question")
    wait_settled(page)
    sid = session_id_of(page)
    with httpx.Client(base_url=web_server.base_url) as client:
        data = base64.b64encode(b"ZEBRA-42").decode()
        attachment = {"name": "notes.txt", "mime": "text/plain", "data_base64": data}
        start_turn = {"session_id": sid, "message": "second question", "attachments": [attachment]}
        client.post("/api/chat/start", json=start_turn).raise_for_status()
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(2)
    wait_settled(page)

    second = page.locator("#transcript .rows > .row.user").nth(1)
    second.get_by_role("button", name="Edit").click()
    second.get_by_role("textbox", name="Edit message").fill("second, on second thought")
    with httpx.Client(base_url=web_server.base_url) as client:  # another tab
        first_answer = session_body(client, sid)["messages"][1]["id"]
        response = client.post(
            "/api/chat/regenerate", json={"session_id": sid, "row_id": first_answer}
        )
        assert response.status_code == 200, response.text
        wait_idle(client, sid)
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(1)
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_have_value(
        "second, on second thought"
    )
    expect(page.locator("#attachment-chips .chip-name")).to_have_text(["notes.txt"])
    expect(page.locator("#notice-bar")).to_contain_text("Your edit is in the composer")
    with httpx.Client(base_url=web_server.base_url) as client:  # nothing was sent
        users = [m for m in session_body(client, sid)["messages"] if m["role"] == "user"]
        assert [m["content"] for m in users] == ["first question"]

    # An edit saved here also removes its row, often before the POST answers: it was sent,
    # so nothing goes to the composer.
    page.get_by_role("textbox", name="Message", exact=True).fill("")
    page.locator("#attachment-chips").get_by_role("button", name="Remove attachment").click()
    page.get_by_role("button", name="Dismiss").click()
    first = page.locator("#transcript .rows > .row.user").first
    first.get_by_role("button", name="Edit").click()
    first.get_by_role("textbox", name="Edit message").fill("first, edited")
    first.get_by_role("button", name="Save and send").click()
    expect(first.locator(".user-text")).to_have_text("first, edited")
    wait_settled(page)
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_have_value("")
    expect(page.locator("#notice-bar")).to_be_hidden()


def test_two_quick_clicks_on_a_switcher_show_the_branch_two_steps_on(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """ "›" clicked twice before the first switch's events arrived: the second click named the
    row the first one had just hidden, and the server's 404 `row_not_found` told the user to
    reload. The clicks go one after the other, each from where the one before left the fork."""
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        client.post("/api/chat/start", json={"session_id": sid, "message": "pick one"})
        wait_idle(client, sid)
        for _ in range(2):
            client.post("/api/chat/regenerate", json={"session_id": sid}).raise_for_status()
            wait_idle(client, sid)
        answer = session_body(client, sid)["messages"][1]
        shown = client.post(
            "/api/session/branch", json={"session_id": sid, "row_id": answer["id"], "index": 1}
        )
        assert shown.json()["session"]["messages"][1]["branch"] == {"index": 1, "count": 3}
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    wait_settled(page)
    row = page.locator("#transcript .rows > .row.assistant")
    expect(row.get_by_label("Branch 1 of 3")).to_be_visible()

    # Both clicks land before anything comes back.
    row.get_by_role("button", name="Next branch").evaluate("(b) => { b.click(); b.click(); }")
    expect(row.get_by_label("Branch 3 of 3")).to_be_visible()
    expect(page.locator("#notice-bar")).to_be_hidden()
    with httpx.Client(base_url=web_server.base_url) as client:
        body = session_body(client, sid)
    assert body["messages"][1]["branch"] == {"index": 3, "count": 3}


def test_an_edit_refused_on_a_rotated_session_brings_its_attachments_to_the_continuation(
    context: BrowserContext, tmp_path: Path
) -> None:
    """A stale tab edits a message with a file on a session that continues in a newer one:
    409 `session_rotated` puts the edit in the continuation's composer, and the files it kept
    must come with it as draft chips (they came back without them, and the notice said the
    message was there to send again)."""
    rotating = ("--context-window", "256", "--compression-mode", "rotate")
    with running_server(tmp_path / "data", *rotating, env={"TETHER_DEMO_DELAY": "0.002"}) as srv:
        with httpx.Client(base_url=srv.base_url) as client:
            parent = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        stale = context.new_page()
        open_app(stale, srv.base_url, f"/s/{parent}")
        with httpx.Client(base_url=srv.base_url) as client:
            data = base64.b64encode(b"ZEBRA-42").decode()
            client.post(
                "/api/chat/start",
                json={
                    "session_id": parent,
                    "message": "hello " * 150,  # the demo's usage then crosses 80% of 256
                    "attachments": [
                        {"name": "notes.txt", "mime": "text/plain", "data_base64": data}
                    ],
                },
            ).raise_for_status()
            child = wait_until(
                lambda: session_body(client, parent)["continuation_session_id"], what="rotation"
            )
            wait_idle(client, parent)
            before_child = session_body(client, child)["last_seq"]
        wait_settled(stale)
        stale.evaluate("window.tether.stream.stop()")  # a tab that missed it all
        row = stale.locator("#transcript .rows > .row.user").first
        row.get_by_role("button", name="Edit").click()
        row.get_by_role("textbox", name="Edit message").fill("hello, shorter")
        row.get_by_role("button", name="Save and send").click()
        expect(stale).to_have_url(f"{srv.base_url}/s/{child}")
        expect(stale.get_by_role("textbox", name="Message", exact=True)).to_have_value(
            "hello, shorter"
        )
        expect(stale.locator("#attachment-chips .chip-name")).to_have_text(["notes.txt"])
        with httpx.Client(base_url=srv.base_url) as client:
            assert session_body(client, child)["last_seq"] == before_child  # never resent
        stale.get_by_role("textbox", name="Message", exact=True).press("Enter")  # sent by the user
        with httpx.Client(base_url=srv.base_url) as client:
            wait_until(lambda: session_body(client, child)["messages"], what="the sent turn")
            [user] = [m for m in wait_idle(client, child)["messages"] if m["role"] == "user"]
            assert [a["name"] for a in user["attachments"]] == ["notes.txt"]
            assert client.get(user["attachments"][0]["url"]).content == b"ZEBRA-42"


def test_an_edit_saved_twice_in_a_row_is_sent_once_without_a_false_error(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Ctrl+Enter pressed twice in an edit box (a key repeat, an impatient hand): the second
    save went out too, and its refusal (409 `session_busy` behind the first one's run, or 404
    once that run hid the row) said the edit failed, or put the sent text in the composer."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "first question")
    wait_settled(page)
    sid = session_id_of(page)
    row = page.locator("#transcript .rows > .row.user").first
    row.get_by_role("button", name="Edit").click()
    area = row.get_by_role("textbox", name="Edit message")
    area.fill("first, edited")
    area.evaluate(
        """(a) => { for (let i = 0; i < 2; i++) a.dispatchEvent(new KeyboardEvent("keydown",
        { key: "Enter", ctrlKey: true, bubbles: true })); }"""
    )
    expect(row.locator(".user-text")).to_have_text("first, edited")
    wait_settled(page)
    with httpx.Client(base_url=web_server.base_url) as client:
        body = wait_idle(client, sid)
    assert body["messages"][0]["branch"] == {"index": 2, "count": 2}
    expect(page.locator("#notice-bar")).to_be_hidden()
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_have_value("")


def test_regenerate_clicked_twice_in_a_row_starts_one_run_without_a_false_error(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Regenerate double-clicked: the second POST went out behind the first one's run and
    its 409 `session_busy` said "A run is still using this session" while the new answer came."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "first question")
    wait_settled(page)
    sid = session_id_of(page)
    answer = page.locator("#transcript .rows > .row.assistant").first
    answer.get_by_role("button", name="Regenerate").evaluate("(b) => { b.click(); b.click(); }")
    with httpx.Client(base_url=web_server.base_url) as client:
        wait_until(lambda: session_body(client, sid)["messages"][-1].get("branch"), what="run")
        body = wait_idle(client, sid)
    assert body["messages"][1]["branch"] == {"index": 2, "count": 2}
    wait_settled(page)
    expect(page.locator("#notice-bar")).to_be_hidden()


def test_an_edit_left_open_for_another_session_is_open_again_on_coming_back(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """An edit of a message, half typed, then another session opened in the sidebar: coming
    back, the box was closed and what was typed was gone. It is open again as it was left,
    with the files it had dropped still dropped; one whose message was replaced meanwhile
    (another tab edited it) goes to the composer, and one of a session deleted meanwhile
    too."""
    with httpx.Client(base_url=web_server.base_url) as client:
        data = base64.b64encode(b"ZEBRA-42").decode()
        attachment = {"name": "notes.txt", "mime": "text/plain", "data_base64": data}
        sid = client.post("/api/sessions", json={"title": "Files"}).json()["session"]["session_id"]
        turn = {"session_id": sid, "message": "see file", "attachments": [attachment]}
        client.post("/api/chat/start", json=turn).raise_for_status()
        wait_idle(client, sid)
        other = client.post("/api/sessions", json={"title": "Other"}).json()["session"]
        client.post(
            "/api/chat/start", json={"session_id": other["session_id"], "message": "elsewhere"}
        ).raise_for_status()
        wait_idle(client, other["session_id"])
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    wait_settled(page)
    row = page.locator("#transcript .rows > .row.user").first
    area = row.get_by_role("textbox", name="Edit message")
    link = page.locator(".session-link")

    row.get_by_role("button", name="Edit").click()
    area.fill("see file, and mind the second page")
    row.get_by_role("button", name="Remove notes.txt").click()
    link.filter(has_text="Other").click()
    expect(page.locator("#transcript .rows > .row.user").first).to_contain_text("elsewhere")
    link.filter(has_text="Files").click()
    expect(area).to_have_value("see file, and mind the second page")
    expect(row.get_by_role("button", name="Remove notes.txt")).to_have_count(0)
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_have_value("")

    # New chat and back (the browser's Back), then saved: sent without the file.
    page.get_by_role("button", name="New chat").click()
    expect(row).to_have_count(0)
    page.go_back()
    expect(area).to_have_value("see file, and mind the second page")
    row.get_by_role("button", name="Save and send").click()
    expect(row.locator(".user-text")).to_have_text("see file, and mind the second page")
    wait_settled(page)
    with httpx.Client(base_url=web_server.base_url) as client:
        assert session_body(client, sid)["messages"][0]["attachments"] == []

        # Replaced while away (another tab edited it): back, the edit is in the composer.
        row.get_by_role("button", name="Edit").click()
        area.fill("a third version")
        link.filter(has_text="Other").click()
        expect(page.locator("#transcript .rows > .row.user").first).to_contain_text("elsewhere")
        first = session_body(client, sid)["messages"][0]["id"]
        edit = {"session_id": sid, "message": "edited in another tab", "edit_of": first}
        client.post("/api/chat/start", json=edit).raise_for_status()
        wait_idle(client, sid)
        link.filter(has_text="Files").click()
        expect(row.locator(".user-text")).to_have_text("edited in another tab")
        box = page.get_by_role("textbox", name="Message", exact=True)
        expect(box).to_have_value("a third version")
        expect(page.locator("#notice-bar")).to_contain_text("Your edit is in the composer")
        expect(area).to_have_count(0)
        box.fill("")

        # Deleted while away: the edit is in the composer.
        row.get_by_role("button", name="Edit").click()
        area.fill("a fourth version")
        link.filter(has_text="Other").click()
        expect(page.locator("#transcript .rows > .row.user").first).to_contain_text("elsewhere")
        client.delete("/api/session", params={"session_id": sid}).raise_for_status()
        expect(link.filter(has_text="Files")).to_have_count(0)
        expect(box).to_have_value("a fourth version")
        expect(page.locator("#notice-bar")).to_contain_text("your edit is in the composer")
        shown = session_body(client, other["session_id"])["messages"]
        assert [m["content"] for m in shown if m["role"] == "user"] == ["elsewhere"]  # unsent


def test_a_switch_to_a_branch_opening_with_files_only_names_the_session_by_its_first_file(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A switch to a branch whose first message is files without text (an import brings
    such turns) titled the header and the sidebar row "New chat"; they now say the first
    file's name (the server's row, docs/api.md §3), and the edited branch's words again on
    a switch back."""
    data = base64.b64encode(b"ZEBRA-42").decode()
    attachment = {"name": "notes.txt", "mime": "text/plain", "data_base64": data}
    with httpx.Client(base_url=web_server.base_url) as client:
        original = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        turn = {"session_id": original, "message": "see file", "attachments": [attachment]}
        client.post("/api/chat/start", json=turn).raise_for_status()
        first = wait_idle(client, original)["messages"][0]["id"]
        edit = {"session_id": original, "message": "Plan the trip", "edit_of": first}
        client.post("/api/chat/start", json=edit).raise_for_status()
        wait_idle(client, original)
        export = client.get(f"/api/sessions/{original}/export").json()
        next(e for e in export["events"] if e["type"] == "turn.submitted")["data"]["text"] = ""
        imported = client.post("/api/sessions/import", content=json.dumps(export))
        sid = imported.json()["sessions"][0]["session_id"]
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    wait_settled(page)
    title = page.locator("#session-title")
    row = page.locator(f".session-row[data-key='{sid}'] .session-name")
    expect(title).to_have_text("Plan the trip")
    first_row = page.locator("#transcript .rows > .row.user").first
    first_row.get_by_role("button", name="Previous branch").click()
    expect(first_row.get_by_label("Branch 1 of 2")).to_be_visible()
    expect(title).to_have_text("notes.txt")
    expect(row).to_have_text("notes.txt")
    first_row.get_by_role("button", name="Next branch").click()
    expect(title).to_have_text("Plan the trip")
    expect(row).to_have_text("Plan the trip")
