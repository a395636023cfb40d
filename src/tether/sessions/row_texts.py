"""The session list's JSON, kept row by row between lists.

`GET /api/sessions` sends every session's row: at 1,300 sessions about 600 KB of JSON, whose
encoding was three quarters of the list's cost (5.5 of 7.3 ms), paid on the event loop for
every list while most rows had not changed since the last one. A row is a function of its
persisted sidebar state and of whether a run occupies the session (`public_row`,
`SessionService.occupancy`); the store hands out a new state object whenever a session's
state changes (`fold_row` never mutates one), so a row's text is reused while the state is
the same object and the occupancy agrees.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tether.log import compact_json
from tether.projections.sidebar import public_row


class _Kept(NamedTuple):
    state: dict[str, Any]  # held, so its identity cannot be reused by another object
    busy: bool
    stream: str | None
    text: str


class RowTexts:
    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def text(self, state: dict[str, Any], busy: bool, stream: str | None) -> str:
        """The row of `state` as compact JSON (the same text `json.dumps` gives)."""
        sid = state["session_id"]
        kept = self._kept.get(sid)
        if kept is not None and kept.state is state and kept.busy == busy and kept.stream == stream:
            return kept.text
        text = compact_json.dumps(public_row(state, busy=busy, active_stream_id=stream))
        self._kept[sid] = _Kept(state, busy, stream, text)
        return text

    def forget(self, session_id: str) -> None:
        """The session is gone (deleted, here or through another replica)."""
        self._kept.pop(session_id, None)
