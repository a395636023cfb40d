"""Each event type is defined once (`tether/events.py`: name, payload fields, durable or not),
and what writes, folds, documents or lists event types is held to those definitions here:
the normaliser writes only payloads that match, the folds handle only defined types (and the
sidebar feed's filter misses none that changes a row), docs/api.md's event table names each
type's fields exactly, and the event streams send only defined frames. The page's list is
served from the definitions (`tests/http/test_event_vocabulary.py`, and the browser test
`test_the_page_listens_to_every_durable_event_type`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from event_samples import every_type_in_a_running_turn, sample

from tether import events as ev
from tether.events import VOCABULARY, Event, EventType, PayloadMismatch
from tether.ingest.normalizer import Normalizer, SteerDelivered
from tether.projections import transcript
from tether.projections.sidebar import ROW_EVENT_TYPES, fold_row
from tether.runtimes.base import (
    AnswerFinished,
    ApprovalRequested,
    ApprovalResolved,
    ClarifyRequested,
    ClarifyResolved,
    CompressionCompleted,
    CompressionStarted,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCompleted,
    ToolStarted,
    Usage,
)

ROOT = Path(__file__).parents[1]
DURABLE = VOCABULARY.durable_names()
TRANSIENT = [t.name for t in VOCABULARY if not t.durable]


def test_every_definition_accepts_its_own_samples_and_refuses_what_it_does_not_define() -> None:
    for event_type in VOCABULARY:
        for full in (False, True):
            event_type.check(sample(event_type.payload, full=full))
        base = sample(event_type.payload, full=True)
        with pytest.raises(PayloadMismatch):
            event_type.check({**base, "undefined_field": 1})
        for name in event_type.required:
            with pytest.raises(PayloadMismatch):
                event_type.check({k: v for k, v in base.items() if k != name})
            wrong = 1 if isinstance(base[name], str) else "1"
            with pytest.raises(PayloadMismatch):
                event_type.check({**base, name: wrong})


def test_the_vocabulary_refuses_an_undefined_type_and_a_transient_one_in_the_log() -> None:
    with pytest.raises(PayloadMismatch, match="not a durable event type"):
        VOCABULARY.check("text.deltas", {"stream_id": "r", "item_id": "t1", "text": "x"})
    with pytest.raises(PayloadMismatch, match="not a durable event type"):
        VOCABULARY.check("heartbeat", {"server_time": 1.0})
    with pytest.raises(ValueError, match="defined twice"):
        VOCABULARY.extended(EventType("text.delta", ev.Delta))


def test_each_durable_type_has_its_constant() -> None:
    """The rest of the code names a type by its constant (`ev.TEXT_DELTA`), never by a string
    of its own."""
    constants = {v for k, v in vars(ev).items() if k.isupper() and isinstance(v, str)}
    assert set(DURABLE) <= constants
    assert len(DURABLE) == len(set(DURABLE)) >= 26


# -- the normaliser ----------------------------------------------------------------------------
def test_the_normaliser_writes_only_payloads_that_match_their_definitions() -> None:
    """Every runtime event kind, through the normaliser: each draft it makes matches."""
    n = Normalizer("r1", "u1")
    drafts = [n.started("demo", "demo-1")]
    for event in (
        ReasoningDelta("Thinking about it. All done."),
        TextDelta("All done."),  # an echo of the reasoning's tail: reasoning.trimmed
        ToolStarted("c1", "terminal", {"command": "ls"}),
        ToolCompleted("c1", "terminal", "a.txt", is_error=False, duration_ms=12),
        ToolCompleted("c2", "read_file", "no start: one is written first"),
        ApprovalRequested("a1", "rm -rf /tmp/x", "deletes files", ("once", "session", "deny")),
        ApprovalResolved("a1", "once", "user"),
        ClarifyRequested("q1", "Which one?", ("a", "b")),
        ClarifyResolved("q1", "a", "user"),
        ClarifyRequested("q2", "And now?"),
        SteerDelivered(["st_1"]),
        CompressionStarted("p1"),
        CompressionCompleted("p1", 900, 100, "the summary", "u1"),
        Usage(10, 5),
        AnswerFinished("length"),
        Finished("tool_limit_reached", "too many tools"),
        TextDelta("more"),
    ):
        drafts += n.feed(event)
    drafts += n.end_item() + n.open_questions_stopped()
    drafts.append(n.finish("error", error={"code": "internal", "message": "m"}, reason="r"))
    drafts.append(Normalizer("r2", "u2").finish("completed"))
    written = {d.type for d in drafts}
    assert written >= {ev.REASONING_TRIMMED, ev.CLARIFY_RESOLVED, ev.COMPRESSION_COMPLETED}
    for draft in drafts:
        VOCABULARY.check(draft.type, draft.data)


# -- the folds ---------------------------------------------------------------------------------
def _page_reducer_types() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "src/tether/web/js").glob("reducer*.js"):
        for listed in re.findall(r"^on\(\[([^\]]*)\]", path.read_text(), flags=re.M):
            found.update(re.findall(r'"([^"]+)"', listed))
    return found


def test_the_folds_handle_only_defined_types_and_each_durable_type_is_folded() -> None:
    server = set(transcript._HANDLERS)
    page = _page_reducer_types()
    assert len(server) > 20 and len(page) > 20
    assert server <= set(DURABLE), server - set(DURABLE)
    assert page <= set(DURABLE), page - set(DURABLE)
    assert set(ROW_EVENT_TYPES) <= set(DURABLE)
    # a definition no fold uses is dead (or its fold was forgotten)
    assert set(DURABLE) <= server | page | ROW_EVENT_TYPES


@pytest.mark.parametrize("name", sorted(set(DURABLE) - ROW_EVENT_TYPES))
def test_a_type_outside_the_sidebar_feeds_filter_never_changes_a_row(name: str) -> None:
    """The sidebar feed (`sessions/feed.py`) tells clients of a change only for
    `ROW_EVENT_TYPES`: every other defined type, with any of its fields, leaves the row as
    it was (only its `last_seq` moves)."""
    created = Event("s1", 1, ev.SESSION_CREATED, 1.0, {"title": "t"})
    before = fold_row(None, created)
    for full in (False, True):
        data = sample(VOCABULARY[name].payload, full=full)
        after = fold_row(before, Event("s1", 2, name, 2.0, data, "r1", "u1"))
        assert after == {**before, "last_seq": 2}, name


class Reads(dict):
    """A payload that notes which fields a fold asks for."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_the_server_folds_read_only_fields_their_types_define() -> None:
    """A fold asking for a field its type does not define reads nothing, silently (a typo,
    or a field renamed on one side only): each durable type, with every field, through the
    transcript fold (inside a running turn, where its handlers act) and the sidebar fold."""
    fold = transcript.TranscriptFold()
    row = None
    seen: dict[str, set[str]] = {}
    for seq, (name, data) in enumerate(every_type_in_a_running_turn(), 1):
        reads = Reads(data)
        event = Event("s1", seq, name, float(seq), reads, "r1", "u1")
        fold.apply(event)
        row = fold_row(row, event)
        seen.setdefault(name, set()).update(reads.read)
    assert len(seen) == len(DURABLE)
    for name, read in seen.items():
        event_type = VOCABULARY[name]
        assert read <= event_type.required | event_type.optional, (name, read)
    assert seen[ev.APPROVAL_REQUESTED] >= {"approval_id", "command", "choices"}  # it did act


# -- the docs and the streams -----------------------------------------------------------------
def _documented_fields(cell: str) -> list[str]:
    """The top-level names of the cell's first `{...}`, a trailing `?` kept (nested braces,
    such as `handoff {summary, ...}` in prose, are not fields of the event)."""
    start = cell.index("{")
    names, depth, current = [], 0, ""
    for char in cell[start:]:
        if char == "{":
            depth += 1
            if depth == 1:
                continue
        elif char == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and char == ",":
            names.append(current.strip())
            current = ""
        elif depth == 1:
            current += char
    names.append(current.strip())
    return [n.split()[0] for n in names if n]


def _event_table() -> dict[str, str]:
    rows, inside = {}, False
    for line in (ROOT / "docs/api.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            inside = False
        elif cells[0] == "type":
            inside = True
        elif inside and not set(cells[0]) <= {"-"}:
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_the_docs_event_table_names_each_types_fields_exactly() -> None:
    rows = _event_table()
    assert list(rows) == DURABLE  # every durable type, in definition order, nothing else
    for name in DURABLE:
        event_type = VOCABULARY[name]
        documented = _documented_fields(rows[name])
        expected = sorted(event_type.required) + sorted(f"{f}?" for f in event_type.optional)
        assert sorted(documented) == sorted(expected), (name, documented)


def test_the_documented_field_reader_reads_nested_braces_as_prose() -> None:
    cell = "`{title, handoff?}`: a child has `handoff {summary, tokens_before}`"
    assert _documented_fields(cell) == ["title", "handoff?"]


def test_every_transient_frame_is_documented_and_the_streams_send_only_defined_frames() -> None:
    text = (ROOT / "docs/api.md").read_text(encoding="utf-8")
    section = text[text.index("## 6.") : text.index("## 7.")]
    for name in TRANSIENT:
        assert f"`{name}`" in section, name
    streams = (ROOT / "src/tether/http/streams.py").read_text(encoding="utf-8")
    sent = set(re.findall(r'event="([^"]+)"', streams))
    assert sent == set(TRANSIENT)
