"""Layer: projections (transcript, model context, sidebar row). docs/api.md §10: branches are
folded from the log like everything else, so any split of the log folds to the same view
(invariant 5), nothing of any branch is ever lost, the sidebar's `message_count` is the
visible row count, and the model context holds the branch shown and no other (invariant 1).
"""

from __future__ import annotations

import gc
import json
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tether.events import Event
from tether.projections.branches import BranchTree
from tether.projections.sidebar import fold_row
from tether.projections.transcript import TranscriptFold


@st.composite
def branchy_logs(draw: st.DrawFn) -> list[Event]:
    """Turns, edits (truncate + turn), regenerations (truncate + regenerate turn) and
    switches, as the server writes them: each fork is checked against a fold of the log so
    far, exactly like sessions/branching.py does."""
    fold = TranscriptFold()
    row: dict[str, Any] | None = None
    events: list[Event] = []

    def add(type_: str, data: dict[str, Any], stream: str | None = None) -> None:
        nonlocal row
        event = Event("s", len(events) + 1, type_, float(len(events) + 1), data, stream, None)
        events.append(event)
        fold.apply(event)
        row = fold_row(row, event)

    def run(turn_id: str, stream: str, before: list[tuple[str, dict[str, Any]]], **extra: Any):
        for type_, data in before:
            add(type_, data)
        add(
            "turn.submitted",
            {"turn_id": turn_id, "stream_id": stream, "attachments": [], **extra},
            stream,
        )
        if draw(st.booleans()):
            add("text.delta", {"stream_id": stream, "item_id": "t", "text": f"said {stream}"})
        state = draw(st.sampled_from(["completed", "cancelled", "error", "interrupted"]))
        add("run.finished", {"stream_id": stream, "turn_id": turn_id, "state": state}, stream)

    add("session.created", {"title": None})
    for step in range(draw(st.integers(1, 12))):
        assert row is not None
        generation = row["transcript_generation"] + 1
        visible = fold.messages
        kind = draw(st.sampled_from(["turn", "turn", "edit", "regenerate", "switch", "undo"]))
        users = [i for i, m in enumerate(visible) if m["role"] == "user"]
        answers = [
            i
            for i, m in enumerate(visible)
            if m["role"] == "assistant" and i and visible[i - 1]["turn_id"] == m["turn_id"]
        ]
        forks = [i for i, m in enumerate(visible) if len(fold.tree.siblings(m["id"])) > 1]
        if kind == "edit" and users:
            at = draw(st.sampled_from(users))
            cut = {"keep_count": at, "transcript_generation": generation}
            run(f"u{step}", f"r{step}", [("transcript.truncated", cut)], text=f"edit {step}")
        elif kind == "regenerate" and answers:
            at = draw(st.sampled_from(answers))
            cut = {"keep_count": at, "transcript_generation": generation}
            turn_id = visible[at]["turn_id"]
            run(turn_id, f"r{step}", [("transcript.truncated", cut)], text="", regenerate=True)
        elif kind == "switch" and forks:
            at = draw(st.sampled_from(forks))
            siblings = fold.tree.siblings(visible[at]["id"])
            index = draw(st.integers(1, len(siblings)))
            target = siblings[index - 1]
            if target != visible[at]["id"]:
                add(
                    "branch.switched",
                    {
                        "row_id": target,
                        "index": index,
                        "message_count": len(fold.tree.path_if_shown(target)),
                        "transcript_generation": generation,
                    },
                )
        elif kind == "undo" and visible:
            keep = draw(st.integers(0, len(visible) - 1))
            add("transcript.truncated", {"keep_count": keep, "transcript_generation": generation})
        else:
            run(f"u{step}", f"r{step}", [], text=f"turn {step}")
    return events


def project(events: list[Event], fold: TranscriptFold | None = None, row: dict | None = None):
    fold = fold or TranscriptFold()
    for event in events:
        fold.apply(event)
        row = fold_row(row, event)
    return fold, row


def snapshot(fold: TranscriptFold, row: dict | None) -> str:
    return json.dumps([fold.view(), fold.context(), row], sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(branchy_logs(), st.data())
def test_any_split_and_any_replay_fold_to_the_same_branches(
    events: list[Event], data: st.DataObject
) -> None:
    whole = snapshot(*project(events))
    cut = data.draw(st.integers(0, len(events)))
    fold, row = project(events[:cut])
    fold, row = project(events[cut:], fold, row)
    assert snapshot(fold, row) == whole
    fold, row = project(events, fold, row)  # everything again: already seen
    assert snapshot(fold, row) == whole


@settings(max_examples=300, deadline=None)
@given(branchy_logs())
def test_nothing_of_any_branch_is_lost_and_the_model_gets_the_branch_shown(
    events: list[Event],
) -> None:
    fold, row = project(events)
    view = fold.view()
    assert row is not None and row["message_count"] == len(view["messages"])
    written = {
        e.data["turn_id"]
        for e in events
        if e.type == "turn.submitted" and not e.data.get("regenerate")
    } | {e.data["stream_id"] for e in events if e.type == "run.finished"}
    hidden = (view["branches"] or {}).get("hidden", [])
    shown_ids = [m["id"] for m in view["messages"]]
    assert sorted(shown_ids + [m["id"] for m in hidden]) == sorted(written)
    # Every fork labels each of its rows, 1..count, in the order they were made.
    for message in view["messages"] + hidden:
        siblings = fold.tree.siblings(message["id"])
        if len(siblings) > 1:
            assert message["branch"] == {
                "index": siblings.index(message["id"]) + 1,
                "count": len(siblings),
            }
        else:
            assert "branch" not in message
    # The visible path is a path: each row's parent is the row before it.
    for before, after in zip([None, *shown_ids], shown_ids, strict=False):
        assert fold.tree.parent_of[after] == before
    # The model gets the visible user messages, in order, and none of another branch.
    users = [m["content"] for m in view["messages"] if m["role"] == "user"]
    sent = [m["content"] for m in fold.context()["context_messages"] if m["role"] == "user"]
    assert sent == users


def test_a_switch_restores_the_branch_below_it_as_it_was_left() -> None:
    """Deep forks: switching at an upper fork brings back the lower fork's choice."""
    visible: list[dict[str, Any]] = []
    tree = BranchTree(visible)

    def row(row_id: str) -> dict[str, Any]:
        return {"id": row_id}

    for row_id in ("u1", "a1", "u2", "a2"):
        tree.append(row(row_id))
    tree.cut(3)  # regenerate a2
    tree.append(row("a2b"))
    tree.cut(2)  # edit u2
    tree.append(row("u2b"))
    tree.append(row("a2c"))
    assert [r["id"] for r in visible] == ["u1", "a1", "u2b", "a2c"]
    hidden, shown = tree.show("u2")
    assert [r["id"] for r in hidden] == ["u2b", "a2c"]
    assert [r["id"] for r in shown] == ["u2", "a2b"]  # the answer shown last time
    assert [r["id"] for r in visible] == ["u1", "a1", "u2", "a2b"]
    assert visible[3]["branch"] == {"index": 2, "count": 2}
    assert visible[2]["branch"] == {"index": 1, "count": 2}
    assert len(tree.path_if_shown("u2b")) == 4
    tree.show("a2")
    assert [r["id"] for r in visible] == ["u1", "a1", "u2", "a2"]
    # a fork off the path changes only what it shows once it is on the path again
    assert tree.show("a2c") == ([], [])
    assert [r["id"] for r in visible] == ["u1", "a1", "u2", "a2"]


def _wide_fork(width: int) -> list[Event]:
    """`width` edits of the first message: one fork with `width` branches under the root."""
    events = [Event("s", 1, "session.created", 1.0, {"title": None}, None, None)]
    for i in range(width):
        if i:
            cut = {"keep_count": 0, "transcript_generation": i}
            events.append(Event("s", len(events) + 1, "transcript.truncated", 1.0, cut, None, None))
        turn = {"turn_id": f"u{i}", "stream_id": f"r{i}", "text": "x", "attachments": []}
        events.append(Event("s", len(events) + 1, "turn.submitted", 1.0, turn, f"r{i}", None))
    return events


def _fold_and_read(events: list[Event]) -> float:
    """The fastest of a few folds of `events` and a `view()` (`GET /api/session`)."""
    best = float("inf")
    for _ in range(5):
        gc.collect()
        started = time.perf_counter()
        fold = TranscriptFold()
        for event in events:
            fold.apply(event)
        fold.view()
        best = min(best, time.perf_counter() - started)
    return best


def test_a_fork_folds_in_time_linear_in_its_width() -> None:
    """Layer: projections/branches; invariant 5 (branches folded from the log) holds for a
    hostile import too. Relabelling every sibling on each append made a fork of n branches
    cost n² (8,000 edits in a crafted file: seconds per fold): four times the branches now
    cost about four times as much (quadratic would be sixteen)."""
    small, large = _wide_fork(1000), _wide_fork(4000)
    _fold_and_read(small)  # warm up
    ratio = _fold_and_read(large) / _fold_and_read(small)
    assert ratio < 10, f"4x the branches cost {ratio:.1f}x the time"
    fold, _ = project(large)
    view = fold.view()
    assert view["messages"][0]["branch"] == {"index": 4000, "count": 4000}
    hidden = view["branches"]["hidden"]
    assert [m["branch"] for m in hidden[:2]] == [
        {"index": 1, "count": 4000},
        {"index": 2, "count": 4000},
    ]


@settings(max_examples=300, deadline=None)
@given(branchy_logs(), st.booleans(), st.sampled_from([None, "Be brief."]))
def test_a_pending_turn_s_context_is_the_context_once_it_is_folded(
    events: list[Event], regenerate: bool, system_prompt: str | None
) -> None:
    """The early request (runs/invocation.py) is built with `context(pending=turn)` before the
    turn commits; the worker keeps it only when it equals the context of the fold with the
    turn in it. That is so on every branch and after every edit, regenerate, switch and cut,
    for a new turn and for a regenerate of the message the transcript ends with."""
    fold, _ = project(events)
    ends_with_user = bool(fold.messages) and fold.messages[-1]["role"] == "user"
    if regenerate and not ends_with_user:
        return
    turn = fold.messages[-1]["turn_id"] if regenerate else "u_new"
    data: dict[str, Any] = {"turn_id": turn, "stream_id": "r_new", "attachments": []}
    data |= {"text": "", "regenerate": True} if regenerate else {"text": "new", "submitted_at": 9.0}
    pending = Event("s", len(events) + 1, "turn.submitted", 99.0, data, "r_new", turn)
    before = fold.context(system_prompt, pending)
    started = Event(
        "s", len(events) + 2, "run.started", 99.0, {"stream_id": "r_new", "runtime": "x"}, "r_new"
    )
    fold, _ = project([pending, started], fold)
    assert before == fold.context(system_prompt)
