"""Drafts written by two tabs of one browser at once (docs/page.md, "Drafts"): the files cap
held across tabs, a draft sent in one tab not coming back in another, and a rotated
parent's draft moving to its continuation, once when tabs move it at once. Real pages of
one browser context (they share localStorage and IndexedDB) against the real server."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, Request, Route, expect

from helpers import (
    ServerProcess,
    new_session,
    rotated_conversation,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)
from pagekit import chips, composer, open_app, stored, stored_files, wait_settled, written

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
NOTES = b"the launch is on Tuesday\n"


def settled_session(client: httpx.Client, title: str) -> str:
    sid = new_session(client, title)
    start_turn(client, sid, f"about {title.lower()}")
    wait_idle(client, sid)
    return sid


def draft_key(sid: str, user: str = "") -> str:
    return f"tether-draft:v1:{user}:{sid}"


# Another page of the browser holds the files store in a readwrite transaction (kept open by
# reading in a loop) after seeding the New chat's draft with `bytes`: the tabs' writes wait
# behind it, as behind any other tab's, and are let go together (`held = false`).
HOLD_JS = """async (bytes) => {
  const request = indexedDB.open('tether-drafts', 1);
  request.onupgradeneeded = () => request.result.createObjectStore('files');
  const db = await new Promise((resolve) => { request.onsuccess = () => resolve(request.result); });
  const tx = db.transaction('files', 'readwrite');
  const store = tx.objectStore('files');
  const blob = new Blob([new Uint8Array(bytes)]);
  const seed = {at: Date.now(), bytes, files: [{name: 'old.bin', mime: 'image/png', blob}]};
  window.held = true;
  window.released = new Promise((resolve) => { tx.oncomplete = resolve; });
  const spin = () => { if (window.held) store.get('none').onsuccess = spin; };
  await new Promise((resolve) => { store.put(seed, 'tether-draft:v1::new').onsuccess = resolve; });
  spin();
}"""

WAITING_JS = "() => tether.drafts.timer === null && tether.drafts.pending > 0"


def test_two_tabs_saving_files_at_once_keep_within_the_cap_and_tell_which_was_not_kept(
    context: BrowserContext, web_server: ServerProcess, tmp_path: Path
) -> None:
    """All drafts' files in a browser are kept up to 50 MiB. Each tab added up what was
    stored, then wrote in another transaction: two tabs saving at once both found room and
    kept 54 MiB. The sum and the write are one transaction: the first tab's file is kept,
    the second tab's is not, and its user is told which file."""
    with httpx.Client(base_url=web_server.base_url) as client:
        apples, pears = settled_session(client, "Apples"), settled_session(client, "Pears")
    first, second, holder = (context.new_page() for _ in range(3))
    open_app(first, web_server.base_url, f"/s/{apples}")
    open_app(second, web_server.base_url, f"/s/{pears}")
    written(first)
    written(second)
    holder.goto(web_server.base_url + "/api/health")  # the same origin: the same IndexedDB
    holder.evaluate(HOLD_JS, 30 * MiB)
    for page, name in ((first, "first.bin"), (second, "second.bin")):
        (tmp_path / name).write_bytes(b"\1" * (12 * MiB))  # 30 + 12 fits; 30 + 12 + 12 not
        page.locator("#file-input").set_input_files(tmp_path / name)
        expect(chips(page)).to_have_text([name])
        page.wait_for_function(WAITING_JS)  # its write waits for the store
    holder.evaluate("async () => { window.held = false; await window.released; }")
    written(first)
    written(second)

    files = stored_files(first)
    assert files[draft_key(apples)] == [["first.bin", "application/octet-stream", 12 * MiB]]
    assert draft_key(pears) not in files
    assert sum(size for record in files.values() for _, _, size in record) <= 50 * MiB
    expect(second.locator("#notice-bar")).to_contain_text("second.bin (over the 50 MiB")
    expect(first.locator("#notice-bar")).to_be_hidden()
    expect(chips(second)).to_have_text(["second.bin"])  # still attached in its tab


def test_a_draft_sent_in_one_tab_does_not_come_back_in_another(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A draft typed in one tab and sent from another came back in the first when it showed
    the session again (its own copy won over the stored draft that was gone), text and
    files, ready to be sent twice. And a third tab still showing the sent draft, typing on,
    stored its text without the files it shows (it thought them stored): a reload lost
    them. Now the first shows an empty composer, and the third stores what it shows."""
    with httpx.Client(base_url=web_server.base_url) as client:
        apples, _ = settled_session(client, "Apples"), settled_session(client, "Pears")
    typist, reader, sender = (context.new_page() for _ in range(3))
    open_app(typist, web_server.base_url, f"/s/{apples}")
    composer(typist).fill("for the apples")
    typist.locator("#file-input").set_input_files(
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": NOTES}]
    )
    expect(chips(typist)).to_have_text(["notes.txt"])
    written(typist)
    for page in (reader, sender):
        open_app(page, web_server.base_url, f"/s/{apples}")
        expect(composer(page)).to_have_value("for the apples")
        expect(chips(page)).to_have_text(["notes.txt"])
    composer(sender).press("Enter")
    wait_settled(sender)
    expect(sender.locator("#transcript .rows > .row.user")).to_have_count(2)
    written(sender)
    assert draft_key(apples) not in stored(sender)
    assert draft_key(apples) not in stored_files(sender)

    typist.locator(".session-link").filter(has_text="Pears").click()
    expect(composer(typist)).to_have_value("")
    typist.locator(".session-link").filter(has_text="Apples").click()
    expect(typist.locator("#transcript .rows > .row.user")).to_have_count(2)
    expect(composer(typist)).to_have_value("")
    expect(chips(typist)).to_have_count(0)
    written(typist)
    assert draft_key(apples) not in stored_files(typist)

    composer(reader).fill("for the apples, again")
    written(reader)
    assert stored_files(reader) == {draft_key(apples): [["notes.txt", "text/plain", len(NOTES)]]}
    reader.reload()
    expect(composer(reader)).to_have_value("for the apples, again")
    expect(chips(reader)).to_have_text(["notes.txt"])


def test_rotated_parents_drafts_move_to_the_continuation_without_a_request_per_load(
    context: BrowserContext, tmp_path: Path
) -> None:
    """A draft left in a session that then continued in a newer one (rotated) stayed under
    the parent for good: it is in neither session list, so every page load asked the server
    whether it still existed. It moves to the newest continuation, files and open edits
    included: found from the lists for the last parent (no request), from its own row, once,
    for an older one; and no later load asks after either."""
    with rotated_conversation(tmp_path / "data") as (client, first, second):
        base = str(client.base_url).rstrip("/")
        tabs = {first: context.new_page(), second: context.new_page()}
        for sid, tab in tabs.items():  # both open before either types: no load sees a draft
            open_app(tab, base, f"/s/{sid}")
        for sid, tab in tabs.items():
            composer(tab).fill("typed in the first" if sid == first else "typed in the second")
            written(tab)
        row = tabs[first].locator("#transcript .rows > .row.user").first
        row.get_by_role("button", name="Edit").click()
        row.get_by_role("textbox", name="Edit message").fill("an edit left open")
        tabs[second].locator("#file-input").set_input_files(
            files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": NOTES}]
        )
        expect(chips(tabs[second])).to_have_text(["notes.txt"])
        for tab in tabs.values():
            written(tab)
            tab.close()  # the second continues in a third while no page is open
        start_turn(client, second, "hello " * 150)
        third = wait_until(
            lambda: session_body(client, second)["continuation_session_id"], what="a rotation"
        )
        wait_idle(client, third)

        page = context.new_page()
        asked: list[str] = []

        def on_request(request: Request) -> None:
            if first in request.url or second in request.url:
                asked.append(request.url)

        page.on("request", on_request)
        for load in range(3):
            page.goto(base + "/")
            page.wait_for_function("() => window.tether.drafts.pruned > 0")
            written(page)
            # the first's own row, read once (its continuation is not listed)
            assert asked == [f"{base}/api/session?session_id={first}"], load
        assert list(stored(page)) == [draft_key(third)]
        assert list(stored_files(page)) == [draft_key(third)]
        page.locator(".session-link").first.click()
        expect(page).to_have_url(f"{base}/s/{third}")
        text = composer(page).input_value()
        moved = ["an edit left open", "typed in the first", "typed in the second"]
        assert sorted(text.split("\n\n")) == moved
        expect(chips(page)).to_have_text(["notes.txt"])


def the_session_list(url: str) -> bool:
    """The default session list, as a prune reads it (drafts.js, `fates`)."""
    parts = urlsplit(url)
    return parts.path == "/api/sessions" and not parts.query


def start_prune(page: Page) -> int:
    """The page reads the session list again (`prune`, as after a gap in the streams): the
    prunes it had done before."""
    before = page.evaluate("() => window.tether.drafts.pruned")
    page.evaluate("() => { window.tether.drafts.prune(); }")
    return before


def prune_held(page: Page) -> tuple[int, list[Route]]:
    """`start_prune`, its list's answer held back: the prunes done before, and the held
    request (`release` lets it go)."""
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)

    page.route(the_session_list, hold)
    before = start_prune(page)
    for _ in range(400):
        if held:
            break
        page.wait_for_timeout(25)
    assert held, "the prune asked for the session list"
    return before, held


def release(page: Page, held: list[Route]) -> None:
    for route in held:
        route.continue_()
    page.unroute(the_session_list)


def pruned_since(page: Page, before: int) -> None:
    page.wait_for_function(f"() => window.tether.drafts.pruned > {before}")
    written(page)


def assert_moved_once(page: Page, parent: str, child: str, base: str) -> None:
    """The parent's draft is the continuation's, its text and its file once."""
    drafts, files = stored(page), stored_files(page)
    assert draft_key(parent) not in drafts
    assert draft_key(parent) not in files
    assert json.loads(drafts[draft_key(child)])["text"] == "typed in the parent"
    assert files[draft_key(child)] == [["notes.txt", "text/plain", len(NOTES)]]
    page.goto(f"{base}/s/{child}")
    expect(composer(page)).to_have_value("typed in the parent")
    expect(chips(page)).to_have_text(["notes.txt"])


def type_parents_draft(page: Page) -> None:
    composer(page).fill("typed in the parent")
    page.locator("#file-input").set_input_files(
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": NOTES}]
    )
    expect(chips(page)).to_have_text(["notes.txt"])
    written(page)


def test_a_rotated_parents_draft_two_tabs_move_at_once_arrives_once(
    context: BrowserContext, tmp_path: Path
) -> None:
    """Layer: the page's draft store (drafts.js); invariant: nothing typed is lost, and no
    draft arrives twice. Two tabs reading the session list again together after a rotation
    both moved the rotated parent's draft into the continuation: the second, still holding
    its own copy of the draft (typed there) after the first took the stored one out, moved
    it again, and the continuation's draft held the text twice and the file twice. A tab now
    moves the parent's draft as stored when it moves (under a lock of the browser): the
    second moves nothing, and the draft arrives once."""
    with rotated_conversation(tmp_path / "data") as (client, parent, child):
        base = str(client.base_url).rstrip("/")
        mover, typist = context.new_page(), context.new_page()
        for page, path in ((mover, "/"), (typist, f"/s/{parent}")):  # no load sees a draft
            open_app(page, base, path)
            page.wait_for_function("() => window.tether.drafts.pruned > 0")
        type_parents_draft(typist)
        typist.locator("#new-chat").click()  # the typist keeps its copy of the parent's draft
        expect(composer(typist)).to_have_value("")
        written(typist)

        # both read the list again at once; the typist's answer comes after the mover moved
        before, held = prune_held(typist)
        pruned_since(mover, start_prune(mover))
        assert json.loads(stored(mover)[draft_key(child)])["text"] == "typed in the parent"
        release(typist, held)
        pruned_since(typist, before)
        assert_moved_once(typist, parent, child, base)


# A page of the browser holds the files store in a readwrite transaction (kept open by reading
# in a loop): the tabs' reads and writes of files wait behind it until `held = false`.
HOLD_STORE_JS = """async () => {
  const request = indexedDB.open('tether-drafts', 1);
  const db = await new Promise((resolve) => { request.onsuccess = () => resolve(request.result); });
  const store = db.transaction('files', 'readwrite').objectStore('files');
  window.held = true;
  window.released = new Promise((resolve) => { store.transaction.oncomplete = resolve; });
  const spin = () => { if (window.held) store.get('none').onsuccess = spin; };
  spin();
}"""

# The tab has moved the parent's draft and its files are being moved, or it waits to move.
MOVING_JS = """async () => window.tether.drafts.pending > 0
  || (await navigator.locks.query()).pending.length > 0"""


def test_a_rotated_parents_draft_moved_while_another_tab_moves_it_arrives_once(
    context: BrowserContext, tmp_path: Path
) -> None:
    """Layer: the page's draft store (drafts.js); invariant: nothing typed is lost, and no
    draft arrives twice. A tab moving a rotated parent's draft takes its text out at once
    but reads and moves its files afterwards: a second tab moving it meanwhile (showing the
    continuation) found the files still stored and moved them too, into its composer, which
    then wrote the continuation's draft over with what it showed: the file, without the
    text the first tab had moved. A tab now moves holding a lock of the browser until the
    text and files are written: the second waits, then finds nothing left to move."""
    with rotated_conversation(tmp_path / "data") as (client, parent, child):
        base = str(client.base_url).rstrip("/")
        first, second, typist = (context.new_page() for _ in range(3))
        for page, path in ((first, "/"), (second, f"/s/{child}")):  # no load sees a draft
            open_app(page, base, path)
            page.wait_for_function("() => window.tether.drafts.pruned > 0")
        open_app(typist, base, f"/s/{parent}")
        type_parents_draft(typist)
        typist.close()

        waits = [prune_held(page) for page in (first, second)]
        holder = context.new_page()
        holder.goto(base + "/api/health")  # the same origin: the same IndexedDB
        holder.evaluate(HOLD_STORE_JS)
        release(first, waits[0][1])  # the first moves: the text now, the files once let go
        first.wait_for_function(
            "(key) => localStorage.getItem(key) === null && window.tether.drafts.pending > 0",
            arg=draft_key(parent),
        )
        release(second, waits[1][1])
        second.wait_for_function(MOVING_JS)
        holder.evaluate("async () => { window.held = false; await window.released; }")
        for page, (before, _) in zip((first, second), waits, strict=True):
            pruned_since(page, before)
        assert_moved_once(first, parent, child, base)


def test_a_rotated_parents_draft_this_tab_alone_holds_still_moves(
    context: BrowserContext, tmp_path: Path
) -> None:
    """Layer: the page's draft store (drafts.js); invariant: nothing typed is lost. A tab
    moves a rotated parent's draft as stored when it moves, except what was typed in it and
    never stored (a browser refusing the text's write): that is this tab's alone, and moves
    to the continuation with the files the browser did keep."""
    context.add_init_script(
        "Storage.prototype.setItem = function () {"
        " throw new DOMException('full', 'QuotaExceededError'); };"
    )
    with rotated_conversation(tmp_path / "data") as (client, parent, child):
        base = str(client.base_url).rstrip("/")
        page = context.new_page()
        open_app(page, base, f"/s/{parent}")
        page.wait_for_function("() => window.tether.drafts.pruned > 0")
        type_parents_draft(page)
        assert stored(page) == {}
        assert list(stored_files(page)) == [draft_key(parent)]
        page.locator("#new-chat").click()
        expect(composer(page)).to_have_value("")
        written(page)

        pruned_since(page, start_prune(page))
        assert list(stored_files(page)) == [draft_key(child)]
        page.locator(".session-link").first.click()
        expect(page).to_have_url(f"{base}/s/{child}")
        expect(composer(page)).to_have_value("typed in the parent")
        expect(chips(page)).to_have_text(["notes.txt"])
