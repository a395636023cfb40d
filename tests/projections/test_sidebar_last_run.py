"""The sidebar row's `last_run_state` (issue 15.4: rows show a failed last run). Layer: the
sidebar row fold. Invariant 4: it records how the last run ended but never moves
`updated_at`, `last_message_at` or the order; a maintenance run does not replace it."""

from __future__ import annotations

from typing import Any

from tether import events as ev
from tether.events import Event
from tether.projections.sidebar import fold_row, public_row, sort_key


def fold(*steps: tuple[str, float, dict[str, Any]]) -> dict[str, Any]:
    row = None
    for seq, (kind, at, data) in enumerate(steps, start=1):
        row = fold_row(row, Event("s_1", seq, kind, at, data, stream_id="r_1"))
    assert row is not None
    return row


def test_the_last_run_state_is_shown_and_never_moves_the_row() -> None:
    start = ((ev.SESSION_CREATED, 1.0, {}), (ev.TURN_SUBMITTED, 2.0, {"text": "hi"}))
    assert public_row(fold(*start), busy=False, active_stream_id=None)["last_run_state"] is None

    failed = fold(*start, (ev.RUN_FINISHED, 3.0, {"state": "error"}))
    assert failed["last_run_state"] == "error"

    interrupted = fold(*start, (ev.RUN_FINISHED, 9.0, {"state": "interrupted"}))
    assert interrupted["last_run_state"] == "interrupted"
    assert interrupted["updated_at"] == interrupted["last_message_at"] == 2.0  # recovery
    assert sort_key(interrupted) == sort_key(fold(*start))

    maintenance = fold(
        *start,
        (ev.RUN_FINISHED, 3.0, {"state": "error"}),
        (ev.RUN_FINISHED, 9.0, {"state": "completed", "maintenance": True}),
    )
    assert maintenance["last_run_state"] == "error"
    assert maintenance["updated_at"] == 3.0
