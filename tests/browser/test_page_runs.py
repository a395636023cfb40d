"""The page over a real server (issue 5). Layers: live UI scene and reducer (invariants 2, 3
and 5: live, reloaded, switched-back and settled views show the same rows in the same order,
each once), SSE reattach, run registry (Stop from one tab ends the run in another)."""

from __future__ import annotations

import shutil

import httpx
import pytest
from playwright.sync_api import BrowserContext, expect

from helpers import ServerProcess, new_session, start_turn
from pagekit import (
    assert_each_once,
    open_app,
    send,
    session_id_of,
    structure,
    wait_settled,
)

pytestmark = pytest.mark.slow


def test_live_reload_switch_and_settled_views_agree(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    base = web_server.base_url
    with httpx.Client(base_url=base) as client:
        other = new_session(client, "Another session")
    live = context.new_page()
    open_app(live, base)
    send(live, "/slow walk me through it")
    expect(live.locator(".row.live")).to_have_count(1)
    sid = session_id_of(live)
    expect(live.locator(".row.user").first).to_contain_text("/slow walk me through it")

    reloaded = context.new_page()
    open_app(reloaded, base, f"/s/{sid}")
    expect(reloaded.locator(".tool-card").first).to_be_attached(timeout=20_000)
    reloaded.reload()  # a mid-run reload
    expect(reloaded.locator(".row.live")).to_have_count(1)
    assert (
        reloaded.locator("#transcript .rows > [data-key]")
        .first.get_attribute("class")
        .startswith("row user")
    )  # the turn stays before its output (invariant 2)

    switcher = context.new_page()
    open_app(switcher, base, f"/s/{sid}")
    switcher.get_by_role("link", name="Another session").click()
    expect(switcher).to_have_url(f"{base}/s/{other}")
    switcher.wait_for_timeout(700)  # events keep arriving for the session we left
    switcher.get_by_role("link", name="/slow walk me through it").click()
    expect(switcher).to_have_url(f"{base}/s/{sid}")

    for page in (live, reloaded, switcher):
        wait_settled(page)
    settled = context.new_page()
    open_app(settled, base, f"/s/{sid}")
    expect(settled.locator(".row.assistant")).to_have_count(1)
    views = [structure(p) for p in (live, reloaded, switcher, settled)]
    for view in views:
        assert_each_once(view)
        assert view == views[-1]
    assert [key for key, _ in views[0]][0].startswith("u_")


def test_server_restart_mid_run_shows_the_interrupted_turn_once(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "/slow until the lights go out")
    expect(page.locator(".tool-card").first).to_be_attached(timeout=20_000)
    web_server.kill()
    expect(page.locator("#conn")).not_to_have_text("Live", timeout=15_000)
    web_server.start()
    expect(page.locator(".terminal.interrupted")).to_have_count(1, timeout=30_000)
    wait_settled(page)
    rows = structure(page)
    assert_each_once(rows)
    assert len(rows) == 2 and rows[0][0].startswith("u_")
    expect(page.locator(".row.user")).to_have_text("/slow until the lights go out")
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)


def test_stop_from_the_page_ends_the_run_in_a_second_tab(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    first = context.new_page()
    open_app(first, web_server.base_url)
    send(first, "/slow a long one")
    sid = session_id_of(first)
    second = context.new_page()
    open_app(second, web_server.base_url, f"/s/{sid}")
    expect(second.get_by_role("button", name="Stop")).to_be_visible()
    first.get_by_role("button", name="Stop").click()
    for page in (first, second):
        expect(page.locator(".terminal.cancelled")).to_have_count(1, timeout=15_000)
        wait_settled(page)
    assert structure(first) == structure(second)


def test_a_run_started_elsewhere_appears_live_and_marks_the_sidebar(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = new_session(client, "Background job")
        link = page.get_by_role("link", name="Background job")
        expect(link).to_be_visible()
        start_turn(client, sid, "/slow in the background")
        expect(page.get_by_role("link", name="Background job, running")).to_be_visible()
    expect(page.get_by_role("link", name="Background job, unread")).to_be_visible(timeout=30_000)
    page.get_by_role("link", name="Background job, unread").click()
    expect(page.get_by_role("link", name="Background job")).to_have_attribute(
        "aria-current", "page"
    )
    expect(page.locator(".row.assistant")).to_have_count(1)
    expect(page.get_by_role("link", name="Background job, unread")).to_have_count(0)


def test_an_approval_prompt_is_answered_from_the_page(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layers: live UI scene -> `POST /api/chat/approve` -> the runtime. The question shows
    with the command (as text), both answers are offered while the run waits, and once
    answered the card says what was decided, in this tab and in a second one."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "/approve")
    card = page.locator(".item.approval")
    expect(card).to_have_count(1)
    expect(card.locator(".approval-command")).to_have_text("rm -rf ./demo-scratch")
    second = context.new_page()
    open_app(second, web_server.base_url, f"/s/{session_id_of(page)}")
    expect(second.get_by_role("button", name="Allow once")).to_be_visible()
    page.get_by_role("button", name="Deny").click()
    wait_settled(page)
    for tab in (page, second):
        outcome = tab.locator(".item.approval .approval-outcome")
        expect(outcome).to_have_text("Denied.")
        expect(tab.get_by_role("button", name="Allow once")).to_have_count(0)
        expect(tab.locator(".row.assistant").last).to_contain_text("You denied it")


def test_a_cursor_the_server_cannot_honour_shows_the_degraded_state(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Contract invariant 7 (and 3: degrade clearly). The data directory is restored from a
    backup taken one turn earlier, so the open page's cursor is past the log's end: the
    server answers with a snapshot, the page says "Degraded (snapshot)", shows the restored
    transcript (each row once), and goes back to Live with the next event."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    send(page, "kept in the backup")
    wait_settled(page)
    sid = session_id_of(page)
    web_server.stop()
    backup = web_server.data_dir.parent / "backup"
    shutil.copytree(web_server.data_dir, backup)
    web_server.start()
    send(page, "lost with the restore")
    expect(page.locator(".row.user")).to_have_count(2)
    wait_settled(page)
    web_server.stop()
    shutil.rmtree(web_server.data_dir)
    shutil.copytree(backup, web_server.data_dir)
    web_server.start()
    conn = page.locator("#conn")
    expect(conn).to_have_text("Degraded (snapshot)", timeout=30_000)
    expect(page.locator(".row.user")).to_have_text(["kept in the backup"])
    assert_each_once(structure(page))
    with httpx.Client(base_url=web_server.base_url) as client:
        start_turn(client, sid, "after the restore")
    expect(conn).to_have_text("Live", timeout=15_000)
    expect(page.locator(".row.user")).to_have_text(["kept in the backup", "after the restore"])
