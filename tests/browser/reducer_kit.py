"""What both reducer test files (`test_reducer_equivalence*.py`) use: random but plausible
session logs, the Python fold the page's reducer must equal, the page-side fold of many logs in
one round trip, and a comparison that names the first difference. The log generator alone is
most of a test file, so it lives here rather than in either."""

from __future__ import annotations

import json
import random
from typing import Any

from playwright.sync_api import Page

from tether.events import RUN_STATES, Event
from tether.projections.transcript import TranscriptFold

SID = "s_reducer"
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
            fin["finish_reason"] = rnd.choice(
                ["length", "length", "content_filter", "stop", "", None]
            )
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


def fold_in_page(page: Page, logs: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    return page.evaluate(FOLD_JS, {"logs": logs, "mode": mode})
