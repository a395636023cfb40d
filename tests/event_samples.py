"""Payloads made from the event definitions (`tether/events.py`), for the tests that hold the
folds to them: `tests/test_event_definitions.py` (the server's folds) and
`tests/browser/test_page_event_fields.py` (the page's)."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin, get_type_hints

from typing_extensions import is_typeddict

from tether import events as ev
from tether.events import VOCABULARY


def sample(hint: Any, *, full: bool) -> Any:
    """A value of the type `hint` describes: with only the required fields of a TypedDict,
    or (`full`) with every field."""
    if is_typeddict(hint):
        keys = hint.__required_keys__ | (hint.__optional_keys__ if full else frozenset())
        return {k: sample(v, full=full) for k, v in get_type_hints(hint).items() if k in keys}
    if get_origin(hint) in (Union, types.UnionType):
        return sample(next(a for a in get_args(hint) if a is not type(None)), full=full)
    origin = get_origin(hint) or hint
    return {str: "x", int: 1, float: 1.5, bool: True, list: [], dict: {}}[origin]


def every_type_in_a_running_turn() -> list[tuple[str, dict[str, Any]]]:
    """(type, data) for a session with a running turn of stream `r1`, where every fold's
    handlers act, then each durable type with all its fields, `run.finished` last."""
    opening = [
        (ev.SESSION_CREATED, {"title": "t"}),
        (ev.TURN_SUBMITTED, sample(ev.TurnSubmitted, full=True)),
        (ev.RUN_STARTED, sample(ev.RunStarted, full=True)),
    ]
    rest = [
        (t.name, sample(t.payload, full=True))
        for t in VOCABULARY
        if t.durable and t.name != ev.RUN_FINISHED
    ]
    out = []
    for name, data in [*opening, *rest, (ev.RUN_FINISHED, sample(ev.RunFinished, full=True))]:
        out.append((name, {**data, "stream_id": "r1"} if "stream_id" in data else data))
    return out
