"""The sidebar fold's open run (docs/api.md §3 `busy`, `active_stream_id`). Layer: the sidebar
row fold. On a log several replicas share, a replica learns of a run another one runs only
from the log: the fold keeps the run whose `turn.submitted` has no `run.finished` yet, and
whether a Stop was recorded for it (sessions/service.py `occupancy` reads both)."""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether.events import Event
from tether.projections.sidebar import fold_row

CREATED = (ev.SESSION_CREATED, None, {})


def fold(*steps: tuple[str, str | None, dict[str, Any]]) -> dict[str, Any]:
    row = None
    for seq, (kind, stream, data) in enumerate(steps, start=1):
        row = fold_row(row, Event("s_1", seq, kind, float(seq), data, stream_id=stream))
    assert row is not None
    return row


def opened(row: dict[str, Any]) -> tuple[str | None, bool]:
    return row["open_stream"], row["stop_requested"]


def test_a_run_is_open_from_its_turn_to_its_end_and_a_stop_is_noted() -> None:
    turn = (ev.TURN_SUBMITTED, "r_1", {"text": "hi"})
    assert opened(fold(CREATED)) == (None, False)
    assert opened(fold(CREATED, turn)) == ("r_1", False)
    assert opened(fold(CREATED, turn, (ev.TEXT_DELTA, "r_1", {"text": "x"}))) == ("r_1", False)
    stopped = (ev.RUN_CANCEL_REQUESTED, "r_1", {"stream_id": "r_1"})
    assert opened(fold(CREATED, turn, stopped)) == ("r_1", True)
    finished = (ev.RUN_FINISHED, "r_1", {"state": "cancelled"})
    assert opened(fold(CREATED, turn, stopped, finished)) == (None, False)
    again = (ev.TURN_SUBMITTED, "r_2", {"text": "", "regenerate": True})
    assert opened(fold(CREATED, turn, stopped, finished, again)) == ("r_2", False)


def test_another_streams_stop_or_end_leaves_the_open_run_alone() -> None:
    turn = (ev.TURN_SUBMITTED, "r_2", {"text": "hi"})
    late_stop = (ev.RUN_CANCEL_REQUESTED, "r_1", {"stream_id": "r_1"})
    late_end = (ev.RUN_FINISHED, "r_1", {"state": "completed"})
    assert opened(fold(CREATED, turn, late_stop, late_end)) == ("r_2", False)
