"""A draft's attached files kept across a reload, and drafts of deleted sessions taken out of
the browser (docs/page.md, "Drafts"). The real page in headless Chromium against the real
server; the browser's own IndexedDB and localStorage read from the test."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle
from pagekit import (
    chips,
    composer,
    open_app,
    stored,
    stored_files,
    wait_settled,
    written,
)

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
PICTURE = bytes(range(256)) * 40  # every byte value: what a text round trip would break
NOTES = "notes, with ünïcode\n".encode() * 3


def settled_session(client: httpx.Client, title: str) -> str:
    sid = new_session(client, title)
    start_turn(client, sid, f"about {title.lower()}")
    wait_idle(client, sid)
    return sid


def attach(page: Page, *files: tuple[str, str, bytes]) -> None:
    page.locator("#file-input").set_input_files(
        files=[{"name": name, "mimeType": mime, "buffer": data} for name, mime, data in files]
    )


def draft_key(sid: str, user: str = "") -> str:
    return f"tether-draft:v1:{user}:{sid}"


def composer_files(page: Page) -> list:
    return page.evaluate("() => tether.composer.files.map((f) => [f.name, f.mime, f.size])")


def test_a_drafts_files_come_back_after_a_reload_and_send_the_same_bytes(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A reload (or a crashed tab, a closed browser) kept a draft's text and lost its attached
    files. They are kept in IndexedDB: the composer shows them again as they were (names,
    types, sizes, order), Send uploads the very bytes attached, and a sent draft's files
    leave the browser."""
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = settled_session(client, "Apples")
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    wait_settled(page)
    composer(page).fill("two files")
    attach(page, ("picture.png", "image/png", PICTURE), ("notes.txt", "text/plain", NOTES))
    expect(chips(page)).to_have_text(["picture.png", "notes.txt"])
    written(page)
    shape = [["picture.png", "image/png", len(PICTURE)], ["notes.txt", "text/plain", len(NOTES)]]
    assert stored_files(page) == {draft_key(sid): shape}

    page.reload()
    expect(composer(page)).to_have_value("two files")
    expect(chips(page)).to_have_text(["picture.png", "notes.txt"])
    assert composer_files(page) == shape
    composer(page).press("Enter")
    wait_settled(page)
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(2)
    with httpx.Client(base_url=web_server.base_url) as client:
        sent = [m for m in session_body(client, sid)["messages"] if m["role"] == "user"][-1]
        assert sent["content"] == "two files"
        assert [[a["name"], a["mime"], a["size"]] for a in sent["attachments"]] == shape
        for attachment, data in zip(sent["attachments"], (PICTURE, NOTES), strict=True):
            assert client.get(attachment["url"]).content == data
    written(page)
    assert stored_files(page) == {}
    assert stored(page) == {}
    page.reload()
    expect(page.locator("#transcript .rows > .row.user")).to_have_count(2)
    expect(chips(page)).to_have_count(0)


SEED_JS = """async ([key, bytes]) => {
  const request = indexedDB.open('tether-drafts', 1);
  request.onupgradeneeded = () => request.result.createObjectStore('files');
  const db = await new Promise((resolve) => { request.onsuccess = () => resolve(request.result); });
  const blob = new Blob([new Uint8Array(bytes)]);
  const tx = db.transaction('files', 'readwrite');
  tx.objectStore('files').put(
    {at: Date.now(), bytes, files: [{name: 'old.bin', mime: 'image/png', blob}]}, key);
  await new Promise((resolve) => { tx.oncomplete = resolve; });
  db.close();
}"""


def test_files_over_the_caps_are_named_and_the_rest_is_kept(
    context: BrowserContext, web_server: ServerProcess, tmp_path: Path
) -> None:
    """The browser keeps a file of at most 20 MiB (the server takes no larger one) and the
    drafts' files up to 50 MiB in all. A file beyond either is not kept for a reload, and
    the user is told which: the text and the files that fit come back, none silently lost."""
    with httpx.Client(base_url=web_server.base_url) as client:
        apples, pears = settled_session(client, "Apples"), settled_session(client, "Pears")
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{apples}")
    # Another draft's files already hold 45 MiB of the 50 (docs/api.md §7, the record).
    page.evaluate(SEED_JS, [draft_key(pears), 45 * MiB])
    composer(page).fill("three files")
    sizes = {"huge.png": 20 * MiB + 1, "large.png": 6 * MiB, "small.txt": len(NOTES)}
    for name, size in sizes.items():  # from disk: a buffer this large crawls through the driver
        (tmp_path / name).write_bytes(NOTES[:size] if name == "small.txt" else b"\1" * size)
    page.locator("#file-input").set_input_files([tmp_path / name for name in sizes])
    expect(chips(page)).to_have_text(["huge.png", "large.png", "small.txt"])
    notice = page.locator("#notice-bar")
    expect(notice).to_contain_text("huge.png (over 20 MiB")
    expect(notice).to_contain_text("large.png (over the 50 MiB")
    expect(notice).not_to_contain_text("small.txt")
    written(page)
    assert stored_files(page)[draft_key(apples)] == [["small.txt", "text/plain", len(NOTES)]]

    page.reload()
    expect(composer(page)).to_have_value("three files")
    expect(chips(page)).to_have_text(["small.txt"])


def test_without_indexeddb_files_stay_in_the_tab_and_the_user_is_told_once(
    browser, web_server: ServerProcess
) -> None:
    """A browser whose IndexedDB throws (some private modes, a full disk): the page works as
    before (the text kept across a reload, the files in the tab's memory, sendable), with one
    notice saying the files are not kept, and no error."""
    with httpx.Client(base_url=web_server.base_url) as client:
        sid = settled_session(client, "Apples")
    context = browser.new_context()
    context.add_init_script(
        "IDBFactory.prototype.open = function () {"
        " throw new DOMException('denied', 'SecurityError'); };"
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    open_app(page, web_server.base_url, f"/s/{sid}")
    composer(page).fill("with a file")
    attach(page, ("notes.txt", "text/plain", NOTES))
    notice = page.locator("#notice-bar")
    expect(notice).to_contain_text("does not keep attached files")
    notice.get_by_role("button", name="Dismiss").click()
    attach(page, ("more.txt", "text/plain", NOTES))
    expect(chips(page)).to_have_text(["notes.txt", "more.txt"])
    written(page)
    expect(notice).to_be_hidden()  # told once
    page.reload()
    expect(composer(page)).to_have_value("with a file")
    expect(chips(page)).to_have_count(0)
    attach(page, ("again.txt", "text/plain", NOTES))
    composer(page).press("Enter")
    wait_settled(page)
    with httpx.Client(base_url=web_server.base_url) as client:
        sent = [m for m in session_body(client, sid)["messages"] if m["role"] == "user"][-1]
        assert [a["name"] for a in sent["attachments"]] == ["again.txt"]
    assert errors == []
    context.close()


def test_a_deleted_sessions_draft_leaves_the_browser_and_an_archived_ones_stays(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Drafts of deleted sessions stayed in the browser for good when no tab saw the deletion
    (the session deleted from another browser or the API while none was open). Once the
    page has read the session list, it takes out a draft whose session the server says is
    gone (text, files and open edits); an archived session's draft stays (it is not in the
    default list), and so does every draft while the server cannot be asked."""
    with httpx.Client(base_url=web_server.base_url) as client:
        apples, pears, plums = (settled_session(client, t) for t in ("Apples", "Pears", "Plums"))
    page = context.new_page()
    for sid in (apples, pears, plums):
        open_app(page, web_server.base_url, f"/s/{sid}")
        wait_settled(page)
        composer(page).fill(f"draft of {sid}")
        row = page.locator("#transcript .rows > .row.user").first
        row.get_by_role("button", name="Edit").click()
        row.get_by_role("textbox", name="Edit message").fill("an edit left open")
        attach(page, ("notes.txt", "text/plain", NOTES))
        expect(chips(page)).to_have_text(["notes.txt"])
        written(page)
    keys = {draft_key(sid) for sid in (apples, pears, plums)}
    assert set(stored(page)) == keys
    assert set(stored_files(page)) == keys
    page.close()  # no page of the app open while it happens

    with httpx.Client(base_url=web_server.base_url) as client:
        client.delete("/api/session", params={"session_id": pears}).raise_for_status()
        archived = {"session_id": plums, "archived": True}
        client.patch("/api/session", json=archived).raise_for_status()
    page = context.new_page()
    one_session = re.compile(r"/api/session\?")  # how the page asks after one not listed
    page.route(one_session, lambda route: route.abort())
    open_app(page, web_server.base_url)
    page.wait_for_function("() => window.tether.drafts.pruned > 0")
    assert set(stored(page)) == keys
    assert set(stored_files(page)) == keys
    page.unroute(one_session)

    page.reload()
    page.wait_for_function("() => window.tether.drafts.pruned > 0")
    written(page)
    kept = {draft_key(apples), draft_key(plums)}
    assert set(stored(page)) == kept
    assert set(stored_files(page)) == kept
    page.locator(".session-link").filter(has_text="Apples").click()
    expect(composer(page)).to_have_value(f"draft of {apples}")
    expect(chips(page)).to_have_text(["notes.txt"])


def test_a_session_deleted_while_the_page_is_open_takes_its_files_along(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A session deleted elsewhere while the page is open: its draft's files leave IndexedDB
    with its text, and come to the composer shown along with the text, unsent."""
    with httpx.Client(base_url=web_server.base_url) as client:
        apples, pears = settled_session(client, "Apples"), settled_session(client, "Pears")
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{pears}")
    composer(page).fill("for the pears")
    attach(page, ("notes.txt", "text/plain", NOTES))
    expect(chips(page)).to_have_text(["notes.txt"])
    written(page)
    page.reload()  # its files only in IndexedDB now, not in this tab's memory
    expect(chips(page)).to_have_text(["notes.txt"])
    page.locator(".session-link").filter(has_text="Apples").click()
    expect(composer(page)).to_have_value("")
    with httpx.Client(base_url=web_server.base_url) as client:
        client.delete("/api/session", params={"session_id": pears}).raise_for_status()
    expect(page.locator(".session-link").filter(has_text="Pears")).to_have_count(0)
    expect(composer(page)).to_have_value("for the pears")
    expect(chips(page)).to_have_text(["notes.txt"])
    written(page)
    assert draft_key(pears) not in stored(page)
    assert draft_key(pears) not in stored_files(page)
    assert list(stored_files(page)) == [draft_key(apples)]  # now the draft shown
