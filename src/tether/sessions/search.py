"""What the search index holds (docs/api.md §13): the settled text of each visible user and
assistant row, as a `SearchFold` the log backend runs in the transaction of every append.

A user row is indexed when its turn is submitted; an assistant row when its run finishes,
with the text of its text items (interim progress and answer; never reasoning or tool
output), read once from the stream's `text.delta` events rather than folded delta by delta.
Rows another client of the agent wrote (`agent.imported`) are indexed as the transcript
shows them. Nothing of any branch is lost from the index (docs/api.md §10, "Edit, regenerate
and branches"): a truncation (the base of edit, regenerate, retry and undo) hides rows
without removing them, and `branch.switched` shows rows already indexed, so neither changes
the index; a regenerate's `turn.submitted` adds no user row (its new answer is indexed at its
`run.finished`, like any answer). Whether a row is on the branch shown now is read from the
session's fold when a search is answered (sessions/service.py), never stored here. A row's
position is the sidebar fold's `message_count` before the event: its index in the transcript
of the branch it was written on.
"""

from __future__ import annotations

import re
from typing import Any

from tether import events as ev
from tether.errors import InvalidRequest
from tether.events import Event
from tether.log.search_words import words
from tether.log.store import (
    MATCH_CLOSE,
    MATCH_OPEN,
    SearchChange,
    SearchDoc,
    StreamEvents,
    snippet_parts,
)
from tether.projections.agent_rows import imported_rows

# Bump when what is indexed changes: the store then rebuilds the index from the log.
SEARCH_FOLD_VERSION = "search-2"  # 2: truncations hide rows (branches), never drop them

QUERY_MAX_CHARS = 500
MAX_TERMS = 16
LIMIT_DEFAULT = 20
LIMIT_MAX = 100

_TEXT_TYPES = frozenset({ev.TEXT_DELTA})
_NO_CHANGE = SearchChange()


def _assistant_text(stream_id: str, stream_events: StreamEvents) -> str:
    items: dict[str, list[str]] = {}
    for event in stream_events(stream_id, _TEXT_TYPES):
        items.setdefault(str(event.data.get("item_id")), []).append(event.data.get("text", ""))
    return "\n\n".join("".join(parts) for parts in items.values())


def search_change(
    state: dict[str, Any] | None, event: Event, stream_events: StreamEvents
) -> SearchChange:
    """The `SearchFold`: the rows `event` adds to the index (it never removes any; a deleted
    session's rows go with its log)."""
    position = state["message_count"] if state else 0
    data = event.data
    if event.type == ev.TURN_SUBMITTED:
        text = data.get("text") or ""
        if data.get("regenerate") or not text.strip():  # a regenerate writes no user row
            return _NO_CHANGE
        at = data.get("submitted_at", event.at)
        return SearchChange(add=(SearchDoc(data["turn_id"], "user", position, at, text),))
    if event.type == ev.RUN_FINISHED:
        stream_id = event.stream_id or data.get("stream_id")
        if not stream_id:
            return _NO_CHANGE
        text = _assistant_text(stream_id, stream_events)
        if not text.strip():
            return _NO_CHANGE
        return SearchChange(add=(SearchDoc(stream_id, "assistant", position, event.at, text),))
    if event.type == ev.AGENT_IMPORTED:
        docs = []
        for entry in data.get("entries") or []:
            if entry.get("kind") != "turn":
                continue
            for row in imported_rows(entry):
                if row["content"].strip():
                    at = row.get("finished_at") or row["created_at"]
                    docs.append(SearchDoc(row["id"], row["role"], position, at, row["content"]))
                position += 1
        return SearchChange(add=tuple(docs)) if docs else _NO_CHANGE
    return _NO_CHANGE


def search_terms(query: str) -> list[str]:
    """The words of what the user typed: punctuation and query syntax are not words, so
    nothing typed reaches a backend as syntax. Empty, too long or wordless: 400."""
    if len(query) > QUERY_MAX_CHARS:
        raise InvalidRequest(f"The search text is longer than {QUERY_MAX_CHARS} characters.")
    if not query.strip():
        raise InvalidRequest("Type something to search for.")
    terms = words(query)
    if not terms:
        raise InvalidRequest(
            "The search text has no words to look for: punctuation, symbols and emoji are not "
            "searched for."
        )
    if len(terms) > MAX_TERMS:
        raise InvalidRequest(f"The search text has more than {MAX_TERMS} words.")
    return terms


# Markdown's syntax in an answer's snippet. The transcript shows an answer rendered, so its
# snippet is the text read there (docs/api.md §13: plain text). Only the snippet (a few
# words) is cleaned, when a search is answered: rendering every answer for the index would
# cost the log writer a Markdown parse per run. A matched word is never dropped: the match
# markers are neither word nor space, and a link address holding one is kept whole.
_LINK = re.compile(rf"!?\[([^\]\n]*)\]\((?:[^)\s{MATCH_OPEN}{MATCH_CLOSE}]*)(?: \"[^\"\n]*\")?\)")
_LINE_MARK = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]+|>[ \t]?|[-*+][ \t]+|\d{1,9}[.)][ \t]+|`{3,}\S*|~{3,}\S*)",
    re.MULTILINE,
)
_TABLE_RULE = re.compile(r"^[ \t|:-]*-{3,}[ \t|:-]*$", re.MULTILINE)
_TABLE_PIPE = re.compile(r"^[ \t]*\||\|[ \t]*$|(?<= )\|(?= )", re.MULTILINE)
# A run of `*` or `_` that opens (after no word, before no space) or closes (after no
# space, before no word) emphasis: `2*3` and `snake_case` keep theirs. A match marker stands
# beside a matched word, so a closing marker counts as the word before it and an opening one
# as the word after it: `snake_case` keeps its `_` when `snake` or `case` is the match.
_EMPHASIS = re.compile(
    rf"(?<![\w*{MATCH_CLOSE}])\*+(?=[^\s*])|(?<=[^\s*])\*+(?![\w*{MATCH_OPEN}])"
    rf"|(?<![\w{MATCH_CLOSE}])_+(?=[^\s_])|(?<=[^\s_])_+(?![\w{MATCH_OPEN}])|~~|`+"
)
_SPACE = re.compile(r"\s+")


def plain_snippet(parts: tuple[tuple[str, bool], ...]) -> tuple[tuple[str, bool], ...]:
    """An answer's snippet parts as the rendered answer reads (a user row is shown as typed
    and keeps its own)."""
    marked = "".join(f"{MATCH_OPEN}{text}{MATCH_CLOSE}" if match else text for text, match in parts)
    marked = _LINK.sub(r"\1", marked)
    marked = _TABLE_RULE.sub("", marked)
    marked = _LINE_MARK.sub("", marked)
    marked = _TABLE_PIPE.sub("", marked)
    marked = _EMPHASIS.sub("", marked)
    return snippet_parts(_SPACE.sub(" ", marked).strip())
