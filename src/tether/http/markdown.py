"""Markdown to safe HTML, server-side, with maintained libraries: markdown-it-py (CommonMark)
parses with raw HTML disabled, Pygments highlights code blocks, and nh3 (the ammonia
sanitizer) keeps only an allowlist of tags, attributes and URL schemes. Everything a model, a
tool or a user wrote is untrusted; the page inserts only this output as HTML."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

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
    "span": {"class"},
    "code": {"class"},
    "pre": {"class"},
    "div": {"class"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
}
_FORMATTER = HtmlFormatter(nowrap=True, classprefix="hl-")
_CACHE_SIZE = 2048


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
_cache: OrderedDict[str, str] = OrderedDict()


def render(text: str) -> str:
    key = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    cached = _cache.get(key)
    if cached is not None:
        _cache.move_to_end(key)
        return cached
    html = nh3.clean(
        _MD.render(text),
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
    )
    _cache[key] = html
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return html
