"""The Markdown export (docs/api.md §12) read by GitHub's renderer: cmark-gfm with its
autolink, table and strikethrough extensions and raw HTML on, as it renders before any
sanitizer. Layer: sessions/transfer (Markdown export). Over real HTTP against a real server.

GitHub's autolinks (a bare `http://`, `https://`, `ftp://` or `www.` link, up to a space or
a `<`) take the characters they run over as they are, escapes and backticks too, so the
file must hold no HTML from a message even where one of them swallows what precedes a `<`.
"""

from __future__ import annotations

import random
import time
from html.parser import HTMLParser

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options

from helpers import ServerProcess
from markdown_kit import exported, live_html, sections

IMG = "<img src=x onerror=alert(1)>"


def gfm(markdown: str) -> str:
    """The HTML GitHub's renderer builds of `markdown`, before its sanitizer."""
    return cmarkgfm.markdown_to_html_with_extensions(
        markdown,
        options=Options.CMARK_OPT_UNSAFE,
        extensions=["autolink", "table", "strikethrough"],
    )


# What Markdown itself builds (CommonMark, tables, strikethrough, task lists).
MARKDOWN_TAGS = frozenset(
    {"p", "br", "a", "em", "strong", "del", "code", "pre", "blockquote", "hr", "img", "input"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li"}
    | {"table", "thead", "tbody", "tr", "th", "td"}
)


class _Foreign(HTMLParser):
    """The elements of rendered HTML that Markdown does not build: an unknown tag, an
    attribute `on...`, a link without a target."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if (
            tag not in MARKDOWN_TAGS
            or any(name.startswith("on") for name in names)
            or (tag == "a" and "href" not in names)
        ):
            self.found.append(self.get_starttag_text() or tag)


def foreign_html(markdown: str) -> list[str]:
    parser = _Foreign()
    parser.feed(gfm(markdown))
    return parser.found


URLS = ["http://a", "https://example.org/a_b", "www.example.org", "ftp://a.b", "HTTP://A"]


@pytest.mark.parametrize("url", URLS)
def test_an_autolink_swallows_no_escape_into_live_html(
    shared_server: ServerProcess, url: str
) -> None:
    """GitHub's autolink ran over the backslash that escaped a `<` (`http://a\\<img ...>`:
    the link ended at the `<`, which started a live tag) in an answer, in the answer's
    escape-everything form, in a user's message, and in the title, the model and a notice.
    Each `<` is written `&lt;` now, which no autolink turns back into HTML (inside one it
    shows as `&lt;`), and CommonMark viewers still show `<`."""
    text = f"see {url}{IMG} and {url}\\{IMG} and {url}\\\\{IMG}"
    unsure = f"# `\n{text}`"  # backticks across blocks: escaped the safe way
    markdown = exported(
        shared_server, [(text, text), (text, unsure)], title=text, model=text, reason=text
    )
    assert not foreign_html(markdown), markdown
    assert not live_html(markdown), markdown
    assert "\\<" not in markdown, markdown  # no `\<` left for a link to swallow


SWALLOWED_TICK = {
    "url": f"see http://a`x {IMG}`",
    "www": f"see www.a.b`x {IMG}`",
    "after a code span": f"`x`https://a`y {IMG}`",
    "unpaired run before": f"``http://a`b {IMG}`",
    "in a quote": f"> see http://a`x {IMG}`",
    "in a table cell": f"| a |\n|-|\n| http://a`x {IMG}` |",
}


@pytest.mark.parametrize("answer", SWALLOWED_TICK.values(), ids=SWALLOWED_TICK.keys())
def test_a_backtick_an_autolink_swallows_opens_no_code_span_that_hides_html(
    shared_server: ServerProcess, answer: str
) -> None:
    """CommonMark reads `` http://a`x <img>` `` as text and a code span, so the export kept
    the `<img>` in it as code; GitHub's autolink runs over the backtick
    (`http://a`x`), and the `<img>` after it was live. An answer where a backtick could be
    part of such a link is escaped the safe way now."""
    markdown = exported(shared_server, [("q", answer)])
    assert not foreign_html(markdown), markdown
    assert not live_html(markdown), markdown
    assert "&lt;img" in sections(markdown)[1], markdown


def test_code_spans_around_a_url_keep_their_html_as_code(shared_server: ServerProcess) -> None:
    """A URL in a code span is no autolink anywhere: the code spans keep their `<`."""
    answer = "Open `http://localhost:8000/` and `www.a.b`, then add `<div>` to `Vec<T>`."
    markdown = exported(shared_server, [("q", answer)])
    assert sections(markdown)[1].strip() == answer, markdown
    assert "<code>&lt;div&gt;</code>" in gfm(markdown)


def test_code_spans_after_an_unpaired_backtick_are_not_trusted_with_html(
    shared_server: ServerProcess,
) -> None:
    """cmark (GitHub's parser) remembers where it last saw a run of backticks once a run
    found no closer, and then misses closers CommonMark pairs: in `` `` `a` `<img>` `` the
    second code span is text to it, and the `<img>` was live. After a run that pairs with
    nothing, a code span holding a `<` is not trusted: it is escaped the safe way."""
    answer = f"`` `a` `{IMG}`"
    markdown = exported(shared_server, [("q", answer)])
    assert not foreign_html(markdown), markdown
    assert sections(markdown)[1].strip() == f"`` `a` `&lt;{IMG[1:]}`", markdown


# Backticks, `<`, escapes, brackets, line breaks, what opens a block (`#`, `-`, `>`, `*`,
# `1.`, a table's `|`), the links GitHub makes of bare text and the start of a tag.
_ALPHABET = [
    *"````<>\\[]\n\n\n  -#*1.a>|",
    *["<img src=x onerror=", "1>", "a>", "<b>", "# ", "- ", "> "],
    *["http://a", "www.a.b", "a@b.c", " http://a", " www.a.b"],
]


def test_random_messages_export_no_html_live_in_githubs_renderer(
    shared_server: ServerProcess,
) -> None:
    """Property, over seeded random user messages and answers drawn from URLs, backticks,
    escapes, brackets, `<`, line breaks and block markers, in rounds for about four seconds:
    neither GitHub's renderer (autolinks on) nor a CommonMark viewer finds HTML from a
    message in the file."""
    deadline = time.monotonic() + 4.0
    rounds = 0
    while rounds < 10 and (rounds < 2 or time.monotonic() < deadline):
        rng = random.Random(rounds)
        texts = [
            "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 30))) for _ in range(400)
        ]
        texts = [t for t in texts if t.strip()]
        turns = list(zip(texts[::2], texts[1::2], strict=False))
        markdown = exported(shared_server, turns)
        assert not foreign_html(markdown), (rounds, foreign_html(markdown), markdown)
        assert not live_html(markdown), (rounds, markdown)
        rounds += 1


LAZY_TAG = {
    "quote": f"> a `x\n{IMG}\n> y`",
    "quote, indented": f"> a `x\n   {IMG}\n> y`",
    "item's quote": f"- > a `x\n{IMG}\n  > y`",
}


@pytest.mark.parametrize("answer", LAZY_TAG.values(), ids=LAZY_TAG.keys())
def test_a_tag_alone_on_a_quote_s_lazy_line_is_not_kept_as_code(
    shared_server: ServerProcess, answer: str
) -> None:
    """A line without the quote's `>` after a quoted paragraph continues the paragraph
    (a lazy line) in CommonMark even when it is a lone tag, so markdown-it-py put the
    `<img>` in the code span across the lines; cmark starts an HTML block there, and the tag
    was live. A `<` that starts a line is escaped, in a code span too."""
    markdown = exported(shared_server, [("q", answer)])
    assert not foreign_html(markdown), markdown
    assert not live_html(markdown), markdown
