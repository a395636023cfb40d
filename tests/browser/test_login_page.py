"""The login page as a person uses it (docs/security.md): a password-protected server sends
the app to the login page, a wrong password shows an error, the right one opens the app, and
"Log out" returns to the login page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from helpers import ServerProcess, new_session, running_server

pytestmark = pytest.mark.slow

PW = "correct horse"


@pytest.fixture
def locked_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        "--password-env",
        "TETHER_TEST_PW",
        env={"TETHER_TEST_PW": PW, "TETHER_DEMO_DELAY": "0.01"},
    ) as srv:
        yield srv


def test_login_logout_round_trip(context: BrowserContext, locked_server: ServerProcess) -> None:
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(locked_server.base_url + "/")
    expect(page).to_have_url(re.compile(r"/login$"))
    password = page.get_by_label("Password")
    expect(password).to_be_visible()
    expect(password).to_be_focused()

    password.fill("wrong horse")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("Wrong password")
    expect(page).to_have_url(re.compile(r"/login$"))

    password.fill(PW)
    password.press("Enter")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    expect(page).to_have_url(locked_server.base_url + "/")
    cookies = {c["name"]: c for c in context.cookies()}
    assert cookies["tether_session"]["httpOnly"] is True
    assert cookies["tether_session"]["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read it

    logout = page.get_by_role("button", name="Log out")
    expect(logout).to_be_visible()
    logout.click()
    expect(page).to_have_url(re.compile(r"/login$"))
    expect(page.get_by_label("Password")).to_be_visible()
    page.goto(locked_server.base_url + "/")
    expect(page).to_have_url(re.compile(r"/login$"))
    assert not [e for e in errors if "Content Security Policy" in e], errors


def test_login_returns_to_the_page_asked_for(
    context: BrowserContext, locked_server: ServerProcess
) -> None:
    with locked_server.client() as client:
        assert client.post("/api/auth/login", json={"password": PW}).status_code == 200
        sid = new_session(client, "Deep link")
    page = context.new_page()
    page.goto(locked_server.base_url + f"/s/{sid}")
    expect(page).to_have_url(re.compile(rf"/login\?next=%2Fs%2F{sid}$"))
    page.get_by_label("Password").fill(PW)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(locked_server.base_url + f"/s/{sid}")
    expect(page.get_by_role("heading", name="Deep link")).to_be_visible()


def test_no_logout_button_without_a_password(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    page.goto(web_server.base_url + "/")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    page.wait_for_load_state("networkidle")
    expect(page.get_by_role("button", name="Log out")).to_be_hidden()
