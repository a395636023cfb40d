"""A steer recorded through another replica in the instant its run ends (docs/api.md §14):
`steer.accepted` is in the log before `run.finished`, but the owner could no longer append
its `steer.leftover`. Layer: the transcript fold (and the page's reducer, which
tests/browser/test_reducer_equivalence.py holds equal to it). Invariant 1: what the user sees
is what the model got: the steer shows as not delivered, never as taken in, and it is in no
model context; nothing the user typed disappears."""

from __future__ import annotations

from tether import events as ev
from tether.events import Event
from tether.projections.context import context_messages
from tether.projections.transcript import TranscriptFold

SID, STREAM, TURN = "s_1", "r_1", "u_1"


def folded(*tail: tuple[str, dict]) -> TranscriptFold:
    steps = [
        (ev.SESSION_CREATED, {}),
        (
            ev.TURN_SUBMITTED,
            {
                "turn_id": TURN,
                "stream_id": STREAM,
                "text": "go",
                "attachments": [],
                "submitted_at": 2.0,
            },
        ),
        (ev.RUN_STARTED, {"stream_id": STREAM, "turn_id": TURN, "runtime": "fake", "model": "m"}),
        (ev.STEER_ACCEPTED, {"stream_id": STREAM, "steer_id": "st_1", "text": "also X"}),
        *tail,
    ]
    fold = TranscriptFold()
    for seq, (kind, data) in enumerate(steps, start=1):
        fold.apply(Event(SID, seq, kind, float(seq), data, STREAM, TURN))
    return fold


def test_a_steer_still_waiting_when_the_run_ends_shows_as_left_over() -> None:
    fold = folded((ev.RUN_FINISHED, {"stream_id": STREAM, "state": "completed"}))
    answer = fold.view()["messages"][-1]
    steers = [item for item in answer["timeline"] if item["type"] == "steer"]
    assert steers == [
        {"id": f"{STREAM}.steer.st_1", "type": "steer", "text": "also X", "leftover": True}
    ]
    assert fold.view()["live"] is None
    assert "also X" not in str(context_messages(fold.view()["messages"]))


def test_a_steer_given_back_before_the_end_is_shown_once() -> None:
    fold = folded(
        (ev.STEER_LEFTOVER, {"stream_id": STREAM, "steer_ids": ["st_1"]}),
        (ev.RUN_FINISHED, {"stream_id": STREAM, "state": "completed"}),
    )
    steers = [i for i in fold.view()["messages"][-1]["timeline"] if i["type"] == "steer"]
    assert [s["leftover"] for s in steers] == [True]
