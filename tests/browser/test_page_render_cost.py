"""What a streaming answer costs the browser: each rendered frame costs Chromium style,
layout, paint and compositing, so a tab that rendered every delta of a run kept about a core
busy and five such tabs fell hundreds of ms behind their streams (bench/README.md,
`outside_latency.py`). While a run streams the page renders at most every 100 ms; the
sidebar draws a burst of row changes once per frame."""

from __future__ import annotations

import concurrent.futures

from playwright.sync_api import BrowserContext, expect

from fake_openai import FakeOpenAI, delay, reply, text
from helpers import ServerProcess, new_session
from pagekit import open_app, send, wait_settled

DELTAS = 60


def layouts(cdp) -> float:  # noqa: ANN001
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    return next(m["value"] for m in metrics if m["name"] == "LayoutCount")


def test_a_streaming_run_renders_at_most_every_100_ms_and_shows_every_delta(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    parts = []
    for i in range(DELTAS):
        parts += [text(f"w{i} "), delay(0.02)]
    fake.script(reply(text("start "), delay(0.3), *parts))
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    open_app(page, openai_web.base_url)
    send(page, "stream")
    expect(page.locator(".row.live .markdown")).to_contain_text("start")
    before = layouts(cdp)
    wait_settled(page)
    during = layouts(cdp) - before
    answer = page.locator(".row.assistant .markdown").last
    expect(answer).to_have_text(" ".join(["start", *(f"w{i}" for i in range(DELTAS))]))
    # 60 deltas 20 ms apart: about 1.2 s, so about 12 live renders and the settled one;
    # rendering each delta as it came laid out the page about once a delta
    assert during <= DELTAS / 2, f"{during} layouts for {DELTAS} deltas"


SIDEBAR_MUTATIONS = """
() => {
  window.__draws = 0;
  window.__touched = new Set();
  const list = document.getElementById("session-list");
  new MutationObserver((records) => {
    window.__draws += 1;
    for (const r of records) {
      const row = (r.target.nodeType === 1 ? r.target : r.target.parentElement)
        ?.closest?.(".session-row");
      if (row) window.__touched.add(row.dataset.key);
    }
  }).observe(list, { subtree: true, childList: true, characterData: true, attributes: true });
}
"""


def test_the_sidebar_draws_a_burst_of_changes_together_and_leaves_unchanged_rows_alone(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """Twenty runs starting at once are eighty `session.changed` frames: drawn one by one,
    each rewrote every row of the list (text, labels), and the restyles and layouts held the
    tab's main thread for 50-200 ms while its stream waited (bench/README.md,
    `outside_latency.py`). The sidebar draws once per frame, and only what changed."""
    sessions = 16
    with web_server.client() as client:
        ids = [new_session(client, f"chat {i}") for i in range(sessions)]
        page = context.new_page()
        open_app(page, web_server.base_url)
        expect(page.locator(".session-row")).to_have_count(sessions)
        page.evaluate(SIDEBAR_MUTATIONS)

        renamed = client.patch("/api/session", json={"session_id": ids[0], "title": "renamed"})
        assert renamed.status_code == 200, renamed.text
        expect(page.get_by_role("link", name="renamed")).to_be_visible()
        page.wait_for_timeout(100)  # any draw still owed is done
        assert page.evaluate("[...window.__touched]") == [ids[0]]

        page.evaluate("window.__draws = 0")

        def rename(sid: str) -> int:
            return client.patch(
                "/api/session", json={"session_id": sid, "title": f"burst {sid[-4:]}"}
            ).status_code

        with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
            assert set(pool.map(rename, ids)) == {200}
        for sid in ids:
            expect(page.get_by_role("link", name=f"burst {sid[-4:]}")).to_be_visible()
        draws = page.evaluate("window.__draws")
        # drawn one by one: exactly one draw per change; here 3-6 (the burst spans frames)
        assert draws <= sessions * 3 // 4, f"{draws} draws for {sessions} changes"
