"""What a word is to search (docs/api.md §13), the same for the query and for both backends'
indexes: a run of letters, digits, private-use characters and combining marks (SQLite's
tokenizer categories of migration m007, `L* N* Co M*`); everything else, `_` included,
separates words. sessions/search.py reads the query's words with it; log/pg_search.py
indexes the words of each row with it, because PostgreSQL's own parser reads `config.yaml`,
a URL, an e-mail address or a path as one token and leaves HTML tags out."""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable
from functools import cache


def in_word(char: str) -> bool:
    """Whether `char` is part of a word (letter, digit, private use or combining mark): a word
    is never split differently in the query than in the index."""
    category = unicodedata.category(char)
    return category[0] in "LNM" or category == "Co"


def _char_class(inside: Callable[[str], bool]) -> str:
    ranges: list[tuple[int, int]] = []
    for code in range(sys.maxunicode + 1):
        if inside(chr(code)):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
        for a, b in ranges
    )


@cache
def _word_run() -> re.Pattern[str]:
    """A word: a run of word characters with a letter or a digit in it (marks before it
    included), matched by the regex engine rather than one Python call per character (the
    log writer reads the words of every row it indexes, a search those of every row it
    shows). `[^\\W_]` is a letter or a digit (`str.isalnum`: categories L* and N*); the marks
    and private-use characters are classes built once, in a few tenths of a second."""
    marks = _char_class(lambda c: unicodedata.category(c)[0] == "M")
    private = _char_class(lambda c: unicodedata.category(c) == "Co")
    return re.compile(f"[{marks}]*(?:[^\\W_]|[{private}])(?:[^\\W_]|[{marks}{private}])*")


def word_spans(text: str) -> list[tuple[int, int]]:
    """Where each word of `text` starts and ends (a mark alone is no word)."""
    return [run.span() for run in _word_run().finditer(text)]


def words(text: str) -> list[str]:
    """The words of `text`, in order."""
    return [text[start:end] for start, end in word_spans(text)]
