"""Markdown to safe HTML, server-side, with maintained libraries: markdown-it-py (CommonMark)
parses with raw HTML disabled, Pygments highlights code blocks, and nh3 (the ammonia
sanitizer) keeps only an allowlist of tags, attributes and URL schemes. Everything a model, a
tool or a user wrote is untrusted; the page inserts only this output as HTML.

This module runs in the render worker process (http/render_pool.py), never on the event
loop: markdown-it-py is pure Python, about 30 ms per KB on adversarial input (`[` repeated,
tables, emphasis runs), so the work is bounded per text and per request. A text over
`MAX_FORMATTED_CHARS` is shown as escaped plain text with a note; once a request has spent
`REQUEST_BUDGET_SECONDS` formatting, its remaining texts are too (and are not cached, so a
later request formats them).
"""

from __future__ import annotations

import hashlib
import html as html_lib
import json
import time
from collections import OrderedDict
from typing import Any

import nh3
from markdown_it import MarkdownIt
from pydantic import ValidationError
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from tether.http.schemas import RenderRequest

_TAGS = {
    "p",
    "br",
    "hr",
    "em",
    "strong",
    "del",
    "s",
    "code",
    "pre",
    "span",
    "div",
    "a",
    "ul",
    "ol",
    "li",
    "blockquote",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
}
_ATTRIBUTES = {
    "a": {"href", "title"},
    "p": {"class"},
    "span": {"class"},
    "code": {"class"},
    "pre": {"class"},
    "div": {"class"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
}
_FORMATTER = HtmlFormatter(nowrap=True, classprefix="hl-")
MAX_FORMATTED_CHARS = 50_000
REQUEST_BUDGET_SECONDS = 2.0
_CACHE_ENTRIES = 2048
_CACHE_BYTES = 32 * 1024 * 1024


def _highlight(code: str, lang: str, _attrs: str) -> str:
    try:
        lexer = get_lexer_by_name(lang.strip().split()[0]) if lang.strip() else None
    except ClassNotFound:
        lexer = None
    if lexer is None:
        return ""  # markdown-it escapes it as plain code
    return highlight(code, lexer, _FORMATTER)


_MD = MarkdownIt("commonmark", {"html": False, "linkify": False, "highlight": _highlight}).enable(
    ["table", "strikethrough"]
)


class _Cache:
    """Rendered HTML by a hash of its text, least recently used first out, bounded in
    entries and in bytes (one huge answer must not pin memory)."""

    def __init__(self) -> None:
        self._items: OrderedDict[bytes, str] = OrderedDict()
        self._bytes = 0

    def get(self, key: bytes) -> str | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: bytes, html: str) -> None:
        if len(html) > _CACHE_BYTES // 8 or key in self._items:
            return
        self._items[key] = html
        self._bytes += len(html)
        while len(self._items) > _CACHE_ENTRIES or self._bytes > _CACHE_BYTES:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= len(evicted)

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0


_cache = _Cache()


def _format(text: str) -> str:
    return nh3.clean(
        _MD.render(text),
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )


def plain(text: str, note: str) -> str:
    """`text` escaped in a `<pre>`, after a visible note saying why it is not formatted;
    sanitized like every formatted text."""
    return nh3.clean(
        f'<p class="render-note">{html_lib.escape(note)}</p>'
        f'<pre class="render-plain">{html_lib.escape(text)}</pre>',
        tags=_TAGS,
        attributes=_ATTRIBUTES,
    )


def _too_long_note(text: str) -> str:
    return (
        f"Shown as plain text: {len(text):,} characters is more than the "
        f"{MAX_FORMATTED_CHARS:,} that are formatted."
    )


def render(text: str) -> str:
    key = _key(text)
    cached = _cache.get(key)
    if cached is None:
        too_long = len(text) > MAX_FORMATTED_CHARS
        cached = plain(text, _too_long_note(text)) if too_long else _format(text)
        _cache.put(key, cached)
    return cached


def render_many(texts: list[str], budget: float = REQUEST_BUDGET_SECONDS) -> list[str]:
    """Each text rendered, until `budget` seconds are spent; the rest as plain text."""
    deadline = time.monotonic() + budget
    out = []
    for text in texts:
        if time.monotonic() > deadline and _cache.get(_key(text)) is None:
            out.append(
                plain(
                    text,
                    "Shown as plain text: this request had more to format than one request "
                    "may (it is formatted when the page asks again).",
                )
            )
        else:
            out.append(render(text))
    return out


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def render_request(raw: bytes) -> tuple[str, Any]:
    """The worker's entry point: the raw body of `POST /api/render` in, `("ok", the JSON
    response body)` or `("invalid", pydantic's errors)` out. Parsing, validating and encoding
    happen here too, so the event loop never spends time proportional to the texts."""
    try:  # Python's parser, as FastAPI's: a lone surrogate gets the validator's own message
        data = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return "invalid", [{"type": "json_invalid", "loc": ("body",), "msg": str(exc)}]
    if not isinstance(data, dict):
        return "invalid", [{"type": "model_attributes_type", "loc": ("body",), "msg": "object"}]
    try:
        body = RenderRequest.model_validate(data)
    except ValidationError as exc:  # located as FastAPI locates them, without the input
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return "invalid", [{**err, "loc": ("body", *err["loc"])} for err in errors]
    html = render_many(body.texts)
    return "ok", json.dumps({"html": html}, ensure_ascii=False).encode()
