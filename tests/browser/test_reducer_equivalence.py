"""Layer: browser. docs/architecture.md §4: the page's one reducer per session (`web/js/reducer.js`)
folds `(seq, event)` exactly like the server's `TranscriptFold`, whether the events arrive live,
replayed, twice, or after a `session.snapshot`; its `view()` equals the Python `view()`."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tether.events import RUN_STATES, Event
from tether.projections.sidebar import fold_row, public_row
from tether.projections.transcript import TranscriptFold

from helpers import (
    ServerProcess,
    new_session,
    run_events,
    running_server,
    session_body,
    start_turn,
    wait_idle,
)

pytestmark = pytest.mark.slow

SID = "s_reducer"
SEEDS = range(150)
TEXTS = ["", "a", "Hello", " world", "hé", "😀", "a😀b", "**md**", "\n", "<b>x</b>", "x y z"]

# The page-side half: import the module once, then fold batches of logs in one round trip.
FOLD_JS = """
async ({logs, mode}) => {
  const r = await import("/static/js/reducer.js");
  return logs.map((log) => {
    const s = r.createSession(log.sid);
    const applied = [];
    if (mode === "split") {
      for (const env of log.before) r.applyEvent(s, env);
      applied.push(r.applySnapshot(s, log.snapshot));
      for (const env of log.after) applied.push(r.applyEvent(s, env));
    } else {
      for (const env of log.events) applied.push(r.applyEvent(s, env));
      if (mode === "twice") for (const env of log.events) applied.push(r.applyEvent(s, env));
    }
    return {view: JSON.stringify(r.view(s)), applied};
  });
}
"""


def imported(rnd: random.Random, turn: int) -> dict[str, Any]:
    """An `agent.imported` payload: turns with or without their user row, tool calls with or
    without results, images, and the odd compaction (context only: nothing to show)."""
    entries: list[dict[str, Any]] = []
    for k in range(rnd.randint(0, 2)):
        base = 100 * turn + 10 * k
        rows: list[dict[str, Any]] = []
        if rnd.random() < 0.8:
            rows.append(
                {
                    "row_id": base,
                    "role": "user",
                    "content": rnd.choice(TEXTS),
                    "timestamp": 2000.0 + base,
                    "images": rnd.choice([0, 0, 1, 2]),
                }
            )
        for step in range(rnd.randint(0, 4)):
            row_id = base + 1 + step
            if rnd.random() < 0.6:
                calls = (
                    [
                        {
                            "id": f"k{row_id}",
                            "name": "terminal",
                            "arguments": rnd.choice(['{"c": 1}', "not json", "[1, 2]"]),
                        }
                    ]
                    if rnd.random() < 0.5
                    else []
                )
                rows.append(
                    {
                        "row_id": row_id,
                        "role": "assistant",
                        "timestamp": 2001.0 + base,
                        "content": rnd.choice(TEXTS),
                        "tool_calls": calls,
                        "reasoning": rnd.choice([None, "", "hm"]),
                    }
                )
            else:
                rows.append(
                    {
                        "row_id": row_id,
                        "role": "tool",
                        "timestamp": 2002.0 + base,
                        "content": rnd.choice(TEXTS),
                        "tool_call_id": rnd.choice([f"k{row_id - 1}", "zz"]),
                    }
                )
        entries.append(
            {
                "kind": "turn",
                "turn_id": f"a_{base}",
                "rows": rows,
                "context": [{"role": "user", "content": "x"}],
            }
        )
    if rnd.random() < 0.2:
        entries.append({"kind": "compaction", "summary": "s", "context": []})
    return {"source": "hermes", "watermark": 100 * turn + 50, "entries": entries}


def generate(seed: int) -> list[Event]:
    """A plausible session log, with the odd stray or unknown id a real log can hold."""
    rnd = random.Random(seed)
    drafts: list[tuple[str, dict[str, Any], str | None]] = [
        ("session.created", {"title": None}, None)
    ]
    queue_ids: list[str] = []
    visible = 0
    finished: list[str] = []
    turns = rnd.randint(0, 4)

    def queue_event() -> None:
        roll = rnd.random()
        if roll < 0.5 or not queue_ids:
            qid = f"q{len(queue_ids)}"
            queue_ids.append(qid)
            atts = (
                [{"id": f"a{qid}", "name": "n.txt", "mime": "text/plain", "size": 3}]
                if rnd.random() < 0.3
                else []
            )
            drafts.append(
                (
                    "queue.added",
                    {"queue_id": qid, "text": rnd.choice(TEXTS), "attachments": atts},
                    None,
                )
            )
        elif roll < 0.75:
            drafts.append(
                (
                    "queue.updated",
                    {"queue_id": rnd.choice(queue_ids + ["qx"]), "text": rnd.choice(TEXTS)},
                    None,
                )
            )
        else:
            drafts.append(("queue.removed", {"queue_id": rnd.choice(queue_ids + ["qx"])}, None))

    def branch_event() -> None:
        """An edit or regenerate's truncate, or a switch to any row (or none) of the log."""
        known = [f"u{t}" for t in range(turns)] + [f"r{t}" for t in range(turns)]
        if rnd.random() < 0.5:
            drafts.append(
                (
                    "transcript.truncated",
                    {"keep_count": rnd.randint(0, visible), "transcript_generation": 7},
                    None,
                )
            )
        else:
            drafts.append(
                (
                    "branch.switched",
                    {
                        "row_id": rnd.choice([*known, "nope", None]),
                        "index": 1,
                        "message_count": 0,
                        "transcript_generation": 8,
                    },
                    None,
                )
            )

    for turn in range(turns):
        stream, turn_id = f"r{turn}", f"u{turn}"
        submitted: dict[str, Any] = {
            "turn_id": turn_id,
            "stream_id": stream,
            "text": rnd.choice(TEXTS),
            "attachments": [{"id": f"att{turn}", "name": "p.png", "mime": "image/png", "size": 10}]
            if rnd.random() < 0.3
            else [],
        }
        if turn and rnd.random() < 0.2:  # a new answer to the turn before: no new user row
            turn_id = f"u{turn - 1}"
            submitted.update(
                turn_id=turn_id, text="", attachments=[], regenerate=True, regenerate_of=None
            )
        if rnd.random() < 0.8:
            submitted["submitted_at"] = 1000.5 + turn
        drafts.append(("turn.submitted", submitted, stream))

        # the envelope may omit stream_id: the fold falls back to data.stream_id
        def sid_of(stream: str = stream) -> str | None:
            return stream if rnd.random() < 0.8 else None

        if rnd.random() < 0.9:
            started = {"stream_id": stream, "turn_id": turn_id}
            if rnd.random() < 0.8:
                started.update(runtime="demo", model=rnd.choice(["m", None]))
            drafts.append(("run.started", started, sid_of()))
        tools: list[str] = []
        passes: list[str] = []
        steers: list[str] = []
        items: list[str] = []
        for step in range(rnd.randint(0, 14)):
            kind = rnd.choice(
                [
                    "text",
                    "text",
                    "reasoning",
                    "reasoning",
                    "tool",
                    "done",
                    "compress",
                    "compressed",
                    "steer",
                    "deliver",
                    "trim",
                    "queue",
                    "cancel",
                    "meta",
                    "stray",
                    "truncate",
                    "ask",
                    "answer",
                    "question",
                    "reply",
                ]
            )
            if kind in ("text", "reasoning"):
                item_id = rnd.choice([f"{kind[0]}{step // 4}", f"{kind[0]}0", "shared"])
                items.append(item_id)
                drafts.append(
                    (
                        f"{kind}.delta",
                        {"stream_id": stream, "item_id": item_id, "text": rnd.choice(TEXTS)},
                        sid_of(),
                    )
                )
            elif kind == "tool":
                call = f"c{step}"
                tools.append(call)
                drafts.append(
                    (
                        "tool.started",
                        {
                            "stream_id": stream,
                            "call_id": call,
                            "name": "read",
                            "args": {"p": step, "q": [1]},
                        },
                        sid_of(),
                    )
                )
            elif kind == "done":
                call = tools.pop(0) if tools and rnd.random() < 0.85 else f"c{step}x"
                done = {
                    "stream_id": stream,
                    "call_id": call,
                    "name": "read",
                    "result_preview": rnd.choice(["x", None]),
                    "is_error": rnd.choice([False, True, None]),
                    "duration_ms": step,
                }
                if rnd.random() < 0.5:
                    done["result"] = {"ok": step}
                drafts.append(("tool.completed", done, sid_of()))
            elif kind == "compress":
                passes.append(f"p{step}")
                drafts.append(
                    ("compression.started", {"stream_id": stream, "pass_id": passes[-1]}, sid_of())
                )
            elif kind == "compressed":
                pass_id = passes.pop(0) if passes else f"p{step}x"
                drafts.append(
                    (
                        "compression.completed",
                        {
                            "stream_id": stream,
                            "pass_id": pass_id,
                            "tokens_before": 900,
                            "tokens_after": 300,
                            "summary": "s" if rnd.random() < 0.7 else None,
                            "boundary_turn_id": rnd.choice([turn_id, None]),
                        },
                        sid_of(),
                    )
                )
            elif kind == "steer":
                steer_id = rnd.choice([f"st{step}", "st0"])
                steers.append(steer_id)
                drafts.append(
                    (
                        "steer.accepted",
                        {
                            "stream_id": stream,
                            "steer_id": steer_id,
                            "text": rnd.choice([*TEXTS, None]),
                        },
                        sid_of(),
                    )
                )
            elif kind == "deliver":
                taken = rnd.sample(steers, min(len(steers), rnd.randint(0, 2))) + ["zz"]
                drafts.append(
                    ("steer.delivered", {"stream_id": stream, "steer_ids": taken}, sid_of())
                )
            elif kind == "trim":
                item_id = rnd.choice(items) if items and rnd.random() < 0.8 else "nope"
                drafts.append(
                    (
                        "reasoning.trimmed",
                        {"stream_id": stream, "item_id": item_id, "length": rnd.randint(-2, 6)},
                        sid_of(),
                    )
                )
            elif kind == "queue":
                queue_event()
            elif kind == "ask":
                drafts.append(
                    (
                        "approval.requested",
                        {
                            "stream_id": stream,
                            "approval_id": rnd.choice(["ap1", f"ap{step}"]),
                            "command": rnd.choice(TEXTS),
                            "description": rnd.choice([*TEXTS, None]),
                            **(
                                {}
                                if rnd.random() < 0.3
                                else {
                                    "choices": rnd.choice(
                                        [["once", "session", "always", "deny"], [], "once", 3]
                                    )
                                }
                            ),
                        },
                        sid_of(),
                    )
                )
            elif kind == "question":
                drafts.append(
                    (
                        "clarify.requested",
                        {
                            "stream_id": stream,
                            "question_id": rnd.choice(["q1", f"q{step}"]),
                            "question": rnd.choice(TEXTS),
                            **(
                                {}
                                if rnd.random() < 0.3
                                else {"choices": rnd.choice([["red", "blue"], [], "red", 3])}
                            ),
                        },
                        sid_of(),
                    )
                )
            elif kind == "reply":
                drafts.append(
                    (
                        "clarify.resolved",
                        {
                            "stream_id": stream,
                            "question_id": rnd.choice(["q1", f"q{step}x"]),
                            "text": rnd.choice([*TEXTS, ""]),
                            "reason": rnd.choice(["user", "timeout", "stopped"]),
                        },
                        sid_of(),
                    )
                )
            elif kind == "answer":
                drafts.append(
                    (
                        "approval.resolved",
                        {
                            "stream_id": stream,
                            "approval_id": rnd.choice(["ap1", f"ap{step}x"]),
                            "choice": rnd.choice(["once", "session", "always", "deny"]),
                            "reason": rnd.choice(["user", "timeout", "stopped"]),
                        },
                        sid_of(),
                    )
                )
            elif kind == "cancel":
                drafts.append(("run.cancel_requested", {"stream_id": stream}, sid_of()))
            elif kind == "meta":
                drafts.append(("session.updated", {"pinned": rnd.random() < 0.5}, None))
            elif kind == "truncate":  # the fold does not forbid it mid-run
                drafts.append(
                    (
                        "transcript.truncated",
                        {"keep_count": rnd.randint(0, visible), "transcript_generation": 99},
                        None,
                    )
                )
                visible = min(visible, drafts[-1][1]["keep_count"])
            elif kind == "stray" and finished:  # a late event for a settled run
                drafts.append(
                    (
                        "text.delta",
                        {"stream_id": finished[-1], "item_id": "t0", "text": "late"},
                        finished[-1],
                    )
                )
        if steers and rnd.random() < 0.6:
            drafts.append(
                ("steer.leftover", {"stream_id": stream, "steer_ids": [*steers, "zz"]}, sid_of())
            )
        if rnd.random() < 0.3:  # another client of the agent wrote a turn meanwhile
            drafts.append(("agent.imported", imported(rnd, turn), None))
        if turn == turns - 1 and rnd.random() < 0.35:
            break  # the last run is still live
        state = rnd.choice([*RUN_STATES, "mystery"])
        fin: dict[str, Any] = {"stream_id": stream, "turn_id": turn_id, "state": state}
        if state == "error":
            fin["error"] = rnd.choice(
                [{"code": "upstream", "message": "boom"}, {"code": "rate_limit"}, {}, None]
            )
        if state in ("cancelled", "interrupted") and rnd.random() < 0.5:
            fin["reason"] = "user asked"
        if rnd.random() < 0.3:
            fin["usage"] = rnd.choice([{"prompt_tokens": 5, "completion_tokens": 2}, {}])
        if rnd.random() < 0.3:  # the provider's finish_reason: "length" is a cut-off answer
            fin["finish_reason"] = rnd.choice(["length", "length", "stop", "", None])
        if rnd.random() < 0.1:
            del fin["state"]
        drafts.append(("run.finished", fin, sid_of()))
        finished.append(stream)
        visible += 2
        if rnd.random() < 0.2:
            drafts.append(
                (
                    "transcript.truncated",
                    {"keep_count": rnd.randint(0, visible), "transcript_generation": turn + 1},
                    None,
                )
            )
            visible = min(visible, drafts[-1][1]["keep_count"])
        if rnd.random() < 0.3:
            queue_event()
        if rnd.random() < 0.4:
            branch_event()
    return [
        Event(SID, seq, type_, 2000.25 + seq, data, stream, None)
        for seq, (type_, data, stream) in enumerate(drafts, start=1)
    ]


def envelopes(events: list[Event]) -> list[dict[str, Any]]:
    return [e.envelope() for e in events]


def fold(events: list[Event]) -> TranscriptFold:
    transcript = TranscriptFold()
    for event in events:
        transcript.apply(event)
    return transcript


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


def shape(value: Any) -> Any:
    """Values plus dict key order, so equal shapes mean the same JSON field for field."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    return value


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return next((d for k in a if (d := first_difference(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next(
            (
                d
                for i, (x, y) in enumerate(zip(a, b, strict=True))
                if (d := first_difference(x, y, f"{path}[{i}]"))
            ),
            None,
        )
    return None if a == b else f"{path}: {a!r} != {b!r}"


def assert_same(js_view_json: str, py_view: dict[str, Any], label: str) -> None:
    js_view = json.loads(js_view_json)
    assert js_view == py_view, f"{label}: {first_difference(js_view, py_view)}"
    assert shape(js_view) == shape(py_view), f"{label}: field order differs"


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


def fold_in_page(page: Page, logs: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    return page.evaluate(FOLD_JS, {"logs": logs, "mode": mode})


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
    assert any(
        item.get("kind") == "length"
        for v in views
        for m in v["messages"]
        for item in m.get("timeline", [])
    )
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


REV_JS = """
async (sid) => {
  const r = await import("/static/js/reducer.js");
  const s = r.createSession(sid);
  let seq = 0;
  const apply = (type, data) => {
    s.dirty.clear();
    r.applyEvent(s, {seq: ++seq, session_id: sid, type, at: seq, stream_id: "r1", data});
    return [...s.dirty].sort();
  };
  const out = {};
  out.submitted = apply("turn.submitted", {turn_id: "u1", stream_id: "r1", text: "hi",
                                           attachments: []});
  out.first = apply("text.delta", {stream_id: "r1", item_id: "t1", text: "a"});
  const item = r.liveScene(s).items[0];
  const rev1 = item.rev;
  out.second = apply("text.delta", {stream_id: "r1", item_id: "t1", text: "b"});
  out.grew = item.rev > rev1 && item.text === "ab";
  const rev2 = item.rev;
  out.tool = apply("tool.started", {stream_id: "r1", call_id: "c1", name: "x", args: {}});
  out.interimBumped = item.rev > rev2 && item.interim === true;
  out.finished = apply("run.finished", {stream_id: "r1", turn_id: "u1", state: "cancelled"});
  out.row = s.messages[1].rev > 0 && s.messages[1].timeline[0] === item;
  out.viewHasRev = JSON.stringify(r.view(s)).includes('"rev"');
  const clock = s.clock;
  s.dirty.clear();
  r.applySnapshot(s, {session_id: sid, ...r.view(s), last_seq: seq});
  out.snapshotRevsFresh = s.messages.every((m) => m.rev > clock);
  out.snapshotDirty = [...s.dirty].sort();
  out.ignored = r.applyEvent(s, {seq, session_id: sid, type: "text.delta", data: {}});
  return out;
}
"""


def test_rev_and_dirty_track_what_changed(page: Page) -> None:
    out = page.evaluate(REV_JS, SID)
    assert out["submitted"] == [":live", ":messages", "u1"]
    assert out["first"] == [":live", "r1.t1"]
    assert out["second"] == ["r1.t1"]
    assert out["grew"] and out["interimBumped"] and out["row"]
    assert out["tool"] == [":live", "r1.t1", "r1.tool.c1"]
    assert out["finished"] == [":live", ":messages", "r1", "r1.notice"]
    assert out["viewHasRev"] is False
    assert out["snapshotRevsFresh"]
    assert out["snapshotDirty"] == [
        ":live",
        ":messages",
        ":queued",
        "r1",
        "r1.notice",
        "r1.t1",
        "r1.tool.c1",
        "u1",
    ]
    assert out["ignored"] is False


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


def test_the_page_listens_to_every_durable_event_type() -> None:
    """An SSE frame whose `event:` name the page does not listen to is silently dropped by
    EventSource: each type in `tether/events.py` must be in `stream.js`'s EVENT_TYPES (found
    missing for `approval.*` and `agent.imported` when they were added)."""
    from tether import events

    declared = {
        value
        for name, value in vars(events).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[a-z_]+\.[a-z_]+", value)
    }
    source = (Path(__file__).parents[2] / "src/tether/web/js/stream.js").read_text()
    listed = set(
        re.findall(
            r'"([a-z_]+\.[a-z_]+)"', source[source.index("EVENT_TYPES") : source.index("];")]
        )
    )
    assert declared == listed
