"""OIDC sign-in (`--auth oidc`, docs/api.md §15) in a real browser, against a provider on
another site (`localhost`, Tether being on 127.0.0.1) whose sign-in page the person acts on
(tests/oidc_provider.py). The navigation back to Tether is started by the provider's page, so
the browser withholds Tether's SameSite=Strict cookie from every redirect of it: the callback
must end that navigation with a page of its own before going on to `next`, or the person is
sent back to the provider after every sign-in."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from helpers import ServerProcess, running_server
from oidc_provider import Provider, running_provider

pytestmark = pytest.mark.slow

CLIENT_ID, SECRET = "tether-test", "s3cret-for-tests"


@pytest.fixture
def provider() -> Iterator[Provider]:
    with running_provider(CLIENT_ID, SECRET, host="localhost") as running:
        running.sign_in_page = True
        running.user = {"sub": "u-olga", "preferred_username": "olga"}
        yield running


@pytest.fixture
def oidc_server(provider: Provider, tmp_path: Path) -> Iterator[ServerProcess]:
    args = ("--auth", "oidc", "--oidc-issuer", provider.issuer, "--oidc-client-id", CLIENT_ID)
    with running_server(
        tmp_path / "data",
        *args,
        "--oidc-client-secret-env",
        "TETHER_TEST_OIDC_SECRET",
        env={"TETHER_TEST_OIDC_SECRET": SECRET, "TETHER_DEMO_DELAY": "0.01"},
    ) as srv:
        yield srv


def test_signing_in_at_the_provider_opens_the_page_asked_for(
    context: BrowserContext, oidc_server: ServerProcess
) -> None:
    page = context.new_page()
    page.goto(oidc_server.base_url + "/s/abc")
    expect(page).to_have_url(re.compile(r"^http://localhost:\d+/authorize\?"))
    page.get_by_role("link", name="Continue").click()
    expect(page).to_have_url(oidc_server.base_url + "/s/abc")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    # Signed in for good: the app's own requests carry the cookie.
    with oidc_server.client() as anonymous:
        assert anonymous.get("/api/me").status_code == 401
    me = page.evaluate("fetch('/api/me').then(r => r.json())")
    assert me == {"username": "olga", "admin": False}
    session = page.evaluate(
        "fetch('/api/sessions', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        ' body: \'{"title": "Olga plans"}\'}).then(r => r.status)'
    )
    assert session == 201
    page.goto(oidc_server.base_url + "/")
    expect(page.get_by_text("Olga plans").first).to_be_visible()


def test_log_out_stays_signed_out_though_the_provider_remembers_the_person(
    context: BrowserContext, oidc_server: ServerProcess, provider: Provider
) -> None:
    """The provider keeps its own sign-in and sends the browser straight back signed in, so
    after **Log out** (in this tab, or another tab of the browser whose streams it ends) the
    login page offers a button instead of going to the provider by itself."""
    provider.sign_in_page = False  # remembers the person: no page, straight back
    page = context.new_page()
    page.goto(oidc_server.base_url + "/")
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    other_tab = context.new_page()
    other_tab.goto(oidc_server.base_url + "/")
    expect(other_tab.get_by_role("textbox", name="Message")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    for tab in (page, other_tab):
        expect(tab.get_by_role("link", name="Sign in")).to_be_visible()
        assert tab.evaluate("fetch('/api/me').then(r => r.status)") == 401
    page.get_by_role("link", name="Sign in").click()  # and signing in again is one click
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    assert page.evaluate("fetch('/api/me').then(r => r.status)") == 200
    page.goto(oidc_server.base_url + "/login")  # signed in: no button, straight on
    expect(page).to_have_url(oidc_server.base_url + "/")
