"""Layer: browser. docs/architecture.md §4: the page's one reducer per session (`web/js/reducer.js`)
folds `(seq, event)` exactly like the server's `TranscriptFold`, whether the events arrive live,
replayed, twice, or after a `session.snapshot`; its `view()` equals the Python `view()`. Here on
generated logs (`reducer_kit.py`), in the page and in a module Worker; the reducer with the
page and a real run around it is `test_reducer_equivalence_page.py`."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tether.events import Event
from tether.projections.sidebar import fold_row, public_row
from tether.projections.transcript import TranscriptFold

from helpers import ServerProcess, running_server
from reducer_kit import SID, assert_same, envelopes, fold, fold_in_page, generate

pytestmark = pytest.mark.slow

SEEDS = range(150)


def snapshot(events: list[Event]) -> dict[str, Any]:
    """The `session` object `GET /api/session` (and a `session.snapshot` frame) would carry
    after these events: Row fields + transcript view + last_seq."""
    transcript, row = TranscriptFold(), None
    for event in events:
        transcript.apply(event)
        row = fold_row(row, event)
    body = (
        public_row(
            row, busy=bool(transcript.active), active_stream_id=next(iter(transcript.active), None)
        )
        if row
        else {"session_id": SID}
    )
    body.update(transcript.view())
    body["last_seq"] = transcript.last_seq
    body["inherited_messages"] = []
    return body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path_factory.mktemp("reducer") / "data", env={"TETHER_DEMO_DELAY": "0.01"}
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(server.base_url + "/api/health")  # any same-origin page will do
    yield page
    ctx.close()


def test_reducer_view_equals_the_python_fold(page: Page) -> None:
    logs = [generate(seed) for seed in SEEDS]
    results = fold_in_page(page, [{"sid": SID, "events": envelopes(log)} for log in logs], "once")
    for seed, (log, result) in enumerate(zip(logs, results, strict=True)):
        assert all(result["applied"]), seed
        assert_same(result["view"], fold(log).view(), f"seed {seed}")
    # the generator reaches the interesting cases
    views = [fold(log).view() for log in logs]
    assert any(v["live"] and v["live"]["timeline"] for v in views)
    assert any(v["queued"] for v in views)
    assert any(v["branches"] and v["branches"]["hidden"] for v in views)
    assert any("branch" in m for v in views for m in v["messages"])
    assert any(v["live"] and v["live"]["pending_steers"] for v in views)
    assert any(
        item.get("leftover") for v in views for m in v["messages"] for item in m.get("timeline", [])
    )
    assert any("error" in m and "usage" in m for v in views for m in v["messages"])
    notices = {
        item.get("kind") for v in views for m in v["messages"] for item in m.get("timeline", [])
    }
    assert {"length", "content_filter"} <= notices
    kinds = {item["type"] for v in views for m in v["messages"] for item in m.get("timeline", [])}
    assert kinds == {
        "reasoning",
        "text",
        "tool",
        "compression",
        "steer",
        "notice",
        "approval",
        "clarify",
    }
    assert any(
        item.get("choice")
        for v in views
        for m in v["messages"]
        for item in m.get("timeline", [])
        if item["type"] == "approval"
    )
    assert any(
        item.get("reason") and item.get("choices")
        for v in views
        for m in v["messages"]
        for item in m.get("timeline", [])
        if item["type"] == "clarify"
    )


def test_events_of_another_session_are_ignored(page: Page) -> None:
    log = envelopes(generate(3))
    [result] = fold_in_page(page, [{"sid": "s_other", "events": log}], "once")
    assert not any(result["applied"])
    assert json.loads(result["view"]) == TranscriptFold().view()


def test_prefix_then_snapshot_then_rest_equals_folding_everything(page: Page) -> None:
    rnd = random.Random(7)
    logs, expected = [], []
    for seed in SEEDS:
        events = generate(seed)
        whole = fold(events).view()
        for cut in sorted({0, len(events), *(rnd.randint(0, len(events)) for _ in range(3))}):
            stale = rnd.randint(0, cut)  # what the page had folded before the snapshot
            overlap = rnd.randint(0, min(cut, 3))  # the live stream may repeat a few events
            logs.append(
                {
                    "sid": SID,
                    "before": envelopes(events[:stale]),
                    "snapshot": json.loads(json.dumps(snapshot(events[:cut]))),
                    "after": envelopes(events[cut - overlap :]),
                }
            )
            expected.append((seed, cut, overlap, len(events) - cut, whole))
    results = fold_in_page(page, logs, "split")
    for (seed, cut, overlap, rest, whole), result in zip(expected, results, strict=True):
        assert result["applied"] == [True] + [False] * overlap + [True] * rest
        assert_same(result["view"], whole, f"seed {seed} cut {cut}")


def test_applying_every_event_twice_equals_once(page: Page) -> None:
    logs = [generate(seed) for seed in SEEDS]
    results = fold_in_page(page, [{"sid": SID, "events": envelopes(log)} for log in logs], "twice")
    for seed, (log, result) in enumerate(zip(logs, results, strict=True)):
        assert result["applied"] == [True] * len(log) + [False] * len(log)
        assert_same(result["view"], fold(log).view(), f"seed {seed}")


WORKER_JS = """
async ({origin, logs}) => {
  // A module Worker has no DOM: no document, no window. The reducer must fold there too.
  const code = `import * as r from "${origin}/static/js/reducer.js";
    postMessage({dom: typeof document !== "undefined" || typeof window !== "undefined",
      views: ${JSON.stringify(logs)}.map((log) => {
        const s = r.createSession(log.sid);
        for (const env of log.events) r.applyEvent(s, env);
        return JSON.stringify(r.view(s));
      })});`;
  const url = URL.createObjectURL(new Blob([code], {type: "text/javascript"}));
  const worker = new Worker(url, {type: "module"});
  return await new Promise((resolve, reject) => {
    worker.onmessage = (e) => { worker.terminate(); resolve(e.data); };
    worker.onerror = (e) => { worker.terminate(); reject(new Error(e.message)); };
  });
}
"""


def test_the_module_stays_standalone(browser: Browser, server: ServerProcess) -> None:
    """The reducer is a pure fold: it runs where there is no DOM (a module Worker) and loads
    no module but its own siblings (`reducer_*.js`, which the worker runs too). Any other
    import, or any use of `document`/`window` on the fold's path, fails this test (the
    reference it replaces was a regex over the source)."""
    ctx = browser.new_context()
    try:
        requested: list[str] = []
        ctx.on("request", lambda request: requested.append(request.url))
        page = ctx.new_page()
        page.goto(server.base_url + "/api/health")
        logs = [generate(seed) for seed in range(20)]
        result = page.evaluate(
            WORKER_JS,
            {
                "origin": server.base_url,
                "logs": [{"sid": SID, "events": envelopes(log)} for log in logs],
            },
        )
        assert result["dom"] is False
        for seed, (log, view) in enumerate(zip(logs, result["views"], strict=True)):
            assert_same(view, fold(log).view(), f"seed {seed} in a worker")
        modules = [u for u in requested if u.startswith(server.base_url + "/static/")]
        folder = server.base_url + "/static/js/"
        assert modules[0] == folder + "reducer.js"
        assert len(modules) == len(set(modules)), modules
        # the module graph the worker loaded: reducer.js and its reducer_*.js siblings only
        siblings = re.compile(re.escape(folder) + r"reducer_[a-z_]+\.js")
        assert all(siblings.fullmatch(url) for url in modules[1:]), modules
    finally:
        ctx.close()


WIDE_FORK_JS = """
async ({small, large}) => {
  const r = await import("/static/js/reducer.js");
  const cost = (log) => {
    let best = Infinity;
    for (let i = 0; i < 5; i++) {
      const started = performance.now();
      const s = r.createSession(log[0].session_id);
      for (const env of log) r.applyEvent(s, env);
      r.view(s);
      best = Math.min(best, performance.now() - started);
    }
    return best;
  };
  cost(small);  // warm up: the JIT, and the heap grown to the larger fold
  cost(large);
  const s = r.createSession(large[0].session_id);
  for (const env of large) r.applyEvent(s, env);
  return {ratio: cost(large) / cost(small), view: JSON.stringify(r.view(s))};
}
"""


def wide_fork(width: int) -> list[Event]:
    """`width` edits of the first message: one fork with `width` branches under the root."""
    events = [Event(SID, 1, "session.created", 1.0, {"title": None}, None, None)]
    for i in range(width):
        if i:
            cut = {"keep_count": 0, "transcript_generation": i}
            events.append(Event(SID, len(events) + 1, "transcript.truncated", 1.0, cut, None, None))
        turn = {"turn_id": f"u{i}", "stream_id": f"r{i}", "text": "x", "attachments": []}
        events.append(Event(SID, len(events) + 1, "turn.submitted", 1.0, turn, f"r{i}", None))
    return events


def test_a_fork_folds_in_time_linear_in_its_width(page: Page) -> None:
    """Layer: page reducer (reducer_branches.js), like projections/branches: relabelling and
    re-rendering every sibling on each append made a fork of n branches cost n² in the tab
    that showed a hostile import (37x for four times the branches). Four times the branches
    now cost about four times as much (up to 9x seen on a busy machine; quadratic is 16x and
    more), and the labels are still the Python fold's."""
    large = wide_fork(8000)
    result = page.evaluate(
        WIDE_FORK_JS, {"small": envelopes(wide_fork(2000)), "large": envelopes(large)}
    )
    assert result["ratio"] < 16, f"4x the branches cost {result['ratio']:.1f}x the time"
    assert_same(result["view"], fold(large).view(), "a fork of 8,000 branches")
