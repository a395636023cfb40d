"""Layer: search results (sessions/search.py `plain_snippet`, docs/api.md §13). Invariant: an
answer's snippet loses Markdown's syntax, never a matched word: whatever the text around
them, the matched parts come out as they went in, in order, and the text between them
never gains a character it did not have."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tether.sessions.search import plain_snippet

SYNTAX = st.sampled_from(
    [
        "*",
        "**",
        "_",
        "__",
        "`",
        "```py",
        "~~",
        "#",
        "## ",
        "> ",
        "- ",
        "1. ",
        "|",
        "---",
        "[",
        "]",
        "(",
        ")",
        "](http://a.example/",
        '"t"',
        "!",
        "\n",
        " ",
        "\t",
    ]
)
# A match is a word as the index reads it: `_` is punctuation there, so it is never in one.
WORDS = st.text(alphabet="abcXYZ019é", min_size=1, max_size=6)
PLAIN = st.lists(st.one_of(SYNTAX, WORDS, st.just("snake_case")), max_size=12).map("".join)


@given(st.lists(st.tuples(PLAIN, WORDS), max_size=6), PLAIN)
def test_matched_words_survive_in_order_and_nothing_is_added(
    pieces: list[tuple[str, str]], tail: str
) -> None:
    parts: list[tuple[str, bool]] = []
    for before, word in pieces:
        if before:
            parts.append((before, False))
        parts.append((word, True))
    if tail:
        parts.append((tail, False))
    cleaned = plain_snippet(tuple(parts))
    assert [t for t, m in cleaned if m] == [t for t, m in parts if m]
    source = "".join(t for t, _ in parts)
    for text, match in cleaned:
        if not match:
            assert set(text) <= set(source) | {" "}, (parts, cleaned)


def test_a_link_keeps_its_text_and_an_address_holding_the_match_stays_whole() -> None:
    assert plain_snippet((('see [the docs](https://x.example/a "t") now', False),)) == (
        ("see the docs now", False),
    )
    kept = plain_snippet((("[here](https://", False), ("numbat", True), (".example)", False)))
    assert kept == (("[here](https://", False), ("numbat", True), (".example)", False))
