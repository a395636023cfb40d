"""What the browser tests read off the page: the transcript's keyed structure (rows and their
blocks, in order) and small waits."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from playwright.sync_api import Page, expect

from chatgpt_kit import Conversation
from helpers import ServerProcess

STRUCTURE_JS = """() => [...document.querySelectorAll('#transcript .rows > [data-key]')].map(
  (row) => [row.dataset.key, [...row.querySelectorAll('[data-key]')].map((b) => b.dataset.key)])"""


def structure(page: Page) -> list:
    return page.evaluate(STRUCTURE_JS)


def open_app(page: Page, base_url: str, path: str = "/") -> None:
    page.goto(base_url + path)
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()


CHAT_POSTS = ("/api/chat/start", "/api/chat/queue")

SHOWN_JS = """(turnId) => [...document.querySelectorAll('#transcript .rows > [data-key]')].some(
  (row) => row.dataset.key === turnId || row.dataset.key.endsWith(`:${turnId}`))"""


def send(page: Page, text: str) -> None:
    """Type and send a message; once the server has taken a new turn, wait until the page
    shows it. Without that wait, a `wait_settled` right after a second message found the
    first one's settled page and returned before the new turn began."""
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    with page.expect_response(
        lambda r: r.request.method == "POST" and urlsplit(r.url).path in CHAT_POSTS
    ) as answered:
        box.press("Enter")
    response = answered.value
    if response.ok and urlsplit(response.url).path == "/api/chat/start":
        page.wait_for_function(SHOWN_JS, arg=response.json()["turn_id"])


SETTLED_JS = """() => {
  const rows = document.querySelector('#transcript .rows');
  const users = rows.querySelectorAll(':scope > .row.user').length;
  const answers = rows.querySelectorAll(':scope > .row.assistant:not(.live)').length;
  return users > 0 && users === answers && !rows.querySelector('.row.live');
}"""


def wait_settled(page: Page, timeout: float = 30_000) -> None:
    """Every turn has its settled answer, no run is live, and Send is offered again."""
    page.wait_for_function(SETTLED_JS, timeout=timeout)
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible(timeout=timeout)


def session_id_of(page: Page) -> str:
    """The open session's id, once the page has navigated to it."""
    page.wait_for_url(re.compile(r"/s/[A-Za-z0-9_-]+$"))
    return page.evaluate("location.pathname")[3:]


def assert_each_once(struct: list) -> None:
    keys = [key for key, _ in struct] + [b for _, blocks in struct for b in blocks]
    assert len(keys) == len(set(keys)), "a row or block is shown twice"


def composer(page: Page):
    return page.get_by_role("textbox", name="Message", exact=True)


def chips(page: Page):
    return page.locator("#attachment-chips .chip-name")


STORED_JS = """() => Object.fromEntries(Object.keys(localStorage)
  .filter((key) => key.startsWith('tether-draft:')).map((key) => [key, localStorage[key]]))"""


def stored(page: Page) -> dict[str, str]:
    """The drafts' text in the browser's localStorage, by key."""
    return page.evaluate(STORED_JS)


def written(page: Page) -> None:
    """Wait until the page has shown a draft and written what was typed (within 300 ms),
    its files included."""
    page.wait_for_function(
        "() => window.tether?.drafts.key != null && window.tether.drafts.timer === null"
        " && window.tether.drafts.pending === 0"
    )


# Read without creating it: opening a database that does not exist yet would make an empty one
# the page could no longer give its store to.
STORED_FILES_JS = """async () => {
  const done = (request) => new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  if (!(await indexedDB.databases()).some((db) => db.name === 'tether-drafts')) return {};
  const db = await done(indexedDB.open('tether-drafts'));
  const store = db.transaction('files').objectStore('files');
  const asked = [store.getAllKeys(), store.getAll()]; // both in one turn of the transaction
  const [keys, records] = await Promise.all(asked.map(done));
  db.close();
  return Object.fromEntries(keys.map((key, i) =>
    [key, records[i].files.map((file) => [file.name, file.mime, file.blob.size])]));
}"""


def stored_files(page: Page) -> dict[str, list]:
    """The drafts' files in the browser's IndexedDB, by draft key: [name, type, size] each."""
    return page.evaluate(STORED_FILES_JS)


def long_session(server: ServerProcess, turns: int) -> str:
    """A session of `turns` exchanges, each answer some Markdown and a code block, imported
    in one request (a page's cost of long sessions: test_page_long_session.py)."""
    chat = Conversation("long", 1_700_000_000.0)
    for i in range(turns):
        chat.add("user", f"Question {i}: how do I write function {i}?")
        chat.add(
            "assistant", f"**Answer {i}**\n\n- one\n\n```python\ndef f{i}(x):\n    return x\n```\n"
        )
    with server.client(timeout=60) as client:
        imported = client.post("/api/sessions/import", json=[chat.data])
        assert imported.status_code == 201, imported.text
        return imported.json()["sessions"][0]["session_id"]
