"""Contract invariant 4 in the real page, over the unread stores (contract: "Client-side
unread persistence (sidebar layer)"): maintenance (recovery after kill -9, a reclaim, a
shutdown) never marks a session unread, in a page that stayed open or one opened later, while
a run that really completes in the background does. The stores themselves, page against
page, are in `test_unread_stores.py`."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import BrowserContext, Locator, Page, expect

from helpers import ServerProcess, new_session, session_body, start_turn
from pagekit import open_app


def sidebar_link(page: Page, sid: str) -> Locator:
    return page.locator(f'.session-row[data-key="{sid}"] .session-link')


def visit_mid_run(page: Page, base: str, sid: str, title: str, back_to: str) -> None:
    """The reader looks at the running session (acknowledging what it shows), then goes
    back to another one, leaving the run to finish in the background."""
    sidebar_link(page, sid).click()
    expect(page).to_have_url(f"{base}/s/{sid}")
    expect(page.locator(".row.live")).to_have_count(1, timeout=20_000)
    sidebar_link(page, back_to).click()
    expect(page).to_have_url(f"{base}/s/{back_to}")
    expect(sidebar_link(page, sid)).to_have_attribute("aria-label", labelled(title, "running"))


def labelled(title: str, state: str) -> re.Pattern[str]:
    """The row's name: its title, then `state` first among the states (running, last run,
    unread, pinned, the relative time: sidebar.js)."""
    return re.compile(rf"^{re.escape(title)}, {state}(, |$)")


def assert_read_in(page: Page, sid: str, title: str) -> None:
    """Idle and without the dot (the label says neither "running" nor "unread")."""
    idle_and_read = re.compile(rf"^{re.escape(title)}(, (?!running|unread)[^,]+)*$")
    expect(sidebar_link(page, sid)).to_have_attribute("aria-label", idle_and_read, timeout=30_000)
    expect(page.locator(f'.session-row[data-key="{sid}"] .unread-dot')).to_be_hidden()


def test_recovery_reclaim_and_shutdown_never_light_the_dot_a_completion_does(
    context: BrowserContext, tmp_path: Path
) -> None:
    """Contract invariant 4 over the unread stores: after kill -9 mid-run and a restart
    (recovery's `run.finished{interrupted}` adds a visible row), a reclaim after a Stop the
    reader saw, and a SIGTERM shutdown mid-run, the session shows no dot, in the page that
    stayed open and in one opened later. A run that really completes in the background
    still lights it, in both."""
    server = ServerProcess(
        tmp_path / "data", "--cancel-reclaim-seconds", "1", env={"TETHER_DEMO_DELAY": "0.05"}
    ).start()
    try:
        base = server.base_url
        with server.client() as client:
            crashed = new_session(client, "Crashed")
            reclaimed = new_session(client, "Reclaimed")
            stopped = new_session(client, "Shut down")
            finished = new_session(client, "Finished")
            reader = new_session(client, "Reader")
        page = context.new_page()
        open_app(page, base, f"/s/{reader}")

        # kill -9 mid-run, then a restart: recovery settles the run as interrupted.
        with server.client() as client:
            start_turn(client, crashed, "/stubborn 60")
        visit_mid_run(page, base, crashed, "Crashed", reader)
        server.kill()
        expect(page.locator("#conn")).not_to_have_text("Live", timeout=15_000)
        server.start()
        with server.client() as client:
            row = session_body(client, crashed)
            assert (row["message_count"], row["activity_count"]) == (2, 1)
        assert_read_in(page, crashed, "Crashed")

        # SIGTERM mid-run: shutdown settles the run as interrupted before the process exits.
        with server.client() as client:
            start_turn(client, stopped, "/slow until the shutdown")
        visit_mid_run(page, base, stopped, "Shut down", reader)
        assert server.stop() == 0
        expect(page.locator("#conn")).not_to_have_text("Live", timeout=15_000)
        server.start()
        with server.client() as client:
            assert session_body(client, stopped)["messages"][-1]["state"] == "interrupted"
        assert_read_in(page, stopped, "Shut down")

        # A Stop the reader saw, then the reclaimer frees the wedged worker a second later.
        with server.client() as client:
            run = start_turn(client, reclaimed, "/stubborn 8")
        sidebar_link(page, reclaimed).click()
        expect(page.locator(".row.live")).to_have_count(1, timeout=20_000)
        with server.client() as client:
            client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        expect(page.locator(".terminal.cancelled")).to_have_count(1, timeout=20_000)
        sidebar_link(page, reader).click()
        expect(page).to_have_url(f"{base}/s/{reader}")
        assert_read_in(page, reclaimed, "Reclaimed")
        assert f"reclaimed run {run['stream_id']}" in server.log()  # not the worker unwinding

        # A real completion in the background: the dot, in the open page.
        with server.client() as client:
            start_turn(client, finished, "/slow a real answer")
        visit_mid_run(page, base, finished, "Finished", reader)
        expect(sidebar_link(page, finished)).to_have_attribute(
            "aria-label", labelled("Finished", "unread"), timeout=60_000
        )
        expect(page.locator(f'.session-row[data-key="{finished}"] .unread-dot')).to_be_visible()

        later = context.new_page()  # a page opened afterwards agrees on every row
        open_app(later, base, f"/s/{reader}")
        expect(sidebar_link(later, finished)).to_have_attribute(
            "aria-label", labelled("Finished", "unread")
        )
        for sid, title in ((crashed, "Crashed"), (reclaimed, "Reclaimed"), (stopped, "Shut down")):
            assert_read_in(later, sid, title)
            assert_read_in(page, sid, title)
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()  # a stubborn worker may still be running
