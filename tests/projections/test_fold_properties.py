"""Layer: projections. docs/architecture.md §1: a projection is a pure function of the events up to
seq N, so replay is idempotent (invariant 5) and reattach keeps order (invariant 3)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.events import Event
from tether.projections.context import context_messages
from tether.projections.sidebar import fold_row
from tether.projections.transcript import TranscriptFold

STATES = ["completed", "cancelled", "interrupted", "error", "tool_limit_reached"]


@st.composite
def session_events(draw: st.DrawFn) -> list[Event]:
    """A plausible session log: turns whose runs stream deltas and tools, then finish."""
    drafts: list[tuple[str, dict[str, Any], str | None]] = [
        ("session.created", {"title": None}, None)
    ]
    visible = 0
    for turn in range(draw(st.integers(0, 5))):
        stream, turn_id = f"r{turn}", f"u{turn}"
        drafts.append(
            (
                "turn.submitted",
                {
                    "turn_id": turn_id,
                    "stream_id": stream,
                    "text": draw(st.text(max_size=20)),
                    "attachments": [],
                },
                stream,
            )
        )
        drafts.append(
            (
                "run.started",
                {"stream_id": stream, "turn_id": turn_id, "runtime": "demo", "model": "m"},
                stream,
            )
        )
        open_tools: list[str] = []
        for step in range(draw(st.integers(0, 8))):
            kind = draw(st.sampled_from(["text", "reasoning", "tool", "done", "meta"]))
            if kind in ("text", "reasoning"):
                drafts.append(
                    (
                        f"{kind}.delta",
                        {
                            "stream_id": stream,
                            "item_id": f"{kind[0]}{step // 3}",
                            "text": draw(st.text(max_size=8)),
                        },
                        stream,
                    )
                )
            elif kind == "tool":
                call = f"c{step}"
                open_tools.append(call)
                drafts.append(
                    (
                        "tool.started",
                        {"stream_id": stream, "call_id": call, "name": "read", "args": {"p": step}},
                        stream,
                    )
                )
            elif kind == "done" and open_tools:
                call = open_tools.pop(0)
                drafts.append(
                    (
                        "tool.completed",
                        {
                            "stream_id": stream,
                            "call_id": call,
                            "name": "read",
                            "result_preview": "x",
                            "is_error": False,
                            "duration_ms": 3,
                        },
                        stream,
                    )
                )
            elif kind == "meta":
                drafts.append(("session.updated", {"pinned": draw(st.booleans())}, None))
        if draw(st.booleans()):
            drafts.append(("run.cancel_requested", {"stream_id": stream}, stream))
        drafts.append(
            (
                "run.finished",
                {"stream_id": stream, "turn_id": turn_id, "state": draw(st.sampled_from(STATES))},
                stream,
            )
        )
        visible += 2
        if visible and draw(st.integers(0, 4)) == 0:
            keep = draw(st.integers(0, visible - 1))
            visible = keep
            drafts.append(
                (
                    "transcript.truncated",
                    {"keep_count": keep, "transcript_generation": turn + 1},
                    None,
                )
            )
    return [
        Event("s", seq, type_, float(seq), data, stream, None)
        for seq, (type_, data, stream) in enumerate(drafts, start=1)
    ]


def project(
    events: list[Event], fold: TranscriptFold | None = None, row: dict | None = None
) -> tuple[TranscriptFold, dict]:
    fold = fold or TranscriptFold()
    for event in events:
        fold.apply(event)
        row = fold_row(row, event)
    assert row is not None
    return fold, row


def snapshot(fold: TranscriptFold, row: dict) -> str:
    return json.dumps([fold.view(), context_messages(fold.messages), row], sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(session_events(), st.data())
def test_folding_in_one_pass_equals_folding_any_split(
    events: list[Event], data: st.DataObject
) -> None:
    whole = snapshot(*project(events))
    cut = data.draw(st.integers(1, len(events)))
    fold, row = project(events[:cut])
    fold, row = project(events[cut:], fold, row)
    assert snapshot(fold, row) == whole


@settings(max_examples=300, deadline=None)
@given(session_events())
def test_folding_twice_equals_folding_once(events: list[Event]) -> None:
    once = snapshot(*project(events))
    fold, row = project(events)
    fold, row = project(events, fold, row)  # a replay of everything already seen
    assert snapshot(fold, row) == once


@settings(max_examples=300, deadline=None)
@given(session_events())
def test_every_turn_stays_before_its_run_and_each_run_yields_one_row(events: list[Event]) -> None:
    fold, row = project(events)
    messages = fold.view()["messages"]
    assert row["message_count"] == len(messages)
    seen_users: set[str] = set()
    streams: list[str] = []
    for message in messages:
        if message["role"] == "user":
            seen_users.add(message["turn_id"])
        else:
            streams.append(message["stream_id"])
            # invariant 2: the owner turn is visible before its output (unless truncated away)
            assert message["turn_id"] in seen_users or messages.index(message) == 0
    assert len(streams) == len(set(streams))
