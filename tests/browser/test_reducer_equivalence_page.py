"""Layer: browser. The page's reducer (`web/js/reducer.js`, docs/architecture.md §4) with the
page around it: what each event marks changed (`rev`) and the frame view kept by it, a real demo run
folded to the server's own transcript, and the page's session stream listening to every
durable event type. The equivalence on generated logs is `test_reducer_equivalence.py`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tether.events import VOCABULARY

from helpers import (
    ServerProcess,
    new_session,
    run_events,
    running_server,
    session_body,
    start_turn,
    wait_idle,
)
from reducer_kit import SID, envelopes, fold_in_page, generate, shape

pytestmark = pytest.mark.slow


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


REV_JS = """
async (sid) => {
  const r = await import("/static/js/reducer.js");
  const s = r.createSession(sid);
  let seq = 0;
  const apply = (type, data) =>
    r.applyEvent(s, {seq: ++seq, session_id: sid, type, at: seq, stream_id: "r1", data});
  const out = {};
  apply("turn.submitted", {turn_id: "u1", stream_id: "r1", text: "hi", attachments: []});
  const user = s.messages[0];
  const userRev = user.rev;
  apply("text.delta", {stream_id: "r1", item_id: "t1", text: "a"});
  const item = r.liveScene(s).items[0];
  const rev1 = item.rev;
  apply("text.delta", {stream_id: "r1", item_id: "t1", text: "b"});
  out.grew = item.rev > rev1 && item.text === "ab";
  const rev2 = item.rev;
  apply("tool.started", {stream_id: "r1", call_id: "c1", name: "x", args: {}});
  out.interimBumped = item.rev > rev2 && item.interim === true;
  out.userUntouched = user.rev === userRev;
  apply("run.finished", {stream_id: "r1", turn_id: "u1", state: "cancelled"});
  out.row = s.messages[1].rev > 0 && s.messages[1].timeline[0] === item;
  out.viewHasRev = JSON.stringify(r.view(s)).includes('"rev"');
  const clock = s.clock;
  r.applySnapshot(s, {session_id: sid, ...r.view(s), last_seq: seq});
  out.snapshotRevsFresh = s.messages.every((m) => m.rev > clock);
  out.ignored = r.applyEvent(s, {seq, session_id: sid, type: "text.delta", data: {}});
  return out;
}
"""


def test_rev_tracks_what_changed(page: Page) -> None:
    out = page.evaluate(REV_JS, SID)
    assert out["grew"] and out["interimBumped"] and out["row"] and out["userUntouched"]
    assert out["viewHasRev"] is False
    assert out["snapshotRevsFresh"]
    assert out["ignored"] is False


# After every event of a log (and around a snapshot taken halfway), the page's frame view
# must equal `view()` without its branches although it reuses the copy of every row whose
# `rev` did not move: a change to a row that does not bump its rev would show here as a
# stale copy. Also counts the rows the frame view did not copy again.
FRAME_JS = """
async ({logs}) => {
  const r = await import("/static/js/reducer.js");
  return logs.map(({sid, events, stale, half}) => {
    const s = r.createSession(sid);
    let last = r.frameView(s);
    const result = {stale: [], copiedOnDelta: [], deltas: 0};
    const check = (step, type) => {
      const frame = r.frameView(s);
      const { branches, ...expected } = r.view(s);
      if (JSON.stringify(frame) !== JSON.stringify(expected)) result.stale.push(step);
      if (type === "text.delta" || type === "reasoning.delta") {
        result.deltas++;
        const before = new Set(last.messages);
        if (!frame.messages.every((row) => before.has(row))) result.copiedOnDelta.push(step);
      }
      last = frame;
    };
    const apply = (from, to) => {
      for (let i = from; i < to; i++) { r.applyEvent(s, events[i]); check(i, events[i].type); }
    };
    if (half === null) {
      apply(0, events.length);
      return result;
    }
    const other = r.createSession(sid);  // a snapshot taken halfway, met after `stale` events
    for (const env of events.slice(0, half)) r.applyEvent(other, env);
    apply(0, stale);
    r.applySnapshot(s, {session_id: sid, ...r.view(other), last_seq: other.lastSeq});
    check("snapshot");
    apply(half, events.length);
    return result;
  });
}
"""


def test_a_frame_copies_only_the_rows_that_changed(page: Page) -> None:
    """Layer: the page's reducer (`frameView`, web/js/reducer.js). Contract invariant 5 (one
    renderer path): the page draws each frame from copies it keeps while a row's `rev` is
    the same, so a live frame of a run costs what changed, not the session's length; and what
    it draws is still exactly the reducer's `view()`, after every event of 150 generated logs,
    whole and split by a snapshot."""
    logs = []
    for seed in range(150):
        events = envelopes(generate(seed))
        half = len(events) // 2
        logs.append({"sid": SID, "events": events, "stale": 0, "half": None})
        logs.append({"sid": SID, "events": events, "stale": half // 2, "half": half})
    results = page.evaluate(FRAME_JS, {"logs": logs})
    assert [r["stale"] for r in results] == [[] for _ in results]
    # a delta changes the live row only: every settled row's copy is the last frame's
    assert [r["copiedOnDelta"] for r in results] == [[] for _ in results]
    assert sum(r["deltas"] for r in results) > 500


def test_a_real_demo_run_folds_to_the_servers_transcript(page: Page, server: ServerProcess) -> None:
    with server.client() as client:
        sid = new_session(client)
        frames = []
        for message in ("hello there, reducer", "a second turn"):
            started = start_turn(client, sid, message)
            frames = run_events(client, sid, started["stream_id"])
            wait_idle(client, sid)
        body = session_body(client, sid)
    events = [frame.json for frame in frames if frame.get("id")]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["type"] for e in events} >= {"text.delta", "tool.completed", "run.finished"}
    [result] = fold_in_page(page, [{"sid": sid, "events": events}], "once")
    js_view = json.loads(result["view"])
    assert js_view["messages"] == body["messages"]
    assert shape(js_view["messages"]) == shape(body["messages"])
    assert len(body["messages"]) == 4 and body["messages"][-1]["state"] == "completed"
    assert {key: js_view[key] for key in js_view} == {key: body[key] for key in js_view}


# Records the types the page's session stream listens for (instrumentation of the browser's
# own EventSource: every listener still goes to the real one).
LISTENED_JS = """
window.__listened = [];
const add = EventSource.prototype.addEventListener;
EventSource.prototype.addEventListener = function (type, ...rest) {
  if (this.url.includes("/api/sessions/")) window.__listened.push(type);
  return add.call(this, type, ...rest);
};
"""


def test_the_page_listens_to_every_durable_event_type(
    browser: Browser, server: ServerProcess
) -> None:
    """An SSE frame whose `event:` name the page does not listen to is silently dropped by
    EventSource (found missing for `approval.*` and `agent.imported` when they were added):
    the page's session stream listens for every type defined in `tether/events.py`, durable
    ones from the list the server serves from the definitions, and nothing undefined."""
    with server.client() as client:
        sid = new_session(client)
    ctx = browser.new_context()
    try:
        ctx.add_init_script(LISTENED_JS)
        page = ctx.new_page()
        page.goto(f"{server.base_url}/s/{sid}")
        page.wait_for_function("() => window.__listened.includes('session.created')")
        listened = page.evaluate("() => window.__listened")
    finally:
        ctx.close()
    durable = set(VOCABULARY.durable_names())
    transient = {t.name for t in VOCABULARY if not t.durable}
    assert durable <= set(listened)
    assert set(listened) - durable == transient
