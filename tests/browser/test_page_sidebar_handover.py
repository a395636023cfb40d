"""The sidebar's changes across a move from one stream to another (docs/page.md, "Reattach
states"; docs/api.md §6): opening another session, a new chat, or the first session from the
empty page each replace the stream that carries the sidebar's changes, and a change made
while the new stream connects still reaches its row. Each test holds the new stream (or the
request before it) until another session has been renamed through the API, so the change
falls exactly in the move."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from playwright.sync_api import APIResponse, BrowserContext, Page, Route, expect

from helpers import ServerProcess, new_session
from pagekit import open_app


def rename(client: httpx.Client, sid: str, title: str) -> None:
    response = client.patch("/api/session", json={"session_id": sid, "title": title})
    assert response.status_code == 200, response.text


def rename_first(client: httpx.Client, sid: str, title: str) -> Callable[[Route], None]:
    """A route handler: renames `sid` while the request waits, then lets the request go."""

    def handle(route: Route) -> None:
        rename(client, sid, title)
        route.continue_()

    return handle


def sessions(server: ServerProcess, *titles: str) -> list[str]:
    with server.client() as client:
        return [new_session(client, title) for title in titles]


def open_live(page: Page, server: ServerProcess, path: str) -> None:
    """Open `path` and wait until its stream follows and the list that this has read again
    (sidebar_relay.js: the first stream to follow) is asked for: a route the test adds after
    this sees only the requests the test causes."""
    open_app(page, server.base_url, path)
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
    page.wait_for_function("() => window.tether.sidebar.relay.gap === false", timeout=15_000)


def wait_held(page: Page, held: list, what: str) -> None:
    """Until the page has asked for a request `held` holds (at most 5 s)."""
    for _ in range(100):
        if held:
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"the page never asked for {what}")


def test_opening_another_session_misses_no_change_of_a_third(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (contract invariant 3: a switch loses nothing).
    The old stream is stopped only when the new one follows, not before its `GET /api/session`."""
    alpha, bravo, charlie = sessions(web_server, "Alpha", "Bravo", "Charlie")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    with web_server.client() as client:
        page.route(
            lambda url: "/api/session?" in url and bravo in url,
            rename_first(client, charlie, "Charlie renamed"),
        )
        page.get_by_role("link", name="Bravo").click()
        expect(page.locator("#session-title")).to_have_text("Bravo")
        expect(page.get_by_role("link", name="Charlie renamed")).to_be_visible()


def test_a_new_chat_misses_no_change_while_the_feed_connects(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). Leaving a session for a new chat
    moves the sidebar to `GET /api/events`; the session's stream stays until the feed's first
    frame."""
    alpha, _bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    with web_server.client() as client:
        page.route("**/api/events", rename_first(client, alpha, "Alpha renamed"))
        page.get_by_role("button", name="New chat").click()
        expect(page.get_by_role("link", name="Alpha renamed")).to_be_visible()


def test_the_first_session_opened_misses_no_change_while_its_stream_connects(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). From the empty page the feed
    carries the sidebar until the opened session's stream follows."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    open_app(page, web_server.base_url)
    expect(page.get_by_role("link", name="Bravo")).to_be_visible()
    with web_server.client() as client:
        page.route(f"**/api/sessions/{alpha}/events*", rename_first(client, bravo, "Bravo renamed"))
        page.get_by_role("link", name="Alpha").click()
        expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
        expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()


def test_a_deleted_open_session_refetches_what_changed_before_the_feed_followed(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). The server ends a deleted session's
    stream: nothing carries the sidebar until the feed follows, so the page refetches the list
    then."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    with web_server.client() as client:
        page.route("**/api/events", rename_first(client, bravo, "Bravo renamed"))
        assert client.delete("/api/session", params={"session_id": alpha}).status_code == 200
        expect(page.get_by_text("This session was deleted.")).to_be_visible()
        expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()


def test_a_change_between_the_first_list_and_the_feed_is_not_missed(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3: a refresh loses nothing). The
    page's first list is read before its stream follows: the first stream to follow has it
    read again."""
    _alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    held: list[Route] = []
    page.route("**/api/events", lambda route: held.append(route))
    open_app(page, web_server.base_url)
    expect(page.get_by_role("link", name="Bravo")).to_be_visible()
    with web_server.client() as client:
        rename(client, bravo, "Bravo renamed")
    wait_held(page, held, "the sidebar feed")  # asked once the first list is drawn
    held[0].continue_()
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()


def test_a_switch_while_the_old_stream_is_down_reads_the_list_again(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). A stream that dropped heard
    nothing since: when the next one follows, the list is read again."""
    alpha, _bravo, charlie = sessions(web_server, "Alpha", "Bravo", "Charlie")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    page.route(f"**/api/sessions/{alpha}/events*", lambda route: route.abort())
    page.evaluate("window.tether.stream.reconnect()")  # it drops; its retries fail
    expect(page.locator("#conn")).to_have_text("Reconnecting…")
    with web_server.client() as client:
        rename(client, charlie, "Charlie renamed")
    page.get_by_role("link", name="Bravo").click()
    expect(page.locator("#session-title")).to_have_text("Bravo")
    expect(page.get_by_role("link", name="Charlie renamed")).to_be_visible()


def test_switching_quickly_through_three_sessions_misses_no_change(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). Alpha, then Bravo and Charlie
    before Bravo's body has come: Charlie is shown, its stream carries the sidebar, and a
    change made while it connected reaches its row."""
    alpha, bravo, charlie, delta = sessions(web_server, "Alpha", "Bravo", "Charlie", "Delta")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    held: list[Route] = []
    page.route(
        lambda url: "/api/session?" in url and bravo in url, lambda route: held.append(route)
    )
    with web_server.client() as client:
        page.route(f"**/api/sessions/{charlie}/events*", rename_first(client, delta, "Delta 2"))
        page.get_by_role("link", name="Bravo").click()
        page.get_by_role("link", name="Charlie").click()
        expect(page.locator("#session-title")).to_have_text("Charlie")
        expect(page.get_by_role("link", name="Delta 2")).to_be_visible()
        assert len(held) == 1
        held[0].continue_()
        rename(client, delta, "Delta 3")  # Charlie's stream, the one left, brings it
        expect(page.get_by_role("link", name="Delta 3")).to_be_visible()
        expect(page.locator("#session-title")).to_have_text("Charlie")
        expect(page).to_have_url(f"{web_server.base_url}/s/{charlie}")


OPEN_STREAMS_JS = """() => {
  const Native = window.EventSource;
  window.openStreams = [];
  window.EventSource = class extends Native {
    constructor(...args) { super(...args); window.openStreams.push(this); }
  };
}"""


def test_a_session_opened_twice_at_once_keeps_one_stream(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's streams (the server's per-client stream slots). Two opens of one
    session racing (a double click) leave one stream open, not one per open."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    page.add_init_script(f"({OPEN_STREAMS_JS})()")
    open_live(page, web_server, f"/s/{alpha}")
    page.evaluate(f"""() => {{
      window.tether.open("{bravo}", {{ push: true }});
      window.tether.open("{bravo}", {{ push: true }});
    }}""")
    expect(page.locator("#session-title")).to_have_text("Bravo")
    expect(page.locator("#conn")).to_have_text("Live")
    open_now = "window.openStreams.filter((s) => s.readyState !== EventSource.CLOSED).length"
    page.wait_for_function(f"() => {open_now} === 1", timeout=5_000)
    page.wait_for_timeout(1_000)  # past the relay's grace: nothing more is stopped later
    assert page.evaluate(f"() => {open_now}") == 1


def test_a_slow_answer_to_an_earlier_search_does_not_replace_the_later_one(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection. Lists asked for one after another may answer
    out of order (a search typed on, a reconnect): only the last one asked is drawn."""
    sessions(web_server, "Alpha one", "Bravo two")
    page = context.new_page()
    open_app(page, web_server.base_url)
    held: list[Route] = []
    page.route(
        lambda url: "/api/sessions?" in url and "q=Alpha" in url,
        lambda route: held.append(route),
    )
    search = page.get_by_role("searchbox", name="Search sessions")
    search.fill("Alpha")
    wait_held(page, held, "the first search")
    search.fill("Bravo")
    expect(page.get_by_role("link", name="Bravo two")).to_be_visible()
    expect(page.get_by_role("link", name="Alpha one")).to_have_count(0)
    with page.expect_response(lambda response: "q=Alpha" in response.url):
        held[0].continue_()
    page.wait_for_timeout(300)  # the answer is handled
    expect(page.get_by_role("link", name="Bravo two")).to_be_visible()
    expect(page.get_by_role("link", name="Alpha one")).to_have_count(0)


def test_a_stream_that_dropped_reads_the_list_again_once_it_follows(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). The open session's stream drops
    and comes back: what changed while it was away is read with the list once it follows."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    events = f"**/api/sessions/{alpha}/events*"
    page.route(events, lambda route: route.abort())
    page.evaluate("window.tether.stream.reconnect()")
    expect(page.locator("#conn")).to_have_text("Reconnecting…")
    with web_server.client() as client:
        rename(client, bravo, "Bravo renamed")
    page.unroute(events)
    expect(page.locator("#conn")).to_have_text("Live", timeout=15_000)
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()


RELAY_JS = """async () => {
  const { SidebarRelay } = await import('/static/js/sidebar_relay.js');
  const log = [];
  const stopped = [];
  const relay = new SidebarRelay({
    onChange: (c) => log.push(`${c.session_id}:${c.row}`),
    onGap: () => log.push('gap'),
  });
  const add = (name) => relay.add(() => stopped.push(name));
  const a = add('a');
  a.frame();  // the page's first list: read again
  a.retire();
  const b = add('b');
  a.change({ session_id: 'x', row: 1 });  // b not following yet: a's rows count
  b.frame();
  b.change({ session_id: 'x', row: 2 });
  a.change({ session_id: 'x', row: 1 });  // older than b's: dropped
  a.change({ session_id: 'y', row: 1 });  // b has not sent y: taken
  b.retire();
  const c = add('c');
  c.frame();
  a.change({ session_id: 'x', row: 1 });  // still older than b's
  const beforeGrace = [...stopped];
  await new Promise((resolve) => setTimeout(resolve, 700));
  const afterGrace = [...stopped];
  a.lost();  // gone already, and older than c: no gap
  const d = add('d');
  c.retire();
  d.lost();  // d never followed: changes may be missed; c keeps the sidebar current
  const stillRetiring = [...stopped];
  c.lost();  // c was giving way: stopped
  d.frame();
  return { log, beforeGrace, afterGrace, stillRetiring, stopped };
}"""


def test_the_relay_orders_rows_across_streams_and_stops_each_one_once(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection. `SidebarRelay` alone: a newer stream's row of a
    session wins over an older stream's, the old streams stop after the grace, and a drop
    has the list read again only when changes may have been missed."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    got = page.evaluate(RELAY_JS)
    assert got["log"] == ["gap", "x:1", "x:2", "y:1", "gap"]
    assert got["beforeGrace"] == []
    assert sorted(got["afterGrace"]) == ["a", "b"]
    assert sorted(got["stillRetiring"]) == ["a", "b"]
    assert sorted(got["stopped"]) == ["a", "b", "c"]


def hold_as_read_now(held: list[tuple[Route, APIResponse]]) -> Callable[[Route], None]:
    """A route handler: the server answers now, the page gets that answer only when the test
    fulfils it (an answer overtaken on the way by a change on a stream)."""

    def handle(route: Route) -> None:
        held.append((route, route.fetch()))

    return handle


def release(page: Page, held: list[tuple[Route, APIResponse]]) -> None:
    """Let the held answers reach the page, oldest first, and give the page a moment to
    handle them."""
    while held:
        route, answer = held.pop(0)
        with page.expect_response(route.request.url):
            route.fulfill(response=answer)
    page.wait_for_timeout(300)  # the answers are handled


def test_a_list_read_before_a_change_does_not_replace_the_changed_row(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). A list the server read before a
    change, arriving after the change's frame, is older than the row it would replace: the
    row stays as the change left it (a run's "running" once stayed "failed" this way)."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    held: list[tuple[Route, APIResponse]] = []
    page.route(lambda url: "/api/sessions?" in url, hold_as_read_now(held))
    page.evaluate("() => { window.tether.sidebar.load(); }")  # as a reconnect's refetch does
    wait_held(page, held, "the list")
    with web_server.client() as client:
        rename(client, bravo, "Bravo renamed")
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()
    release(page, held)
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()
    expect(page.get_by_role("link", name="Bravo", exact=True)).to_have_count(0)


def test_a_session_body_read_before_a_change_does_not_replace_the_changed_row(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). Opening Bravo reads its body; a
    rename that the old stream brings while that body is on its way is newer than the body's
    row: the sidebar and the header keep the new title."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    held: list[tuple[Route, APIResponse]] = []
    page.route(lambda url: "/api/session?" in url and bravo in url, hold_as_read_now(held))
    page.get_by_role("link", name="Bravo").click()
    wait_held(page, held, "Bravo's body")
    with web_server.client() as client:
        rename(client, bravo, "Bravo renamed")
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()
    release(page, held)
    expect(page.locator("#session-title")).to_have_text("Bravo renamed")
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()


def test_a_change_while_the_archive_is_on_its_way_shows_in_it(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Layer: the page's sidebar projection (invariant 3). Showing the archive asks for its
    list; an archived session renamed while that list is on its way is not in the rows yet,
    so the change is not drawn, but the list that then arrives shows it renamed."""
    alpha, bravo = sessions(web_server, "Alpha", "Bravo")
    with web_server.client() as client:
        archived = client.patch("/api/session", json={"session_id": bravo, "archived": True})
        assert archived.status_code == 200
    page = context.new_page()
    open_live(page, web_server, f"/s/{alpha}")
    held: list[tuple[Route, APIResponse]] = []
    page.route(lambda url: "/api/sessions?" in url and "archived=1" in url, hold_as_read_now(held))
    page.locator("#show-archived").check()
    wait_held(page, held, "the archived list")
    with web_server.client() as client:
        rename(client, bravo, "Bravo renamed")
    page.wait_for_timeout(500)  # its change came and was not drawn (not in the rows yet)
    release(page, held)
    expect(page.get_by_role("link", name="Bravo renamed")).to_be_visible()
