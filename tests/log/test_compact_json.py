"""Layer: the log's row encoding (`log/compact_json.py`): the text every event row and SSE
frame carries must be exactly what `json.dumps` gave, only faster."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tether.log import compact_json
from tether.log.errors import InvalidEvent
from tether.log.sqlite import _encode
from tether.log.store import Draft

VALUES: list[Any] = [
    {"text": 'héllo ✓ \u2028 "quoted" \\ back\nslash', "n": 3, "f": 0.1, "big": 10**30},
    {"nested": [{"a": [1, 2.5, None, True, False]}, [], {}], "": ""},
    {"floats": [1e-7, 1e16, -0.0, math.inf, -math.inf]},
    ["a", 1, None],
    "a string alone",
    42,
    None,
    {"emoji": "😀", "control": "\x00\x1f"},
]


@pytest.mark.parametrize("value", VALUES)
def test_the_text_is_what_json_dumps_gives(value: Any) -> None:
    assert compact_json.dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_nan_is_written_as_json_dumps_writes_it() -> None:
    assert compact_json.dumps({"x": math.nan}) == '{"x":NaN}'


def test_what_json_cannot_carry_is_refused_as_an_invalid_event() -> None:
    looped: dict[str, Any] = {}
    looped["self"] = looped
    for data in ({"set": {1, 2}}, looped, {"lone": "\ud800"}):
        with pytest.raises(InvalidEvent):
            _encode(Draft("x", data))
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact_json.dumps({"bytes": b"x"})
