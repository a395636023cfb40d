"""The page's "Change password" dialog under `--auth accounts` (docs/api.md §15): reached
from the sidebar footer, labelled fields, the server's refusals shown in the dialog, and a
change that keeps this browser signed in while the person's other sign-in ends."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, Route, expect

from accounts_kit import PASSWORDS, add_user, sign_in
from helpers import ServerProcess, running_server
from pagekit import send, wait_settled

pytestmark = pytest.mark.slow


def signed_in_page(context: BrowserContext, srv: ServerProcess) -> Page:
    """Alice's page, signed in on the login page and booted: a message sent before the page
    routed its address would be wiped by that routing (its conn state is set by it)."""
    page = context.new_page()
    page.goto(srv.base_url + "/login")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORDS["alice"])
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    expect(page.locator("#conn")).to_have_attribute("data-state", "idle")
    return page


def test_a_person_changes_their_password_on_the_page(
    context: BrowserContext, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    demo = {"TETHER_DEMO_DELAY": "0.01"}
    with (
        running_server(data, "--auth", "accounts", env=demo) as srv,
        sign_in(srv, "alice") as elsewhere,
    ):
        page = signed_in_page(context, srv)
        send(page, "before the change")  # a session whose event stream is open
        wait_settled(page)

        page.get_by_role("button", name="Password", exact=True).click()
        dialog = page.get_by_role("dialog", name="Change password")
        expect(dialog).to_be_visible()
        current = dialog.get_by_label("Current password")
        expect(current).to_be_focused()
        submit = dialog.get_by_role("button", name="Change password")

        current.fill("not her password")
        dialog.get_by_label("New password", exact=True).fill("alice-new-pass")
        dialog.get_by_label("New password again").fill("alice-new-pass")
        submit.click()
        expect(dialog.get_by_role("alert")).to_contain_text("not your current password")
        expect(current).to_be_focused()

        current.fill(PASSWORDS["alice"])
        dialog.get_by_label("New password again").fill("alice-other-pass")
        submit.click()
        expect(dialog.get_by_role("alert")).to_contain_text("The two new passwords differ")
        assert elsewhere.get("/api/me").status_code == 200  # nothing was sent

        dialog.get_by_label("New password again").fill("alice-new-pass")
        submit.click()
        expect(dialog.get_by_role("status")).to_contain_text("Password changed")
        expect(dialog.get_by_role("alert")).to_be_hidden()
        assert elsewhere.get("/api/me").status_code == 401  # her other sign-in ended
        dialog.get_by_role("button", name="Close").click()
        expect(dialog).to_be_hidden()

        send(page, "after the change")  # the page goes on live, without a reload
        expect(page.get_by_text("after the change").first).to_be_visible()
        wait_settled(page)
        expect(page).not_to_have_url(re.compile(r"/login"))
        page.reload()  # this browser stays signed in, with the cookie the change gave it
        expect(page).not_to_have_url(re.compile(r"/login"))
        expect(page.get_by_role("button", name="Password", exact=True)).to_be_visible()
        with sign_in(srv, "alice", "alice-new-pass") as again:
            assert again.get("/api/me").json()["username"] == "alice"


def test_the_dialog_serves_password_managers_and_the_keyboard(
    context: BrowserContext, tmp_path: Path
) -> None:
    """A password manager finds whose password changes and which field is which (the
    `autocomplete` tokens of the HTML standard), Escape closes the dialog without sending,
    and the focus goes back to the Password button."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    with running_server(data, "--auth", "accounts") as srv, sign_in(srv, "alice") as elsewhere:
        page = signed_in_page(context, srv)
        opener = page.get_by_role("button", name="Password", exact=True)
        opener.click()
        dialog = page.get_by_role("dialog", name="Change password")
        fields = {
            "Current password": "current-password",
            "New password": "new-password",
            "New password again": "new-password",
        }
        for label, token in fields.items():
            field = dialog.get_by_label(label, exact=True)
            expect(field).to_have_attribute("type", "password")
            expect(field).to_have_attribute("autocomplete", token)
        username = dialog.locator("input[autocomplete=username]")
        expect(username).to_have_value("alice")
        dialog.get_by_label("Current password").fill(PASSWORDS["alice"])
        dialog.get_by_label("New password", exact=True).fill("alice-escaped-1")
        dialog.get_by_label("New password again").fill("alice-escaped-1")
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
        expect(opener).to_be_focused()
        assert elsewhere.get("/api/me").status_code == 200  # nothing was sent


def test_the_page_stays_signed_in_when_its_change_answers_after_its_stream_broke(
    context: BrowserContext, tmp_path: Path
) -> None:
    """The change ends every sign-in made with the old cookie, this page's event stream too,
    and the new cookie comes with the answer, on another connection. When the answer comes
    late (a slow network; here held back until the stream broke), the sign-in check the
    broken stream asks for must not send the page to the login page with the old cookie."""
    data = tmp_path / "data"
    add_user(data, "alice", admin=True)
    demo = {"TETHER_DEMO_DELAY": "0.01"}
    with running_server(data, "--auth", "accounts", env=demo) as srv:
        page = signed_in_page(context, srv)
        send(page, "before the change")  # a session whose event stream is open
        wait_settled(page)

        held: list[tuple[Route, httpx.Response]] = []

        def answer_late(route: Route) -> None:
            """Make the change at the server now; give the page its answer later."""
            cookie = next(c["value"] for c in context.cookies() if c["name"] == "tether_session")
            answer = httpx.post(
                srv.base_url + "/api/me/password",
                content=route.request.post_data_buffer,
                headers={
                    "Content-Type": "application/json",
                    "Cookie": f"tether_session={cookie}",
                    "Origin": srv.base_url,
                },
            )
            held.append((route, answer))

        page.route("**/api/me/password", answer_late)
        page.get_by_role("button", name="Password", exact=True).click()
        dialog = page.get_by_role("dialog", name="Change password")
        dialog.get_by_label("Current password").fill(PASSWORDS["alice"])
        dialog.get_by_label("New password", exact=True).fill("alice-late-pass")
        dialog.get_by_label("New password again").fill("alice-late-pass")
        dialog.get_by_role("button", name="Change password").click()
        expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
        assert held, "the change did not reach the server"
        route, answer = held[0]
        assert answer.status_code == 200, answer.text
        route.fulfill(
            status=200,
            headers={k: v for k, v in answer.headers.items() if k != "content-length"},
            body=answer.content,
        )
        expect(dialog.get_by_role("status")).to_contain_text("Password changed")
        expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=15_000)
        expect(page).not_to_have_url(re.compile(r"/login"))
