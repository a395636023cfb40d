"""A long session in the page: opening one and streaming a run in one cost the browser what
changes, not the session's length. Measured on a 1,200-row session, the page laid out and
painted every row on every frame of a run (a run took 5-7 times the main thread it takes in
an empty session), and moving each rendered answer from the inert document into the page's
cost more than parsing and sanitising it, and opening it parsed every answer before showing
anything (docs/page.md, "Long sessions"). Layer: the page's
transcript view only; the reducer and the log are untouched. Contract invariant 5 (one
renderer path): a row is skipped only when what it is drawn from is unchanged, so what is
shown is still the reducer's view."""

from __future__ import annotations

import pytest
from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, barrier, delay, reply, text
from helpers import ServerProcess
from pagekit import long_session, open_app, send, wait_settled

pytestmark = pytest.mark.slow

TURNS = 150


# Every change under a row from the moment it is installed (until the next one):
# [the row's place, whether it is the live row, the kind of change, the element].
WATCH_ROWS = """
() => {
  window.__watch?.disconnect();
  window.__rowChanges = [];
  const rows = document.querySelector('#transcript .rows');
  window.__watch = new MutationObserver((records) => {
    for (const r of records) {
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      const row = el.closest('.rows > *');
      if (row) {
        window.__rowChanges.push([[...rows.children].indexOf(row),
                                  row.classList.contains('live'), r.type, el.nodeName]);
      }
    }
  });
  window.__watch.observe(rows, { subtree: true, childList: true, characterData: true,
                                 attributes: true });
}
"""
CHANGES = "window.__watch.takeRecords(), window.__rowChanges"


def test_a_run_in_a_long_session_redraws_its_live_row_and_leaves_the_settled_ones_alone(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """Each live frame redrew every settled row with the same text (its status line, its
    model, its controls), and each write cost the browser that row's style and layout: now a
    settled row is drawn again only when it or what it is drawn with changed."""
    sid = long_session(openai_web, 40)
    parts = []
    for i in range(16):
        parts += [text(f"w{i} "), delay(0.04)]
    fake.script(reply(text("start "), delay(0.3), *parts, barrier("held"), text("end")))
    page = context.new_page()
    open_app(page, openai_web.base_url, f"/s/{sid}")
    expect(page.locator(".row")).to_have_count(80, timeout=30_000)
    send(page, "one more")
    live = page.locator(".row.live .markdown")
    expect(live).to_contain_text("start")
    page.evaluate(WATCH_ROWS)
    expect(live).to_contain_text("w15")  # about seven live frames later, still live
    changes = page.evaluate(CHANGES)
    assert [change for change in changes if not change[1]] == []  # settled rows: untouched
    page.evaluate(WATCH_ROWS)
    fake.release("held")
    wait_settled(page)
    expect(page.locator(".row.assistant .markdown").last).to_contain_text("w15 end")
    # As the run ends, Edit and Regenerate come back on every row, and nothing else changes
    # but on the rows around the end (the last answer before, the turn, its answer).
    changes = page.evaluate(CHANGES)
    above = [change for change in changes if change[0] < 79]
    assert above and all(change[2:] == ["attributes", "BUTTON"] for change in above), above[:5]


def test_settled_rows_out_of_view_are_skipped_by_the_browser_and_drawn_when_scrolled_to(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Rows out of view are neither laid out nor painted (`content-visibility: auto`); their
    text is still there for find-in-page, and they draw when scrolled into view."""
    sid = long_session(web_server, TURNS)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    rows = page.locator(".rows > .row")
    expect(rows).to_have_count(2 * TURNS, timeout=30_000)
    # a row itself is kept (its size); what the browser skips is inside it
    drawn = "el => el.firstElementChild.checkVisibility({ contentVisibilityAuto: true })"
    expect(rows.last).to_contain_text(f"Answer {TURNS - 1}")
    page.wait_for_function(
        "() => { const r = document.querySelectorAll('.rows > .row');"
        " return r[r.length - 1].firstElementChild"
        ".checkVisibility({ contentVisibilityAuto: true }); }"
    )
    assert rows.first.evaluate(drawn) is False  # scrolled far out of view: skipped
    assert "Question 0" in rows.first.evaluate("el => el.textContent")
    rows.first.scroll_into_view_if_needed()
    page.wait_for_function(
        "() => document.querySelector('.rows > .row').firstElementChild"
        ".checkVisibility({ contentVisibilityAuto: true })"
    )
    assert rows.last.evaluate(drawn) is False


def test_a_long_history_renders_its_last_answers_at_once_and_the_ones_above_when_idle(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Opening a 1,200-row session parsed and sanitised every answer before the page showed
    anything. The last rows' answers render at once; those above show as their text (found by
    find-in-page) until the page is idle, then render newest first."""
    sid = long_session(web_server, TURNS)
    page = context.new_page()
    open_app(page, web_server.base_url, f"/s/{sid}")
    rows = page.locator(".rows > .row")
    expect(rows).to_have_count(2 * TURNS, timeout=30_000)
    first = rows.nth(1).locator(".markdown")
    shown = first.evaluate("el => [el.className, el.textContent]")
    assert rows.last.locator(".markdown strong").inner_text() == f"Answer {TURNS - 1}"
    assert "later" in shown[0] and shown[1].startswith("**Answer 0**")  # not rendered yet
    expect(first.locator("strong")).to_have_text("Answer 0")  # rendered when idle
    expect(first.locator(".code-block .copy-code")).to_have_count(1)
    expect(page.locator(".markdown.later")).to_have_count(0)


# Counts the nodes inserted into a node of another document (adopted: moved across), while the
# page's renderer draws settled answers and a streamed one.
ADOPTIONS_JS = """async (texts) => {
  const { MarkdownView } = await import('/static/js/markdown.js');
  let adopted = 0;
  const watch = (proto, name) => {
    const native = proto[name];
    proto[name] = function (...nodes) {
      for (const node of nodes) {
        if (node instanceof Node && node.ownerDocument !== this.ownerDocument) adopted++;
      }
      return native.apply(this, nodes);
    };
  };
  watch(Element.prototype, 'append');
  watch(Element.prototype, 'prepend');
  watch(Element.prototype, 'replaceChildren');
  watch(Node.prototype, 'appendChild');
  watch(Node.prototype, 'insertBefore');
  for (const doc of texts) new MarkdownView(document.createElement('div')).show(doc);
  const live = new MarkdownView(document.createElement('div'));
  const whole = texts.join('\\n');
  for (let end = 40; end < whole.length + 40; end += 40) live.show(whole.slice(0, end));
  return { adopted, shown: live.el.querySelectorAll('strong').length };
}"""


def test_rendered_answers_are_cloned_into_the_page_not_moved_across_documents(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Answers are parsed and sanitised in an inert document, where nothing loads or runs.
    Moving the nodes from there into the page's (adoption) cost more than the parse and the
    sanitiser together: a renderer drawing 400 short answers took 3.3-6.2 times what those two
    take on their own, against 1.4-2.0 with the nodes cloned (docs/page.md)."""
    texts = [f"**Answer {i}**\n\n- one\n- two\n\nSome *text* and `code`.\n" for i in range(100)]
    page = context.new_page()
    open_app(page, web_server.base_url)
    drawn = page.evaluate(ADOPTIONS_JS, texts)
    assert drawn == {"adopted": 0, "shown": 100}
