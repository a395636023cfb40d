"""Whether a Markdown viewer finds raw HTML in a text: the Markdown export's check
(docs/api.md §12) that its escaping left none live.

The export escapes HTML outside code spans, pairing backticks across a paragraph's lines;
which lines CommonMark reads as one block (a heading, a list item, a table cell, a quote
ends a paragraph where a blank line does not) is the parser's to say, so markdown-it-py
says it here: CommonMark with raw HTML on, as viewers render it before sanitizing, and again
with GitHub's tables when the text holds one (a table's cells pair backticks apart; without
a table, the two parse alike).

markdown-it-py stops parsing what nests deeper than its `maxNesting` (it skips the rest of
a container, or stops matching a link's brackets), where another viewer goes on and may
find HTML. So a text that comes within reach of that depth is not vouched for: `live`
answers True, and the export escapes it the safe way.

Nor is a text where GitHub's autolinks may take a backtick or a bracket that CommonMark
reads as markup (`_bare_link`): GitHub's parse of the rest of its paragraph is then not
markdown-it-py's. Nor a code span holding a tag after a backtick run that paired with
nothing, where cmark misses closers (`_code_span`).

Pure Python, milliseconds per KB (docs/security.md, "Markdown export"): it runs in the
render worker process, never on the event loop.
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline, backtick

_NESTING = 20  # the "commonmark" preset's: deeper, markdown-it-py's time per KB grows fast
# The deepest level a text may reach and still be vouched for: a list opens two levels at
# once (the list, its item), and a level this deep is seen before the one that is cut.
_VOUCHED_DEPTH = _NESTING - 4


class _Unvouched(Exception):
    """The text is where markdown-it-py's parse may not be a viewer's."""


def _block_depth(state: StateBlock, _start: int, _end: int, _silent: bool) -> bool:
    if state.level >= _VOUCHED_DEPTH:
        raise _Unvouched
    return False  # matches nothing: the other rules parse as they would


def _inline_depth(state: StateInline, _silent: bool) -> bool:
    if state.level >= _VOUCHED_DEPTH:  # nested link brackets and images count here too
        raise _Unvouched
    return False


# GitHub's autolinks (cmark-gfm's extension): a link starts at a bare `http://`, `https://`,
# `ftp://` or `www.` and runs over every character up to an ASCII space or a `<`. Found here
# wherever such a start is, even where cmark-gfm starts none (in code, in brackets, after a
# letter): that only leaves more text unvouched.
_BARE_LINK = re.compile(r"(?:(?:https?|ftp)://|www\.)[^ \t\n\r<]*", re.IGNORECASE)


def _bare_link(state: StateInline, _silent: bool) -> bool:
    """A backtick run, a `[` or a `![` that CommonMark reads as markup (it comes to it
    outside code) inside a bare link's run: GitHub's autolink takes it as text, so its code
    spans and links after it, and the HTML they hold, are not markdown-it-py's. The first
    one a link takes is one CommonMark comes to, since what a link runs over opens no code
    span, HTML or autolink before it (a `<` ends the link)."""
    src, pos = state.src, state.pos
    if src[pos] == "`" or src[pos] == "[" or src.startswith("![", pos):
        links = state.env.setdefault("bare links", {})  # each inline text's, found once
        if src not in links:
            links[src] = [m.span() for m in _BARE_LINK.finditer(src)]
        spans = links[src]
        at = bisect.bisect_right(spans, pos, key=lambda span: span[0]) - 1
        if at >= 0 and pos < spans[at][1]:
            raise _Unvouched
    return False


_TAG = re.compile(r"<[A-Za-z/!?]")


def _code_span(state: StateInline, silent: bool) -> bool:
    """CommonMark's code span, unless it holds a tag after a backtick run of its text that
    paired with nothing. Once a run finds no closer, cmark (GitHub's parser) takes where it
    last saw a run of each length for where the next one is, and a later closer it passed
    while pairing an earlier span is missed: in `` `` `a` `<b>` `` the second span is
    text to it and the `<b>` live."""
    start = state.pos
    matched = backtick(state, silent)
    if matched:
        unpaired = state.env.setdefault("unpaired runs", {})  # each inline text's first
        if not state.src[start : state.pos].strip("`"):  # the run alone: no closer
            unpaired[state.src] = min(start, unpaired.get(state.src, start))
        elif start > unpaired.get(state.src, start) and _TAG.search(state.src, start, state.pos):
            raise _Unvouched
    return matched


def _viewer(tables: bool) -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": True, "maxNesting": _NESTING})
    if tables:
        md.enable("table")
    md.block.ruler.before("table", "depth", _block_depth)  # the first rule, tried first
    md.inline.ruler.before("text", "depth", _inline_depth)
    md.inline.ruler.before("backticks", "bare link", _bare_link)  # where text stops
    md.inline.ruler.at("backticks", _code_span)
    return md


_PLAIN = _viewer(tables=False)
_TABLES = _viewer(tables=True)


def _has(tokens: list[Any], types: frozenset[str]) -> bool:
    stack = list(tokens)
    while stack:
        token = stack.pop()
        if token.type in types:
            return True
        stack += token.children or []
    return False


_HTML = frozenset({"html_block", "html_inline"})


def live(markdown: str) -> bool:
    """True if a viewer may find raw HTML in `markdown` (with or without tables)."""
    try:
        tokens = _TABLES.parse(markdown)
        if _has(tokens, _HTML):
            return True
        return _has(tokens, frozenset({"table_open"})) and _has(_PLAIN.parse(markdown), _HTML)
    except _Unvouched:
        return True
