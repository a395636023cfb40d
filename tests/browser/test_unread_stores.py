"""Client-side unread stores (contract: "Client-side unread persistence (sidebar layer)").

Two (or three) pages of one browser context share localStorage like two tabs of one profile.
Each page loads `/static/js/unread.js` from a same-origin page (`/api/health`, so nothing here
depends on the app shell) and drives its own `UnreadStore` through `page.evaluate`.

The harness wraps localStorage so a test can count writes, hold back a marker-map write (a
"prepared but not yet persisted" marker), make the quota full for new keys, and freeze `now`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from helpers import ServerProcess, running_server

VC = "hermes-session-viewed-counts"
CM = "hermes-session-completion-unread"
LEGACY = "hermes-session-completion-unread-cleared"
CLEARED = LEGACY + ":v1:"
DELETED = VC + ":deleted:v1:"
DAY = 24 * 60 * 60 * 1000
T0 = 1_700_000_000_000

HARNESS = """async (cfg) => {
  const m = await import('/static/js/unread.js');
  const base = window.localStorage;
  Object.assign(window, {M: m, now: cfg.now ?? null, writes: [], changes: 0, hold: false,
                         held: [], quotaFull: false});
  const storage = {
    get length() { return base.length; },
    key: (i) => base.key(i),
    getItem: (k) => base.getItem(k),
    removeItem: (k) => base.removeItem(k),
    setItem: (k, v) => {
      if (window.quotaFull && base.getItem(k) === null) {
        throw new DOMException('The quota has been exceeded.', 'QuotaExceededError');
      }
      window.writes.push(k);
      if (window.hold && k === m.MARKERS_KEY) { window.held.push([k, v]); return; }
      base.setItem(k, v);
    },
  };
  window.release = () => { for (const [k, v] of window.held.splice(0)) base.setItem(k, v); };
  window.row = (sid, n, g = 0, b = null) => ({session_id: sid, message_count: n,
    transcript_generation: g, transcript_generation_baseline: b});
  window.make = (listen) => new m.UnreadStore({storage, listen,
    now: () => (window.now ?? Date.now()), onChange: () => { window.changes += 1; }});
  window.U = cfg.store ? window.make(cfg.listen) : null;
}"""

STORED = (
    "() => Object.fromEntries(Object.keys(localStorage).map(k => [k, localStorage.getItem(k)]))"
)


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `tether serve` for the module (like `web_server`, started once to keep it fast)."""
    data: Path = tmp_path_factory.mktemp("unread") / "data"
    with running_server(data, env={"TETHER_DEMO_DELAY": "0.01"}) as srv:
        yield srv


def open_page(
    context: BrowserContext,
    server: ServerProcess,
    *,
    store: bool = True,
    listen: bool = True,
    now: int | None = None,
    setup: str | None = None,
    after: Page | None = None,
) -> Page:
    """A same-origin page with the harness; `after`: first wait to see that page's storage."""
    page = context.new_page()
    page.goto(server.base_url + "/api/health")
    if setup:
        page.evaluate(setup)
    if after is not None:
        propagate(after, page)
    page.evaluate(HARNESS, {"store": store, "listen": listen, "now": now})
    return page


def dot(page: Page, sid: str, n: int, g: int = 0, b: int | None = None) -> bool:
    return page.evaluate("([s, n, g, b]) => U.hasUnread(row(s, n, g, b))", [sid, n, g, b])


def wait_dot(page: Page, sid: str, n: int, expected: bool, g: int = 0) -> None:
    page.wait_for_function(
        "([s, n, g, e]) => U.hasUnread(row(s, n, g)) === e", arg=[sid, n, g, expected], timeout=5000
    )


def stored(page: Page) -> dict[str, str]:
    return page.evaluate(STORED)


def stored_map(page: Page, key: str) -> dict:
    return json.loads(stored(page).get(key) or "{}")


def clear_stamps(page: Page, sid: str) -> list[int]:
    prefix = CLEARED + sid + ":"
    return sorted(int(k[len(prefix) :]) for k in stored(page) if k.startswith(prefix))


SAME = """(snap) => {
  const cur = Object.fromEntries(Object.keys(localStorage).map(k => [k, localStorage.getItem(k)]));
  const keys = Object.keys(snap);
  return keys.length === Object.keys(cur).length && keys.every(k => cur[k] === snap[k]);
}"""


def propagate(src: Page, *dsts: Page) -> None:
    """Wait until each page's view of localStorage equals src's: another renderer sees a
    write only after the browser process relays it."""
    snap = stored(src)
    for dst in dsts:
        dst.wait_for_function(SAME, arg=snap, timeout=5000)


def settle(*pages: Page, quiet: float = 0.4) -> None:
    """Let storage events and their microtasks run in every page."""
    time.sleep(quiet)
    for page in pages:
        page.evaluate("new Promise(r => setTimeout(r, 0))")


INTERLEAVED = [
    ("A", "U.acknowledge(row('s1', 5))"),
    ("B", "U.acknowledge(row('s1', 7))"),
    ("A", "U.markCompletion('s2', {message_count: 4})"),
    ("B", "U.markCompletion('s5', {message_count: 2})"),
    ("A", "U.deleteSession('s4')"),
    ("B", "U.acknowledge(row('s4', 3))"),
    ("A", "U.acknowledge(row('s6', 3, 1, 3))"),
    ("B", "U.acknowledge(row('s6', 9, 0))"),
    # A stale client of the same origin writes back its empty whole maps.
    ("C", f"localStorage.setItem('{VC}', '{{}}'); localStorage.setItem('{CM}', '{{}}')"),
]
VIEW_ROWS = [
    ("s1", 7, 0),
    ("s1", 8, 0),
    ("s2", 4, 0),
    ("s4", 9, 0),
    ("s5", 2, 0),
    ("s6", 3, 1),
    ("s6", 4, 1),
    ("s6", 9, 0),
]
EXPECTED_VIEW = [False, True, True, False, True, False, True, False]
VIEW = "(rows) => rows.map(([s, n, g]) => U.hasUnread(row(s, n, g)))"


def test_interleaved_writes_from_two_pages_converge_whatever_the_order(
    browser: Browser, origin: ServerProcess
) -> None:
    orders = [list(INTERLEAVED), list(reversed(INTERLEAVED))]
    rng = random.Random(7577)
    for _ in range(4):
        orders.append(rng.sample(INTERLEAVED, len(INTERLEAVED)))
    for order in orders:
        context = browser.new_context()
        try:
            pages = {
                "A": open_page(context, origin),
                "B": open_page(context, origin),
                "C": open_page(context, origin, store=False),
            }
            for who, op in order:
                pages[who].evaluate(op)
            a, b, c = pages["A"], pages["B"], pages["C"]
            a.wait_for_function(
                f"""() => {{
                  const vc = JSON.parse(localStorage.getItem('{VC}') || '{{}}');
                  const cm = JSON.parse(localStorage.getItem('{CM}') || '{{}}');
                  return vc.s1?.message_count === 7 && vc.s6?.transcript_generation === 1
                    && 's2' in cm && 's5' in cm;
                }}""",
                timeout=5000,
            )
            settle(a, b)
            # A write racing the deletion may leave a dead s4 entry behind (both views drop
            # it); the next merge by either page removes it.
            a.evaluate("U.acknowledge(row('s7', 1))")
            counts = stored_map(a, VC)
            assert counts == {
                "s1": {"message_count": 7, "transcript_generation": 0},
                "s6": {"message_count": 3, "transcript_generation": 1},
                "s7": {"message_count": 1, "transcript_generation": 0},
            }, order
            assert set(stored_map(a, CM)) == {"s2", "s5"}, order
            propagate(a, b, c)
            c.evaluate("window.U = make(false)")
            for page in (a, b, c):
                assert page.evaluate(VIEW, VIEW_ROWS) == EXPECTED_VIEW, order
        finally:
            context.close()


def test_cleared_dot_is_never_resurrected_by_a_stale_page(
    context: BrowserContext, origin: ServerProcess
) -> None:
    stale = open_page(context, origin, listen=False)
    other = open_page(context, origin)
    stale.evaluate("U.markCompletion('s1', {message_count: 3})")
    wait_dot(other, "s1", 3, True)
    other.evaluate("U.acknowledge(row('s1', 3))")
    assert dot(other, "s1", 3) is False
    propagate(other, stale)
    # The stale page never re-read storage: its cache still holds the old marker...
    assert dot(stale, "s1", 3) is True
    # ...and it writes something else: both maps go through the merge, not its cache.
    stale.evaluate("U.markCompletion('s2', {message_count: 1}); U.acknowledge(row('s3', 2))")
    assert "s1" not in stored_map(stale, CM)
    assert "s2" in stored_map(stale, CM)
    assert dot(stale, "s1", 3) is False
    wait_dot(other, "s2", 1, True)
    settle(stale, other)
    assert dot(other, "s1", 3) is False
    assert dot(open_page(context, origin, after=stale), "s1", 3) is False


def test_same_millisecond_clear_and_mark_are_ordered_by_stamps(
    context: BrowserContext, origin: ServerProcess
) -> None:
    a = open_page(context, origin, now=T0)
    b = open_page(context, origin, now=T0)
    a.evaluate("U.acknowledge(row('s1', 2))")
    propagate(a, b)
    b.evaluate("U.refresh()")
    # A prepares a marker (its write is held back); B then acknowledges the advance in the
    # same millisecond; the marker lands afterwards. The clear wins the tie.
    a.evaluate("window.hold = true; U.markCompletion('s1', {message_count: 3})")
    b.evaluate("U.acknowledge(row('s1', 3))")
    propagate(b, a)
    a.evaluate("window.hold = false; release()")
    propagate(a, b)
    order = stored_map(a, CM)["s1"]["unread_order"]
    assert order == max(clear_stamps(a, "s1")), "prepared marker and clear share a stamp"
    for page in (a, b):
        page.evaluate("U.refresh()")
        assert dot(page, "s1", 3) is False
    assert dot(open_page(context, origin, now=T0, after=a), "s1", 3) is False
    # A completion that observed the clear stamps higher and wins, same millisecond again.
    a.evaluate("U.markCompletion('s1', {message_count: 4})")
    assert stored_map(a, CM)["s1"]["unread_order"] > max(clear_stamps(a, "s1"))
    assert stored_map(a, CM)["s1"]["completed_at"] == T0
    wait_dot(b, "s1", 4, True)
    assert dot(a, "s1", 4) is True
    # And an acknowledgement after that completion (still the same millisecond) wins again.
    b.evaluate("U.acknowledge(row('s1', 4))")
    wait_dot(a, "s1", 4, False)
    assert dot(b, "s1", 4) is False
    # Repeated observations at the same count do not refresh the tombstone.
    propagate(b, a)
    stamps = clear_stamps(a, "s1")
    a.evaluate("U.acknowledge(row('s1', 4)); U.acknowledge(row('s1', 4))")
    b.evaluate("U.acknowledge(row('s1', 4))")
    assert clear_stamps(a, "s1") == stamps == clear_stamps(b, "s1")


def test_shrink_then_growth_shows_the_dot(context: BrowserContext, origin: ServerProcess) -> None:
    a = open_page(context, origin)
    b = open_page(context, origin)
    assert dot(a, "s1", 10) is False  # first sight records the row as read
    assert dot(b, "s1", 10) is False
    # Shrink (10 -> 2) and growth (-> 3) arrive in one coalesced sidebar refresh.
    assert dot(a, "s1", 3, g=1, b=2) is True
    assert stored_map(a, VC)["s1"] == {"message_count": 2, "transcript_generation": 1}
    assert dot(b, "s1", 3, g=1, b=2) is True
    a.evaluate("U.acknowledge(row('s1', 3, 1, 2))")
    wait_dot(b, "s1", 3, False, g=1)
    # Step by step on another session: 10 -> 2 is read, then 3 is unread.
    assert dot(a, "s2", 10) is False
    assert dot(a, "s2", 2, g=1, b=2) is False
    assert dot(a, "s2", 3, g=1, b=2) is True
    propagate(a, b)
    assert dot(b, "s2", 3, g=1, b=2) is True


def test_older_generation_never_lowers_a_newer_count(
    context: BrowserContext, origin: ServerProcess
) -> None:
    stale = open_page(context, origin, listen=False)
    a = open_page(context, origin)
    assert dot(stale, "s1", 10) is False
    propagate(stale, a)
    a.evaluate("U.acknowledge(row('s1', 2, 1, 2))")
    propagate(a, stale)
    # The stale page still sees generation 0 with 10 messages and acknowledges it.
    stale.evaluate("U.acknowledge(row('s1', 10, 0))")
    assert stored_map(stale, VC)["s1"] == {"message_count": 2, "transcript_generation": 1}
    assert dot(stale, "s1", 10, g=0) is False  # stale row
    assert dot(stale, "s1", 3, g=1) is True
    settle(a, stale)
    assert dot(a, "s1", 3, g=1) is True
    assert dot(a, "s1", 2, g=1) is False
    # Within one generation counts merge by maximum.
    a.evaluate("U.acknowledge(row('s1', 5, 1))")
    propagate(a, stale)
    stale.evaluate("U.acknowledge(row('s1', 4, 1))")
    assert stored_map(stale, VC)["s1"] == {"message_count": 5, "transcript_generation": 1}


def test_deleted_session_count_cannot_be_reasserted_by_the_other_page(
    context: BrowserContext, origin: ServerProcess
) -> None:
    a = open_page(context, origin)
    stale = open_page(context, origin, listen=False)
    listening = open_page(context, origin)
    a.evaluate("U.acknowledge(row('s1', 5))")
    propagate(a, stale)
    stale.evaluate("U.acknowledge(row('s1', 5)); U.acknowledge(row('s2', 1))")
    propagate(stale, a, listening)
    listening.evaluate("U.refresh()")
    a.evaluate("U.deleteSession('s1')")
    assert DELETED + "s1" in stored(a)
    assert "s1" not in stored_map(a, VC)
    propagate(a, stale, listening)
    # The stale page still caches the count; its next writes drop it instead of writing it back.
    stale.evaluate("U.acknowledge(row('s2', 3)); U.acknowledge(row('s1', 9))")
    assert "s1" not in stored_map(stale, VC)
    propagate(stale, listening)
    listening.evaluate("U.acknowledge(row('s3', 1))")
    settle(a, stale, listening)
    propagate(listening, a, stale)
    counts = stored_map(a, VC)
    assert "s1" not in counts
    assert counts["s2"]["message_count"] == 3
    for page in (a, stale, listening):
        assert dot(page, "s1", 9) is False
    assert "s1" not in stored_map(a, VC)


def test_records_expire_after_seven_days_by_write_time(
    context: BrowserContext, origin: ServerProcess
) -> None:
    a = open_page(context, origin, now=T0)
    a.evaluate("U.markCompletion('s1', {message_count: 2}); U.clearCompletion('s1')")
    a.evaluate("U.deleteSession('s2')")
    # A record carrying a far-future logical stamp, written at T0.
    future = f"{CLEARED}s3:{10**15}"
    a.evaluate(
        "([k, t]) => localStorage.setItem(k, JSON.stringify({stamp: 1e15, recorded_at: t}))",
        [future, T0],
    )
    records = {k: json.loads(v) for k, v in stored(a).items() if k.startswith((CLEARED, DELETED))}
    assert len(records) == 3
    assert all(r["recorded_at"] == T0 for r in records.values())
    a.evaluate(f"window.now = {T0 + 7 * DAY - 1}; U.prune()")
    assert set(records) <= set(stored(a))
    a.evaluate(f"window.now = {T0 + 7 * DAY + 1}; U.prune()")
    left = [k for k in stored(a) if k.startswith((CLEARED, DELETED))]
    assert left == []
    assert dot(a, "s1", 2) is False  # the expired clear did not resurrect the dot
    # A new clear after expiry is still stamped above everything observed, and expires by
    # its own write time even though its stamp is huge.
    a.evaluate("U.markCompletion('s4', {message_count: 1}); U.clearCompletion('s4')")
    assert max(clear_stamps(a, "s4")) > 10**15
    a.evaluate(f"window.now = {T0 + 14 * DAY + 2}; U.prune()")
    assert clear_stamps(a, "s4") == []


def test_legacy_unsuffixed_clear_map_is_migrated_once_and_removed(
    context: BrowserContext, origin: ServerProcess
) -> None:
    legacy = {"s1": T0 - 1000, "s2": T0 - 1000, "s_old": T0 - 8 * DAY, "a:b/c": T0 - 500}
    markers = {
        "s1": {"message_count": 3, "completed_at": T0 - 2000},
        "s2": {"message_count": 4, "completed_at": T0 - 10},
        "s_old": {"message_count": 1, "completed_at": T0 - 9 * DAY},
    }
    setup = (
        f"localStorage.setItem('{LEGACY}', {json.dumps(json.dumps(legacy))});"
        f"localStorage.setItem('{CM}', {json.dumps(json.dumps(markers))});"
        f"localStorage.setItem('{VC}', {json.dumps(json.dumps({'s9': 5}))});"
    )
    a = open_page(context, origin, now=T0, setup=setup)
    after = stored(a)
    assert LEGACY not in after
    records = {k: json.loads(v) for k, v in after.items() if k.startswith(CLEARED)}
    sids = {k[len(CLEARED) :].rsplit(":", 1)[0] for k in records}
    assert sids == {"s1", "s2", "a%3Ab%2Fc"}  # the expired fact is not imported
    assert all(r["recorded_at"] <= T0 - 500 for r in records.values())
    assert dot(a, "s1", 3) is False
    assert dot(a, "s2", 4) is True  # completed after its legacy clear
    assert dot(a, "s_old", 1) is False
    assert set(stored_map(a, CM)) == {"s2"}
    # Once: a second client (and a second instance) finds nothing to import.
    b = open_page(context, origin, now=T0, after=a)
    a.evaluate("window.U2 = make(false)")
    assert {k for k in stored(b) if k.startswith(CLEARED)} == set(records)
    assert {k for k in stored(a) if k.startswith(CLEARED)} == set(records)
    assert dot(b, "s2", 4) is True
    # Legacy numeric counts are generation 0 and are saved in the structured form.
    assert dot(a, "s9", 6) is True
    a.evaluate("U.acknowledge(row('s10', 1))")
    assert stored_map(a, VC)["s9"] == {"message_count": 5, "transcript_generation": 0}


def test_quota_full_still_clears_the_dot_in_this_page(
    context: BrowserContext, origin: ServerProcess
) -> None:
    a = open_page(context, origin)
    a.evaluate("U.acknowledge(row('s0', 1)); U.markCompletion('s1', {message_count: 5})")
    a.evaluate("U.clearCompletion('s1'); U.markCompletion('s1', {message_count: 5})")
    older = clear_stamps(a, "s1")
    assert len(older) == 1
    assert dot(a, "s1", 5) is True
    assert a.evaluate("U.degraded") is False
    a.evaluate("window.quotaFull = true")
    a.evaluate("U.acknowledge(row('s1', 5))")  # must not throw
    assert a.evaluate("U.degraded") is True
    assert dot(a, "s1", 5) is False
    assert "s1" not in stored_map(a, CM)  # the smaller write still removed the marker
    assert clear_stamps(a, "s1") == older  # the older durable record stays
    a.evaluate("U.refresh(); U.prune()")
    assert dot(a, "s1", 5) is False
    assert clear_stamps(a, "s1") == older


def test_storage_events_repair_the_other_page_without_ping_pong(
    context: BrowserContext, origin: ServerProcess
) -> None:
    a = open_page(context, origin)
    b = open_page(context, origin)
    c = open_page(context, origin, store=False)
    a.evaluate("U.acknowledge(row('s1', 4)); U.markCompletion('s2', {message_count: 1})")
    b.wait_for_function("() => window.changes > 0", timeout=5000)
    wait_dot(b, "s2", 1, True)  # repainted from storage events, no reload
    b.evaluate("U.acknowledge(row('s2', 1)); U.acknowledge(row('s3', 6))")
    a.wait_for_function(
        "() => window.changes > 0 && U.hasUnread(row('s2', 1)) === false", timeout=5000
    )
    settle(a, b)
    propagate(b, a, c)
    a.evaluate("window.writes = []")
    b.evaluate("window.writes = []")
    # A stale client clobbers both whole maps; the clients holding the facts re-assert them.
    c.evaluate(f"localStorage.setItem('{VC}', '{{}}'); localStorage.setItem('{CM}', '{{}}')")
    c.wait_for_function(
        f"""() => {{
          const vc = JSON.parse(localStorage.getItem('{VC}') || '{{}}');
          return vc.s1?.message_count === 4 && vc.s3?.message_count === 6;
        }}""",
        timeout=5000,
    )
    settle(a, b)
    writes = a.evaluate("window.writes") + b.evaluate("window.writes")
    assert 1 <= len(writes) <= 4, writes
    assert set(writes) <= {VC}  # handlers re-assert held facts; they never write tombstones
    time.sleep(0.5)
    assert a.evaluate("window.writes") + b.evaluate("window.writes") == writes
    for page in (a, b):
        assert dot(page, "s2", 1) is False
        assert dot(page, "s1", 5) is True


def test_hidden_filtered_row_keeps_its_cleared_state(
    context: BrowserContext, origin: ServerProcess
) -> None:
    a = open_page(context, origin, now=T0)
    b = open_page(context, origin, now=T0)
    a.evaluate(
        "U.markCompletion('s1', {message_count: 2});U.markCompletion('s2', {message_count: 2})"
    )
    propagate(a, b)
    b.evaluate("U.refresh(); U.acknowledge(row('s1', 2))")
    # The sidebar filter now hides s1: only s2 is ever passed to hasUnread, for days.
    for page in (a, b):
        page.evaluate(f"window.now = {T0 + 3 * DAY}")
    for n in (3, 4, 5):
        propagate(b, a)
        a.evaluate(f"U.prune(); U.markCompletion('s2', {{message_count: {n}}})")
        wait_dot(b, "s2", n, True)
        b.evaluate(f"U.prune(); U.acknowledge(row('s2', {n}))")
        wait_dot(a, "s2", n, False)
    propagate(b, a)
    c = open_page(context, origin, now=T0 + 3 * DAY, after=b)  # a fresh client prunes too
    assert clear_stamps(c, "s1"), "an absent row is not evidence for pruning its clear"
    for page in (a, b, c):
        page.evaluate("U.refresh()")
        assert dot(page, "s1", 2) is False
    # Past retention the record goes, and the dot still stays cleared.
    c.evaluate(f"window.now = {T0 + 8 * DAY}; U.prune()")
    assert clear_stamps(c, "s1") == []
    assert dot(open_page(context, origin, now=T0 + 8 * DAY, after=c), "s1", 2) is False
