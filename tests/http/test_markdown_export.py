"""The Markdown export (docs/api.md §12) read by a Markdown viewer: each message shows what
the page shows. Layer: sessions/transfer (Markdown export). Over real HTTP against a real
server; the file is rendered by markdown-it-py (the project's own Markdown library), as
CommonMark with raw HTML allowed, as a viewer would render it."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from markdown_it import MarkdownIt

from helpers import ServerProcess

AT = 1_700_000_000.0
# A viewer: CommonMark with raw HTML live, plus the GitHub tables and strikethrough.
VIEWER = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def exported(server: ServerProcess, turns: list[tuple[str, str]]) -> str:
    """The Markdown export of a session holding `turns` (user message, answer), imported."""
    events: list[tuple[str, dict[str, Any], str | None]] = [
        ("session.created", {"title": "export"}, None)
    ]
    for n, (said, answer) in enumerate(turns, start=1):
        turn, stream = f"u_{n}", f"r_{n}"
        submitted = {"turn_id": turn, "stream_id": stream, "text": said, "attachments": []}
        events.append(("turn.submitted", {**submitted, "submitted_at": AT + n}, stream))
        delta = {"stream_id": stream, "item_id": "t1", "text": answer}
        events.append(("text.delta", delta, stream))
        done = {"stream_id": stream, "turn_id": turn, "state": "completed"}
        events.append(("run.finished", done, stream))
    doc = {
        "format": "tether.session",
        "version": 1,
        "events": [
            {"seq": seq, "type": type_, "at": AT + seq, "data": data}
            | ({"stream_id": stream, "turn_id": data.get("turn_id")} if stream else {})
            for seq, (type_, data, stream) in enumerate(events, start=1)
        ],
    }
    with server.client() as client:
        response = client.post("/api/sessions/import", content=json.dumps(doc).encode())
        assert response.status_code == 201, response.text
        sid = response.json()["sessions"][0]["session_id"]
        return client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"}).text


def sections(markdown: str) -> list[str]:
    """Each message's Markdown: what is under its `## User` / `## Assistant` heading."""
    return [part.partition("\n")[2] for part in re.split(r"^## ", markdown, flags=re.M)[1:]]


class _Shown(HTMLParser):
    """The text a browser shows of rendered HTML (a `<br>` is a line break), and the tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text, self.tags = "", set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.add(tag)
        if tag == "br":
            self.text += "\n"

    def handle_data(self, data: str) -> None:
        self.text += data


def shown(markdown: str) -> tuple[list[str], set[str]]:
    """(the lines a viewer shows, the tags it builds): a no-break space shows as a space."""
    parser = _Shown()
    parser.feed(VIEWER.render(markdown).replace("<br />\n", "<br />"))  # one break each
    return parser.text.removesuffix("\n").replace("\u00a0", " ").split("\n"), parser.tags


def page_lines(text: str) -> list[str]:
    """The lines the page shows of a user message (`.user-text` is `white-space: pre-wrap`
    text): each line break starts a line, but a last one starts none (Chromium draws no
    line after a final line feed)."""
    lines = re.split(r"\r\n|\r|\n", text)
    return lines[:-1] if len(lines) > 1 and lines[-1] == "" else lines


USER_TEXTS = [
    "*not emphasis* and _not either_ and **nor this**",
    "# not a heading",
    "1. not a list\n2) nor this",
    "> not a quote",
    "- not a list\n+ nor this\n* nor this",
    "<b>not bold</b> <img src=x onerror=alert(1)> <!-- not a comment -->",
    "several   spaces  here",
    "  indented by two\n    indented by four\n\tand a tab",
    "line one\nline two\r\nline three",
    "a paragraph\n\nand another\n\n\nafter two blank lines",
    "\nstarts with a line break",
    "ends with blank lines\n\n",
    "ends with one line break\n",
    "trailing spaces   \nand a backslash at the end\\",
    "`not code` and ``` not a fence\n```\nstill not",
    "~~~\n~~not struck~~",
    "a setext underline?\n===\nor this\n---",
    "***",
    "[not a link](https://example.org) ![nor an image](x.png) <https://example.org>",
    "[ref]: https://example.org\n[ref]",
    "&amp; &lt;b&gt; &#42; \\* \\\\",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "snake_case_name and 2*3*4",
]


def test_a_user_message_shows_in_a_viewer_exactly_as_the_page_shows_it(
    shared_server: ServerProcess,
) -> None:
    """The page shows a user's message as plain text (whitespace kept); the export wrote it
    as Markdown, so a viewer showed emphasis, headings, lists, quotes, live HTML and
    collapsed spaces and line breaks the user never typed. Each now renders to one
    paragraph of exactly the page's lines, characters and line breaks, and no other markup."""
    markdown = exported(shared_server, [(text, "ok") for text in USER_TEXTS])
    users = sections(markdown)[::2]
    assert len(users) == len(USER_TEXTS), markdown
    for text, section in zip(USER_TEXTS, users, strict=True):
        lines, tags = shown(section)
        assert tags <= {"p", "br"}, (text, section, tags)
        want = page_lines(text)
        assert len(lines) == len(want), (text, section, lines)
        for got, line in zip(lines, want, strict=True):
            assert got == line or not (line or got.strip()), (text, section, lines)  # empty


def test_an_answer_stays_markdown_as_the_page_renders_it(shared_server: ServerProcess) -> None:
    answer = "*emphasis*, a list:\n\n- one\n- two\n\n```python\nprint('<b>')\n```"
    markdown = exported(shared_server, [("*not emphasis*", answer)])
    user, assistant = sections(markdown)
    assert shown(user)[1] == {"p"}
    html = VIEWER.render(assistant)
    assert "<em>emphasis</em>" in html and "<li>one</li>" in html
    assert "print('&lt;b&gt;')" in html  # a fence is code, kept as it is


def test_an_answer_with_an_unclosed_code_fence_stays_under_its_own_heading(
    shared_server: ServerProcess,
) -> None:
    """Each message of the Markdown export is under its own heading: a fence an answer opens
    and never closes (an answer stopped mid-code) is closed at its end, so it does not
    swallow the headings and messages after it. A user's message opens no fence at all."""
    cut = "see:\n````python\nprint(1)\n```\nstill code"
    markdown = exported(shared_server, [(cut, cut), ("~~~", "~~~\nand a tilde fence")])
    tokens = VIEWER.parse(markdown)
    headings = [t for t in tokens if t.type == "heading_open" and t.tag == "h2"]
    assert len(headings) == 4, markdown
    fences = [t.content for t in tokens if t.type == "fence"]
    assert fences == ["print(1)\n```\nstill code\n", "and a tilde fence\n"], markdown


def test_a_message_opening_an_html_block_does_not_hide_the_rest_of_the_markdown(
    shared_server: ServerProcess,
) -> None:
    """A line that opens one of the HTML blocks that end only at their own end marker
    (`<!--`, `<script`, `<pre`, ...) is text, as the page shows it: in the export it would
    otherwise hide every heading and message after it."""
    opening = "<!-- a note\n<script>alert(1)"
    markdown = exported(shared_server, [(opening, opening), ("still here", "and here")])
    tokens = VIEWER.parse(markdown)
    assert len([t for t in tokens if t.type == "heading_open" and t.tag == "h2"]) == 4
    assert not [t for t in tokens if t.type == "html_block"], markdown
    shown_texts = [t.content for t in tokens if t.type == "inline"]
    assert "still here" in shown_texts and "and here" in shown_texts


LIST_HTML = [
    "- item\n\n    <img src=x onerror=alert(1)>",
    "* item\n\n      <b>bold</b> and <img src=x onerror=alert(1)>",
    "- a\n  - nested\n\n        <img src=x onerror=alert(1)>",
    "- a\n\n  - nested\n\n    <img src=x onerror=alert(1)>",
    "1. item\n\n    <img src=x onerror=alert(1)>",
    "10) item\n\n     <img src=x onerror=alert(1)>",
    "> - item\n>\n>     <img src=x onerror=alert(1)>",
    "- > quoted\n\n    <img src=x onerror=alert(1)>",
    "- item\nlazy line\n\n    <img src=x onerror=alert(1)>",
    "- item\n\n    para\n\n    <img src=x onerror=alert(1)>",
]


@pytest.mark.parametrize("answer", LIST_HTML, ids=range(len(LIST_HTML)))
def test_html_indented_in_a_list_item_is_text_in_a_viewer(
    shared_server: ServerProcess, answer: str
) -> None:
    """A line indented four spaces after a blank line is an indented code block at the top
    level, but inside a list item (of a list, a nested list, an ordered list, a list in a
    block quote) it is a paragraph of the item, where raw HTML is live markup. The export
    kept it raw, taking it for code; no raw HTML of a message survives now."""
    markdown = exported(shared_server, [("q", answer)])
    tokens = VIEWER.parse(markdown)
    inline = [child for t in tokens if t.type == "inline" for child in t.children or []]
    assert not [t for t in tokens if t.type == "html_block"], markdown
    assert not [t for t in inline if t.type == "html_inline"], markdown
    assert "<img" not in VIEWER.render(markdown), markdown


CODE = [
    ("text\n\n    <b>code</b>\n    <img src=x>", "<b>code</b>\n<img src=x>\n"),
    ("- a list\n\nthat ended\n\n    <b>code</b>", "<b>code</b>\n"),
    ("> a quote\n\n    <b>code</b>", "<b>code</b>\n"),
]


@pytest.mark.parametrize(("answer", "code"), CODE, ids=range(len(CODE)))
def test_an_indented_code_block_outside_a_list_stays_verbatim(
    shared_server: ServerProcess, answer: str, code: str
) -> None:
    markdown = exported(shared_server, [("q", answer)])
    blocks = [t.content for t in VIEWER.parse(markdown) if t.type == "code_block"]
    assert blocks == [code], markdown
