"""Every page Tether serves runs only its own scripts: no interactive API docs that pull a
floating-version script from a CDN into Tether's origin (docs/security.md, "Served pages")."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from helpers import ServerProcess, new_session, running_server

pytestmark = pytest.mark.slow

PW_ENV = {"TETHER_TEST_PW": "correct horse"}
PW_ENV_PASSWORD = {"password": "correct horse"}
DOC_UIS = ["/api/docs", "/api/redoc", "/docs", "/redoc", "/api/docs/oauth2-redirect"]


class _References(HTMLParser):
    """The URLs a page loads: script and link sources, and any inline script's text."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("src", "href"):
            if tag in ("script", "link", "img", "iframe") and values.get(name):
                self.urls.append(values[name] or "")
        if tag == "script" and not values.get("src"):
            self.inline_scripts += 1


def assert_loads_only_its_own(html: str) -> None:
    refs = _References()
    refs.feed(html)
    assert refs.urls, "the page should load its own module"
    for url in refs.urls:
        assert (url.startswith("/") and not url.startswith("//")) or url.startswith("data:"), url
    assert refs.inline_scripts == 0


def test_the_docs_ui_is_gone_and_the_openapi_document_stays(server: ServerProcess) -> None:
    with server.client() as client:
        for path in DOC_UIS:
            response = client.get(path)
            assert response.status_code == 404, (path, response.text[:200])
            assert response.json()["code"] == "not_found"
            assert "cdn" not in response.text.lower()
        schema = client.get("/api/openapi.json")
        assert schema.status_code == 200
        assert "/api/sessions" in schema.json()["paths"]


def test_no_served_page_references_an_external_script(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "data", "--password-env", "TETHER_TEST_PW", env=PW_ENV) as server,
        server.client() as client,
    ):
        login_page = client.get("/login")
        assert login_page.status_code == 200
        assert_loads_only_its_own(login_page.text)
        assert client.post("/api/auth/login", json=PW_ENV_PASSWORD).status_code == 200
        sid = new_session(client)
        for path in ["/", f"/s/{sid}"]:
            page = client.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert_loads_only_its_own(page.text)
            assert "script-src 'self'" in page.headers["content-security-policy"]
