"""A message sent from a tab whose view another tab changed meanwhile (docs/page.md,
"Composer"; docs/api.md §4 `after_seq`): the real page in headless Chromium, two tabs, the
real server. Layers: the page's composer and reducer (the position it sends is the seq its
view is folded to) and run admission; contract invariant 1, what the user sees is what the
model gets. Tab A's stream is held back (a slow or reconnecting connection) while tab B
switches the session to another branch: A's message, sent under the branch it still shows,
is refused (409 `transcript_changed`), its text and file come back to its composer, it
says so and shows the branch now current; sent again, it goes after that branch. So is a
Retry (Regenerate on a stopped answer): refused, it regenerates nothing on a branch the user
is not looking at, and the branch now current is shown; an edit's "Save and send", whose
text stays in its box; and a Queue that would start the message at once."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, Route, expect

from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle, wait_until
from pagekit import chips, composer, open_app, send

pytestmark = pytest.mark.slow


def user_texts(page: Page) -> list[str]:
    return page.locator("#transcript .rows > .row.user .user-text").all_inner_texts()


def edit_and_show_the_first_branch(client: httpx.Client, sid: str, row_id: str) -> None:
    """The second message edited (branch 2), then branch 1 shown again."""
    start_turn(client, sid, "two, edited", edit_of=row_id)
    edited = wait_idle(client, sid)["messages"][2]
    back = {"session_id": sid, "row_id": edited["id"], "index": 1}
    assert client.post("/api/session/branch", json=back).status_code == 200


def tab_behind(
    context: BrowserContext, server: ServerProcess, sid: str
) -> tuple[Page, list[Route]]:
    """A tab on `sid` whose event stream never gets through (its requests held)."""
    page = context.new_page()
    held: list[Route] = []
    page.route("**/api/sessions/*/events*", lambda route: held.append(route))
    open_app(page, server.base_url, f"/s/{sid}")
    return page, held


def second_branch_in_tab_b(context: BrowserContext, server: ServerProcess, sid: str) -> int:
    """Another tab shows branch 2 ("two, edited"): the session's last seq after its switch."""
    b = context.new_page()
    open_app(b, server.base_url, f"/s/{sid}")
    b.locator("#transcript .rows > .row.user").nth(1).get_by_role(
        "button", name="Next branch"
    ).click()
    expect(b.locator("#transcript .rows > .row.user .user-text").nth(1)).to_have_text("two, edited")
    with httpx.Client(base_url=server.base_url) as client:
        return int(session_body(client, sid)["last_seq"])


def test_a_send_from_a_tab_behind_another_tabs_switch_is_refused_and_given_back(
    context: BrowserContext, web_server: ServerProcess, tmp_path: Path
) -> None:
    note = tmp_path / "notes.txt"
    note.write_bytes(b"the launch is on Tuesday\n")
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = new_session(client)
        for message in ("one", "two"):
            start_turn(client, sid, message)
            wait_idle(client, sid)
        two = session_body(client, sid)["messages"][2]
        edit_and_show_the_first_branch(client, sid, two["id"])

    a, held = tab_behind(context, web_server, sid)
    expect(a.locator("#transcript .rows > .row.user .user-text")).to_have_count(2)
    assert user_texts(a) == ["one", "two"]
    assert held, "A's stream never asked"

    switched = second_branch_in_tab_b(context, web_server, sid)
    assert user_texts(a) == ["one", "two"]  # A has not heard of it

    a.locator("#file-input").set_input_files(str(note))
    expect(chips(a)).to_have_text(["notes.txt"])
    send(a, "three")
    notice = a.locator("#notice-bar")
    expect(notice).to_contain_text("changed in another tab")
    expect(notice).to_contain_text("current branch")
    expect(composer(a)).to_have_value("three")  # nothing typed is lost
    expect(chips(a)).to_have_text(["notes.txt"])
    # the branch now current, read again though A's stream is still held
    expect(a.locator("#transcript .rows > .row.user .user-text").nth(1)).to_have_text("two, edited")
    with httpx.Client(base_url=web_server.base_url) as client:
        assert session_body(client, sid)["last_seq"] == switched  # nothing was written

    for route in held:
        route.continue_()
    a.unroute("**/api/sessions/*/events*")
    composer(a).press("Enter")  # sent again, from the view now shown: it goes
    with httpx.Client(base_url=web_server.base_url) as client:
        wait_until(lambda: session_body(client, sid)["last_seq"] > switched, what="the turn")
        body = wait_idle(client, sid)
        users = [m for m in body["messages"] if m["role"] == "user"]
        assert [m["content"] for m in users] == ["one", "two, edited", "three"]
        assert [f["name"] for f in users[-1]["attachments"]] == ["notes.txt"]
    expect(a.locator("#transcript .rows > .row.user .user-text")).to_have_text(
        ["one", "two, edited", "three"]
    )


def test_a_retry_from_a_tab_behind_another_tabs_switch_is_refused_and_shows_the_branch(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layers: the page's Regenerate (branches.js, refusals.js: the position it sends) and run
    admission; contract invariant 1. Branch 1 ends with a stopped answer, which tab A shows
    with its Retry (Regenerate); tab B shows branch 2 while A's stream is held. A's Retry is
    refused (409 `transcript_changed`): no run, nothing written, a notice, and A shows
    branch 2. Regenerate of the answer now shown then goes, on branch 2."""
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = new_session(client)
        start_turn(client, sid, "one")
        wait_idle(client, sid)
        stream = start_turn(client, sid, "/slow two")["stream_id"]
        assert client.post("/api/chat/cancel", json={"stream_id": stream}).status_code == 200
        two = wait_idle(client, sid)["messages"][2]
        edit_and_show_the_first_branch(client, sid, two["id"])

    a, held = tab_behind(context, web_server, sid)
    stopped = a.locator("#transcript .rows > .row.assistant").last
    expect(stopped).to_contain_text("Stopped")
    assert user_texts(a) == ["one", "/slow two"]

    switched = second_branch_in_tab_b(context, web_server, sid)

    stopped.get_by_role("button", name="Regenerate").click()
    notice = a.locator("#notice-bar")
    expect(notice).to_contain_text("Not regenerated")
    expect(notice).to_contain_text("changed in another tab")
    expect(a.locator("#transcript .rows > .row.user .user-text").nth(1)).to_have_text("two, edited")
    with httpx.Client(base_url=web_server.base_url) as client:
        assert session_body(client, sid)["last_seq"] == switched  # nothing was written

    for route in held:
        route.continue_()
    a.unroute("**/api/sessions/*/events*")
    answer = a.locator("#transcript .rows > .row.assistant").last
    answer.get_by_role("button", name="Regenerate").click()
    expect(answer.get_by_label("Branch 2 of 2")).to_be_visible()
    with httpx.Client(base_url=web_server.base_url) as client:
        wait_until(lambda: session_body(client, sid)["last_seq"] > switched, what="the run")
        body = wait_idle(client, sid)
    assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [
        "one",
        "two, edited",
    ]
    assert body["messages"][-1]["branch"] == {"index": 2, "count": 2}
    assert body["messages"][-1]["state"] == "completed"


def test_an_edit_from_a_tab_behind_another_tabs_switch_is_refused_and_stays_open(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layers: the page's edit (branches.js: the position it sends with `edit_of`) and run
    admission; contract invariant 1. Tab A, its stream held, edits the first message (shown
    on both branches) after tab B showed branch 2: "Save and send" is refused (409
    `transcript_changed`), nothing is written, the edit stays open with its text, and A shows
    branch 2; saved again from there, it goes."""
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = new_session(client)
        for message in ("one", "two"):
            start_turn(client, sid, message)
            wait_idle(client, sid)
        two = session_body(client, sid)["messages"][2]
        edit_and_show_the_first_branch(client, sid, two["id"])

    a, held = tab_behind(context, web_server, sid)
    expect(a.locator("#transcript .rows > .row.user .user-text")).to_have_text(["one", "two"])
    switched = second_branch_in_tab_b(context, web_server, sid)

    first = a.locator("#transcript .rows > .row.user").first
    first.get_by_role("button", name="Edit").click()
    first.get_by_role("textbox", name="Edit message").fill("one, on second thought")
    first.get_by_role("button", name="Save and send").click()
    expect(a.locator("#notice-bar")).to_contain_text("your edit is still open")
    expect(a.locator("#transcript .rows > .row.user .user-text").nth(1)).to_have_text("two, edited")
    box = first.get_by_role("textbox", name="Edit message")
    expect(box).to_have_value("one, on second thought")
    with httpx.Client(base_url=web_server.base_url) as client:
        assert session_body(client, sid)["last_seq"] == switched  # nothing was written

    for route in held:
        route.continue_()
    a.unroute("**/api/sessions/*/events*")
    first.get_by_role("button", name="Save and send").click()
    with httpx.Client(base_url=web_server.base_url) as client:
        wait_until(lambda: session_body(client, sid)["last_seq"] > switched, what="the edit")
        body = wait_idle(client, sid)
    assert [m["content"] for m in body["messages"] if m["role"] == "user"] == [
        "one, on second thought"
    ]
    expect(a.locator("#transcript .rows > .row.user .user-text")).to_have_text(
        ["one, on second thought"]
    )


def test_a_message_queued_from_a_tab_behind_another_tabs_switch_is_refused_and_given_back(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layers: the page's Queue (main.js: the position it sends) and run admission for
    `POST /api/chat/queue`; contract invariant 1. Tab A, its stream held, still shows a run
    on branch 1 that was stopped since, and tab B showed branch 2: A's Queue would start the
    message at once in the idle session, after branch 2. It is refused (409
    `transcript_changed`): nothing is queued or written, the text is back in A's composer,
    a notice says so, and A shows branch 2."""
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = new_session(client)
        for message in ("one", "two"):
            start_turn(client, sid, message)
            wait_idle(client, sid)
        two = session_body(client, sid)["messages"][2]
        edit_and_show_the_first_branch(client, sid, two["id"])
        stream = start_turn(client, sid, "/slow three")["stream_id"]

    a, held = tab_behind(context, web_server, sid)
    expect(a.get_by_role("button", name="Stop")).to_be_visible()
    with httpx.Client(base_url=web_server.base_url) as client:
        assert client.post("/api/chat/cancel", json={"stream_id": stream}).status_code == 200
        wait_idle(client, sid)
    switched = second_branch_in_tab_b(context, web_server, sid)

    composer(a).fill("four")
    a.get_by_role("button", name="Queue").click()
    expect(a.locator("#notice-bar")).to_contain_text("changed in another tab")
    expect(composer(a)).to_have_value("four")  # nothing typed is lost
    expect(a.locator("#transcript .rows > .row.user .user-text")).to_have_text(
        ["one", "two, edited"]
    )
    with httpx.Client(base_url=web_server.base_url) as client:
        body = session_body(client, sid)
        assert body["last_seq"] == switched and body["queued"] == []  # nothing was written
