"""The sidebar's own stream (`/api/events`, followed while no session is open) refused with
a status, here 429 `too_many_streams` (the client's stream slots are all held: tabs, a
script), is connected again once a slot is free. A browser's EventSource gives up for good
on any answer but 200, so the sidebar stopped following: sessions created, renamed or run
elsewhere never showed until a reload. Layers: the page's sidebar feed (web/js/sidebar.js)
and the sidebar relay; invariant 3 (reattach preserves order or degrades clearly): after the
refusal the list is read again and followed. Real server, real page, real streams."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, expect

from helpers import ServerProcess, new_session, running_server
from pagekit import open_app

pytestmark = pytest.mark.slow


@pytest.fixture
def one_stream_each(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "data", "--max-streams-per-client", "1") as server:
        yield server


def test_a_refused_sidebar_stream_is_connected_again_once_a_slot_is_free(
    context: BrowserContext, one_stream_each: ServerProcess
) -> None:
    server = one_stream_each
    holding, release = threading.Event(), threading.Event()

    def hold_the_slot() -> None:
        with (
            httpx.Client(base_url=server.base_url, timeout=30) as client,
            client.stream("GET", "/api/events") as stream,
        ):
            assert stream.status_code == 200
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    try:
        assert holding.wait(10)
        page = context.new_page()
        refused = []
        page.on(
            "response",
            lambda r: refused.append(r.status) if r.url.endswith("/api/events") else None,
        )
        open_app(page, server.base_url)
        expect(page.locator("#session-list")).to_have_text(
            "No sessions yet. Start one with New chat."
        )
        for _ in range(100):  # the feed's request, refused while the slot is held
            if 429 in refused:
                break
            page.wait_for_timeout(100)
        assert 429 in refused, refused
    finally:
        release.set()
        holder.join(10)
    with server.client() as client:
        new_session(client, "made elsewhere")
    row = page.locator(".session-row", has_text="made elsewhere")
    expect(row).to_be_visible(timeout=20_000)
