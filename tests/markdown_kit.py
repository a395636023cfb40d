"""A session's Markdown export as the tests of tests/http/test_markdown_export*.py read it:
the file of an imported session (`exported`), each message's part of it (`sections`), a
session's one answer and its part (`exported_answer`), the raw HTML CommonMark viewers find
in it (`live_html`), the viewers that render it (`VIEWERS`), what a browser shows of their
HTML (`shown_text`), its top-level blocks (`top_blocks`) and code blocks (`code_blocks`),
and the blocks the page shows of an answer's timeline (`as_the_page_shows`)."""

from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser
from typing import Any

import cmarkgfm
import httpx
from cmarkgfm.cmark import Options
from markdown_it import MarkdownIt

from helpers import ServerProcess, session_body

AT = 1_700_000_000.0
FILE = {"id": "a_1", "mime": "text/plain", "size": 2}


def exported(
    server: ServerProcess,
    turns: list[tuple[str, str]],
    *,
    title: str = "export",
    model: str | None = None,
    reason: str | None = None,
    attachment: str | None = None,
) -> str:
    """The Markdown export of a session titled `title` holding `turns` (user message,
    answer), imported: each run by `model` when given, stopped with `reason` (a notice
    under the answer) when given, and the first user message with a file named
    `attachment` (two bytes) when given."""
    events: list[tuple[str, dict[str, Any], str | None]] = [
        ("session.created", {"title": title}, None)
    ]
    for n, (said, answer) in enumerate(turns, start=1):
        turn, stream = f"u_{n}", f"r_{n}"
        files = [] if attachment is None or n > 1 else [{**FILE, "name": attachment}]
        submitted = {"turn_id": turn, "stream_id": stream, "text": said, "attachments": files}
        events.append(("turn.submitted", {**submitted, "submitted_at": AT + n}, stream))
        if model is not None:
            started = {"stream_id": stream, "turn_id": turn, "runtime": "demo", "model": model}
            events.append(("run.started", started, stream))
        delta = {"stream_id": stream, "item_id": "t1", "text": answer}
        events.append(("text.delta", delta, stream))
        done = {"stream_id": stream, "turn_id": turn, "state": "completed"}
        if reason is not None:
            done |= {"state": "cancelled", "reason": reason}
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
    if attachment is not None:
        doc["attachments"] = [{**FILE, "name": attachment, "data_base64": "aGk="}]  # "hi"
    with server.client() as client:
        response = client.post("/api/sessions/import", content=json.dumps(doc).encode())
        assert response.status_code == 201, response.text
        sid = response.json()["sessions"][0]["session_id"]
        return client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"}).text


def sections(markdown: str) -> list[str]:
    """Each message's Markdown: what is under its `## User` / `## Assistant` heading."""
    return [part.partition("\n")[2] for part in re.split(r"^## ", markdown, flags=re.M)[1:]]


# Viewers that nest as deep as a text does (the "commonmark" preset stops at 20 levels and
# parses no further, where cmark goes on), with and without GitHub's tables.
DEEP = MarkdownIt("commonmark", {"html": True, "maxNesting": 1000})
DEEP_TABLES = MarkdownIt("commonmark", {"html": True, "maxNesting": 1000}).enable(
    ["table", "strikethrough"]
)


def live_html(markdown: str) -> list[str]:
    """The raw HTML a viewer builds of `markdown` (blocks, inline tags, in images' text
    too), with or without tables."""
    found = []
    for viewer in (DEEP, DEEP_TABLES):
        stack = list(viewer.parse(markdown))
        while stack:
            token = stack.pop()
            if token.type in ("html_block", "html_inline"):
                found.append(token.content)
            stack += token.children or []
    return found


# CommonMark viewers (markdown-it-py, cmark) and GitHub's renderer (cmark-gfm with autolinks,
# tables and strikethrough), each as Markdown to HTML with raw HTML on.
VIEWERS = {
    "markdown-it-py": MarkdownIt("commonmark", {"html": True})
    .enable(["table", "strikethrough"])
    .render,
    "cmark": lambda markdown: cmarkgfm.markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE),
    "cmark-gfm": lambda markdown: cmarkgfm.markdown_to_html_with_extensions(
        markdown,
        options=Options.CMARK_OPT_UNSAFE,
        extensions=["autolink", "table", "strikethrough"],
    ),
}


class _Shown(HTMLParser):
    """The text a browser shows of rendered HTML (a `<br>` is a line break), and its tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text, self.tags = "", set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.add(tag)
        if tag == "br":
            self.text += "\n"

    def handle_data(self, data: str) -> None:
        self.text += data


def shown_text(html: str) -> tuple[str, set[str]]:
    """(the text a browser shows of `html`, the tags it builds): one line break per `<br>`,
    a no-break space shown as a space."""
    parser = _Shown()
    parser.feed(html.replace("<br />\n", "<br />"))
    return parser.text.replace("\u00a0", " "), parser.tags


def exported_answer(client: httpx.Client, sid: str) -> tuple[dict[str, Any], str]:
    """(the session's one answer row, the Markdown of that answer in the session's export)."""
    rows = session_body(client, sid)["messages"]
    assert [row["role"] for row in rows] == ["user", "assistant"], rows
    response = client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"})
    assert response.status_code == 200, response.text
    return rows[1], sections(response.text)[1]


class _TopBlocks(HTMLParser):
    """The top-level blocks of rendered HTML: each its tag, its text and, for a list, the
    text of each of its items."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str, list[str]]] = []
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("br", "hr", "img"):
            if self.depth == 0:
                self.found.append((tag, "", []))
            return
        if self.depth == 0:
            self.found.append((tag, "", []))
        elif tag == "li" and self.depth == 1:
            self.found[-1][2].append("")
        self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("br", "hr", "img"):
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth > 0:
            tag, shown, items = self.found[-1]
            self.found[-1] = (tag, shown + data, items)
            if items:
                items[-1] += data


def top_blocks(html: str) -> list[tuple[str, str, list[str]]]:
    """The top-level blocks of `html`, their text's whitespace runs one space."""
    parser = _TopBlocks()
    parser.feed(html)
    return [(tag, _words(shown), [_words(i) for i in items]) for tag, shown, items in parser.found]


def _words(text: str) -> str:
    return " ".join(text.split())


# What the page says of an approval's answer and of a question's (js/timeline_view.js), once
# its run has settled.
ALLOWED = {
    "once": "Allowed once.",
    "session": "Allowed for this session.",
    "always": "Always allowed.",
}
DENIED = {
    "user": "Denied.",
    "timeout": "Denied: nobody answered in time.",
    "stopped": "Denied: the run ended before an answer.",
}
UNANSWERED = {
    "timeout": "Nobody answered in time; the agent decides on its own.",
    "stopped": "The run ended before an answer.",
}


def _approval_outcome(item: dict[str, Any]) -> str:
    if item["choice"] == "deny":
        return DENIED.get(item["reason"], "Denied.")
    return ALLOWED.get(item["choice"], "Not answered.")


def _clarify_outcome(item: dict[str, Any]) -> str:
    if item["reason"] == "user":
        return f"You answered: {item['text']}"
    return UNANSWERED.get(item["reason"], "Not answered.")


def as_the_page_shows(row: dict[str, Any], render: Any) -> list[tuple[str, str, list[str]]]:
    """The blocks the page shows of an answer's timeline, in its order and its words
    (js/blocks.js, js/timeline_view.js): each text rendered on its own, a tool call by its
    name, a notice by its text, a steer with its label, an approval prompt's question,
    command and answer, a clarify question, the choices it offered and its answer.
    Reasoning, folded away on the page, is not in the export."""
    blocks: list[tuple[str, str, list[str]]] = []
    for item in row["timeline"]:
        if item["type"] == "text":
            blocks += top_blocks(render(item["text"]))
        elif item["type"] == "tool":
            blocks.append(("p", f"Tool call: {item['name']}", []))
        elif item["type"] == "notice":
            blocks.append(("blockquote", _words(item["text"]), []))
        elif item["type"] == "steer":
            label = "Not delivered (back in the composer):" if item["leftover"] else "You steered:"
            blocks.append(("p", _words(f"{label} {item['text']}"), []))
        elif item["type"] == "approval":
            blocks += [
                ("p", _words(f"The agent asks to run this: {item['description']}"), []),
                ("pre", _words(item["command"]), []),
                ("p", _approval_outcome(item), []),
            ]
        elif item["type"] == "clarify":
            blocks.append(("p", _words(f"The agent asks: {item['question']}"), []))
            if item["choices"]:
                blocks.append(("p", _words("Choices: " + " · ".join(item["choices"])), []))
            blocks.append(("p", _words(_clarify_outcome(item)), []))
    return blocks


_CODE_BLOCK = re.compile(r"<pre><code>(.*?)</code></pre>", re.S)


def code_blocks(html: str) -> list[str]:
    """The text of each code block in rendered `html`, exactly (its last line break, which
    every viewer adds, taken off)."""
    return [unescape(code).removesuffix("\n") for code in _CODE_BLOCK.findall(html)]
