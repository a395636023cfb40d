"""`GET /api/sessions/{id}/export` and `GET /api/export` behind the routes (docs/api.md §12).

The JSON form is the session's log plus its attachments' bytes (`tether_json.export_entry`);
the Markdown form is the visible transcript, for people. Reads only: an export never
appends, repairs or bumps anything. Every session is read, encoded and sent one at a time,
off the event loop, so exporting every session never holds more than one in memory.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from tether import events as ev
from tether.events import Event
from tether.log import SessionNotFound
from tether.sessions.service import SessionService
from tether.sessions.transfer import raw_html
from tether.sessions.transfer.tether_json import export_entry
from tether.visible_text import shown_file_name, visible_line


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def _attachments(
    sessions: SessionService, sid: str, events: list[Event]
) -> tuple[list[dict], list[dict]]:
    """(the attachments with their bytes, the ones whose bytes the server no longer has):
    a missing one is named in the file, never dropped in silence (docs/api.md §12)."""
    refs: dict[str, dict] = {}
    for event in events:
        if event.type in (ev.TURN_SUBMITTED, ev.QUEUE_ADDED):
            for ref in event.data.get("attachments") or []:
                refs.setdefault(ref["id"], ref)
    out, missing = [], []
    for attachment_id, ref in refs.items():
        upload = await sessions.store.attachment(attachment_id, sid)
        path = None if upload is None else await sessions.attachments.path(upload["blob"])
        try:
            data = None if path is None else await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:  # removed between the look-up and the read
            data = None
        if upload is None or data is None:
            missing.append({k: ref[k] for k in ("id", "name", "mime", "size")})
        else:
            out.append({**upload, "data": data})
    return out, missing


async def session_json(sessions: SessionService, sid: str) -> str:
    """One session in Tether's JSON form, as text."""
    events = await sessions.store.read(sid)
    if not events:
        raise SessionNotFound(sid)
    attachments, missing = await _attachments(sessions, sid, events)
    entry = export_entry(events, attachments, time.time(), missing)
    return await asyncio.to_thread(_dumps, entry)


async def all_sessions(sessions: SessionService) -> AsyncIterator[bytes]:
    """Every session, one JSON line each, oldest first; a session deleted meanwhile is left
    out."""
    states = sorted((await sessions.store.index_states()).values(), key=lambda s: s["created_at"])
    for state in states:
        try:
            line = await session_json(sessions, state["session_id"])
        except SessionNotFound:
            continue
        yield (line + "\n").encode("utf-8")


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


# An answer's raw HTML check (`raw_html.live`, of each of its texts) is pure Python,
# milliseconds per KB: a text longer than the page formats (docs/page.md) is not checked, nor
# those left once an export has spent the budget checking; they are escaped the safe way
# (`_escaped_all`).
MAX_CHECKED_CHARS = 50_000
CHECK_BUDGET_SECONDS = 2.0

Offload = Callable[..., Awaitable[Any]]


async def session_markdown(sessions: SessionService, sid: str, offload: Offload) -> tuple[str, str]:
    """(title, Markdown): the visible transcript, each message under a heading. Written by
    `offload` (the render worker: http/render_pool.py), since checking answers for raw HTML
    parses them as Markdown, which must not hold the event loop."""
    view = await sessions.view(sid)
    text = await offload(markdown_file, view["title"], view["messages"], time.time())
    return view["title"], text


def markdown_file(title: str, messages: list[dict], now: float) -> str:
    """The Markdown of a session's visible transcript (`session_markdown`): each message's
    blocks under its heading, a blank line after each, so that none runs into the next."""
    deadline = time.monotonic() + CHECK_BUDGET_SECONDS
    lines = [f"# {plain(title)}", "", f"_Exported from Tether on {_when(now)}._", ""]
    for row in messages:
        who = "User" if row["role"] == "user" else "Assistant"
        if row.get("model"):
            who += f" ({plain(row['model'])})"
        lines += [f"## {who} · {_when(row.get('created_at'))}", ""]
        blocks = _user_blocks(row) if row["role"] == "user" else _answer_blocks(row, deadline)
        for block in blocks:
            lines += [block, ""]
    return "\n".join(lines)


def _user_blocks(row: dict) -> list[str]:
    """A user's message, then its attachments as one list."""
    blocks = [user_text(row["content"])] if row.get("content") else []
    attached = [
        f"- Attachment: {plain(shown_file_name(a['name']))} ({a['size']:,} bytes)"
        for a in row.get("attachments") or []
    ]
    return blocks + ["\n".join(attached)] if attached else blocks


# Between two texts of an answer: a link reference definition, which shows nothing, at a
# line's start, where it ends a list the first text leaves open. A blank line does not: a
# list the second text starts would go on the first's, and its indented lines would be the
# first's item. So the second starts blocks of its own, as the page renders each text apart.
_TEXTS_APART = "[//]: #"


def _answer_blocks(row: dict, deadline: float) -> list[str]:
    """An answer's timeline in its order, as the page shows it in its default view
    (js/blocks.js): each text, interim progress too, each tool call, each steer, approval
    prompt and clarify question, and the notice of how the run ended. Reasoning, folded
    away on the page, is left out. All but a text start at a line's start after a blank
    line, and none is a list item or a quote's lazy line: whatever a text before them
    leaves open ends there, so each is a block of its own."""
    blocks: list[str] = []
    after_text = False
    for item in row.get("timeline") or []:
        if item["type"] == "text" and item["text"].strip():
            if after_text:
                blocks.append(_TEXTS_APART)
            check = len(item["text"]) <= MAX_CHECKED_CHARS and time.monotonic() < deadline
            blocks.append(contained(item["text"], check))
        elif item["type"] == "tool":
            blocks.append(f"Tool call: {code_span(item.get('name', ''))}")
        elif item["type"] == "steer":
            label = (
                "Not delivered (back in the composer):" if item.get("leftover") else "You steered:"
            )
            blocks.append(f"{label} {user_text(item.get('text') or '')}")
        elif item["type"] == "approval":
            blocks += _approval_blocks(item)
        elif item["type"] == "clarify":
            blocks += _clarify_blocks(item)
        elif item["type"] == "notice":
            blocks.append(f"> {plain(item['text'])}")
        else:
            continue
        after_text = item["type"] == "text"
    return blocks


# What the page says of an approval prompt's answer and of a question nobody answered, once
# the run has settled (js/timeline_view.js); an answer it does not know is "Not answered.".
_ALLOWED = {
    "once": "Allowed once.",
    "session": "Allowed for this session.",
    "always": "Always allowed.",
}
_DENIED = {
    "user": "Denied.",
    "timeout": "Denied: nobody answered in time.",
    "stopped": "Denied: the run ended before an answer.",
}
_UNANSWERED = {
    "timeout": "Nobody answered in time; the agent decides on its own.",
    "stopped": "The run ended before an answer.",
}


def _approval_blocks(item: dict) -> list[str]:
    """The agent's question and why it asks, the command as the page shows it (a code
    block, line for line), and the answer chosen."""
    if item.get("choice") == "deny":
        outcome = _DENIED.get(item.get("reason") or "", "Denied.")
    else:
        outcome = _ALLOWED.get(item.get("choice") or "", "Not answered.")
    asks = f"**The agent asks to run this:** {plain(item.get('description') or '')}"
    return [asks.rstrip(), code_block(item.get("command") or ""), outcome]


def _clarify_blocks(item: dict) -> list[str]:
    """The agent's question, the choices it offered (buttons on the page while it waits),
    and the user's answer in their words, or that none came."""
    blocks = [f"**The agent asks:** {plain(item.get('question') or '')}".rstrip()]
    if item.get("choices"):
        blocks.append("Choices: " + " · ".join(plain(choice) for choice in item["choices"]))
    if item.get("reason") == "user":
        blocks.append(f"You answered: {user_text(item.get('text') or '')}")
    else:
        blocks.append(_UNANSWERED.get(item.get("reason") or "", "Not answered."))
    return blocks


# Code fences (CommonMark): 3 or more backticks or tildes. An opening one is looked for at
# the line's start only: one indented by 1-3 spaces may be inside a list item, which closes
# it, and a fence appended for it would then open one of its own.
_OPENING = re.compile(r"(`{3,}|~{3,})(.*)")
_CLOSING = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
# Where CommonMark starts raw HTML (a tag, a closing tag, a comment, a declaration, a
# processing instruction), and the autolinks that also start with `<` and stay links. Such a
# `<` is written `&lt;`, never `\<`: GitHub's autolinks (a bare `http://...` or `www.`
# link) run over a backslash up to the `<`, which then starts a tag, but show `&lt;` as
# text (docs/security.md, "Markdown export").
_HTML_START = re.compile(r"<[A-Za-z/!?]")
_LT = "&lt;"
_AUTOLINK = re.compile(
    r"<[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*>"
    r"|<[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*>"
)
_TICKS = re.compile(r"`+")
# A tag that starts a line of a code span across lines: on a quote's lazy line (no `>`),
# cmark starts an HTML block there where CommonMark (markdown-it-py) goes on with the span.
_LINE_TAG = re.compile(r"(\n {0,3})<(?=[A-Za-z/!?])")
# What `_escaped_all` escapes (with the backslash escaping it, if any), and the backslash
# escapes it steps over.
_ESCAPABLE = re.compile(r"\\?<(?=[A-Za-z/!?])|\\.", re.S)
# A full reference link's label holding a backtick (`[text][la`bel]`): cmark reads the label
# as it is, markdown-it-py pairs the backtick as code, so the two pair the backticks after
# it apart and `raw_html.live` cannot vouch for either.
_DISPUTED = re.compile(r"\]\[(?:[^\]\\]|\\.)*`")
_INDENTED = re.compile(r"(?: {4}| {0,3}\t)")
# What opens a list item (CommonMark), a container whose lines may be indented.
_LIST_ITEM = re.compile(r" {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)")
_LINE_END = re.compile(r"\r\n|\r|\n")
# What makes GitHub start a bare link (`://` after a scheme, `www.`), whose text would be the
# characters it runs over as they are, backslashes too, up to a space or a `<`: escaped in
# the plain text of a name or a user's message, it makes none.
_BARE_LINK = r":(?=//)|(?<=www)\."
# A name (`plain`): what is Markdown anywhere in a line (`&` starts an entity reference), and
# what starts a bare link.
_PLAIN = re.compile(rf"[\\`*_\[\]#~|&]|{_BARE_LINK}", re.IGNORECASE)
# A user's message (`user_text`): what is Markdown anywhere in a line, what only at its
# start, the number of an ordered list item (escaped at its `.` or `)`), and what starts a
# bare link.
_INLINE = frozenset("\\`*_[]&~|")
_BLOCK = frozenset("#>-+=")
_ORDERED = re.compile(r"\d+(?=[.)])")
_LINK_START = re.compile(_BARE_LINK, re.IGNORECASE)


def contained(text: str, check: bool = True) -> str:
    """`text` as blocks that end with it, and raw HTML as text. The page renders each
    message apart, and raw HTML as text (`<script>` is shown, never run, wherever it is in a
    line); in one file a code fence it never closes would swallow the headings and messages
    after it, and HTML outside code would be markup. Such a fence is closed at its end, and
    the `<` that starts HTML outside code escaped.

    Which backticks pair into a code span is the parser's to say (a heading, a list item, a
    table cell ends a paragraph where no blank line does), so code spans keep their `<` only
    where markdown-it-py finds no raw HTML in the result (`raw_html.live`), when `check`
    allows the parse. Otherwise each `<` outside fences is escaped, in code spans too (which
    then show a backslash before it): HTML never runs."""
    if "<" not in text:  # no HTML, nothing to check: the usual answer costs no parse
        return _contain(text, _escaped_html)
    if check and not _DISPUTED.search(text):
        spans_kept = _contain(text, _escaped_html)
        if not raw_html.live(spans_kept):
            return spans_kept
    return _contain(text, _escaped_all)


def _contain(text: str, escape: Callable[[list[str]], list[str]]) -> str:
    """`text` with its fences closed and its other lines (`escape`d) as they are."""
    lines: list[str] = []
    prose: list[str] = []
    opened = ""
    for line in _LINE_END.split(text):
        if not opened:
            match = _OPENING.fullmatch(line)
            if not (match and (line[0] == "~" or "`" not in match[2])):  # no ` in its info
                prose.append(line)
                continue
            lines += escape(prose)
            prose, opened = [], match[1]
        elif (match := _CLOSING.fullmatch(line)) and match[1][0] == opened[0]:
            opened = "" if len(match[1]) >= len(opened) else opened
        lines.append(line)
    lines += escape(prose)
    if opened and lines[-1] == "":  # the text ends with a line break
        lines[-1] = opened
    elif opened:
        lines.append(opened)
    return "\n".join(lines)


def _escaped_all(lines: list[str]) -> list[str]:
    """Lines outside fences, each `<` that could start HTML written `&lt;` wherever it is (in
    a code span, in indented code, which then show `&lt;`): what is sure without a parser. A
    fence is only opened at a line's very start, where no list item or quote goes on (a
    fence is never a lazy line), so CommonMark agrees on where fences are. A `\\<` of the
    text is written `&lt;` too, which shows the same outside code, where an autolink could
    take its backslash."""
    text = _ESCAPABLE.sub(lambda m: _LT if m[0][-1] == "<" else m[0], "\n".join(lines))
    return text.split("\n")


def _escaped_html(lines: list[str]) -> list[str]:
    """Lines outside fences, each paragraph's HTML escaped outside its code spans (which may
    span its lines); an indented code block is code, kept as it is.

    A line indented four spaces is an indented code block only at the top level: in a list
    item it is a paragraph of the item (or code indented past the item's content), where
    raw HTML is live. So once a list item opens, indented lines are escaped like a
    paragraph's until a line that is surely back at the top level: one after a blank line
    that is not indented at all (an item's content is indented two columns or more). A
    block quote needs nothing of its own: its lines up to a blank line, which ends it, are
    one paragraph here. Code inside a list item may so show a backslash before a `<`; HTML
    never runs."""
    out: list[str] = []
    paragraph: list[str] = []
    in_list = blank_before = False
    for line in [*lines, ""]:
        if line.strip():
            if _LIST_ITEM.match(line):
                in_list = True
            elif blank_before and line[0] not in " \t":
                in_list = False
            blank_before = False
            if paragraph or in_list or not _INDENTED.match(line):
                paragraph.append(line)
                continue
        else:
            blank_before = True
        if paragraph:
            out += _escape_inline("\n".join(paragraph)).split("\n")
            paragraph = []
        out.append(line)  # a blank line, or a line of an indented code block
    return out[:-1]


def _escape_inline(text: str) -> str:
    """`text` with each `<` that starts raw HTML written `&lt;` (after a backslash too),
    outside code spans and autolinks, and in a code span where it starts a line."""
    runs: dict[int, list[int]] = {}  # backtick runs by length: where each starts
    for match in _TICKS.finditer(text):
        runs.setdefault(len(match[0]), []).append(match.start())
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "\\" and _HTML_START.match(text, i + 1):
            out.append(_LT)
            i += 2
        elif char == "\\":  # an escaped character stays what it is
            out.append(text[i : i + 2])
            i += 2
        elif char == "`":
            width = len(_TICKS.match(text, i)[0])  # type: ignore[index]
            starts = runs.get(width, [])
            after = bisect.bisect_right(starts, i)
            end = starts[after] + width if after < len(starts) else i + width  # unclosed
            out.append(_LINE_TAG.sub(rf"\1{_LT}", text[i:end]))
            i = end
        elif char == "<" and (link := _AUTOLINK.match(text, i)):
            out.append(link[0])
            i = link.end()
        else:
            out.append(_LT if char == "<" and _HTML_START.match(text, i) else char)
            i += 1
    return "".join(out)


def user_text(text: str) -> str:
    """A user's message as the page shows it (plain text, `white-space: pre-wrap`), written
    so that a Markdown viewer shows the same characters and lines: one paragraph, each line
    break a hard break (`\\` at the line's end), every character that could be Markdown
    escaped, and the spaces a viewer would drop or collapse (at a line's start or end, after
    another) written as no-break spaces, tabs there as `&#9;`. A final line break draws no
    line on the page, so none is written; an empty last line is a no-break space (a hard
    break cannot end a paragraph)."""
    lines = _LINE_END.split(text)
    if len(lines) > 1 and not lines[-1]:
        lines.pop()
    out = [_user_line(line) for line in lines]
    if len(out) > 1 and not out[-1]:
        out[-1] = "&nbsp;"
    return "\\\n".join(out)


def _user_line(line: str) -> str:
    """One line of a user's message: Markdown's inline characters escaped wherever they
    are (a `<` written `&lt;`), what starts a block (`#`, `>`, `-`, `+`, `=`, `1.`, `1)`) at
    the line's start, and the `:` of a `://` and the `.` of a `www.`, so GitHub makes no bare
    link that would show the escapes after it (`http://a/x\\_y`) or take the hard break's
    backslash at the line's end."""
    lead = len(line) - len(line.lstrip(" \t"))
    trail = len(line.rstrip(" \t"))
    start = _ORDERED.match(line)
    links = {match.start() for match in _LINK_START.finditer(line)}
    out = []
    for i, char in enumerate(line):
        if char in " \t" and (i < lead or i >= trail or line[i - 1] in " \t"):
            out.append("&nbsp;" if char == " " else "&#9;")
        elif char == "<":
            out.append(_LT)
        elif (
            char in _INLINE
            or (i == 0 and char in _BLOCK)
            or (start and i == start.end())
            or i in links
        ):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def plain(text: str) -> str:
    """A title, a name, a notice: one line of visible text (`visible_line`: a file name or a
    model id from a log written before names were cleaned may hold a bidi override, which
    would reorder the rest of its line in a reader), and none of it Markdown here (a `<` is
    `&lt;`, as in `user_text`; `&amp;` shows as those five characters). A bare link GitHub
    would make of it (`http://a/b_c` showed `b\\_c`) is not one: its `:` or `.` is escaped."""
    return _PLAIN.sub(r"\\\g<0>", visible_line(text)).replace("<", _LT)


def code_span(text: str) -> str:
    """`text` as one inline code span: its fence longer than any backtick run in it, and
    padded where it starts or ends with a backtick or a space (one is stripped each side)."""
    text = " ".join(_LINE_END.split(text))
    if not text:
        return "` `"
    fence = "`" * (max((len(run) for run in _TICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str) -> str:
    """`text` as one fenced code block, line for line (a final line break draws no line, as
    in the page's `<pre>`): its fence, backticks with no info string, longer than any
    backtick run in it, so that none of its lines closes the block before its end."""
    lines = _LINE_END.split(text) if text else []
    if len(lines) > 1 and not lines[-1]:
        lines.pop()
    fence = "`" * max(3, max((len(run) for run in _TICKS.findall(text)), default=0) + 1)
    return "\n".join([fence, *lines, fence])


def attachment_header(title: str, extension: str) -> str:
    """`Content-Disposition` for a download named after the session."""
    plain = re.sub(r"[^A-Za-z0-9 ._-]+", "", title).strip(" .")[:60] or "session"
    return (
        f'attachment; filename="{plain}.{extension}"; '
        f"filename*=UTF-8''{quote(title[:60] or 'session', safe='')}.{extension}"
    )
