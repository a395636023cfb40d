"""One-line names as a person sees them: session titles, attachment file names, model labels.

Such a name is shown beside other text (a sidebar row's time, a header's badge, a sentence
that quotes it), so it must not carry characters that change how that text is drawn or that
draw nothing: a bidi override makes `invoice\\u202egnp.exe` display as `invoiceexe.png` and
can reorder what follows it; zero-width characters make two different names look the same;
control characters break logs and terminals. `visible_line` is the one rule every such name
goes through where it enters (docs/api.md §3 lists the sets), and it never raises: callers
that refuse bad input (a title a person typed) check `shows_something` and the raw text
themselves.

`holds_half_pair` is the one check for text that cannot be text at all (half a UTF-16 pair),
made where JSON enters: the API's bodies and an import's file.

Depends on nothing, so the folds (projections) and every layer above can use it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# Removed wherever they are: the bidi embeddings, overrides, isolates and marks (U+061C,
# U+200E/200F, U+202A-202E, U+2066-2069); the zero-width characters that join nothing
# (U+200B, U+2060-2064, U+FEFF, U+180E) and the soft hyphen (U+00AD); the deprecated format
# controls (U+206A-206F: symmetric swapping, Arabic shaping, digit shapes) and the
# interlinear annotation marks (U+FFF9-FFFB), which change how neighbouring text is drawn.
INVISIBLE = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    "\u200b\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad"
    "\u206a\u206b\u206c\u206d\u206e\u206f\ufff9\ufffa\ufffb"
)
# Tabs and everything that breaks a line (C0, NEL, the line and paragraph separators): a
# space each, so the words either side stay apart on the one line.
LINE_BREAKS = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029")
# ZWNJ and ZWJ: kept where they join two characters that can join (emoji sequences such as
# the family emoji, Persian, the Indic scripts), dropped elsewhere (between ASCII letters,
# beside a space, at an end), where they only make `ad\u200dmin` look like `admin`.
JOINERS = frozenset("\u200c\u200d")
# Letters that render as nothing: kept in a name, but not enough to make one.
BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
NOT_SHOWN = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Me", "Cn", "Co", "Cs"})
_SPACE_RUN = re.compile(r"\s{2,}")


def visible_line(text: str) -> str:
    """`text` as one line of visible text: NFC; the INVISIBLE characters and every other
    control character (C0, DEL, C1) removed; LINE_BREAKS made spaces; a joiner kept only
    between two characters it can join; runs of whitespace one space; trimmed. Legitimate
    text (Arabic, Hebrew, CJK, emoji sequences) comes out as it went in."""
    chars = [
        " " if ch in LINE_BREAKS else ch
        for ch in unicodedata.normalize("NFC", text)
        if ch in LINE_BREAKS or (ch not in INVISIBLE and unicodedata.category(ch) != "Cc")
    ]
    kept = [
        ch
        for i, ch in enumerate(chars)
        if ch not in JOINERS or (_can_join(chars, i - 1) and _can_join(chars, i + 1))
    ]
    return _SPACE_RUN.sub(" ", "".join(kept)).strip()


def _can_join(chars: list[str], i: int) -> bool:
    if not 0 <= i < len(chars):
        return False
    ch = chars[i]
    return ch >= "\x80" and not ch.isspace() and ch not in JOINERS


def shows_something(text: str) -> bool:
    """Whether `text` draws anything: a character that is not a space, a format or control
    character, a lone combining mark, or a letter that renders blank (Hangul fillers, the
    braille blank)."""
    return any(unicodedata.category(ch) not in NOT_SHOWN and ch not in BLANK_LETTERS for ch in text)


def shown_file_name(name: str) -> str:
    """An attachment's file name as shown and saved (the download, the Markdown export, and
    what an import's copy holds): `visible_line`, or `attachment` when that shows nothing.
    Intake refuses such a name, but a log written before names were cleaned may hold one
    (`\\u200b\\u202e`), and the log is never rewritten. Copied in `web/js/names.js`
    (`shownFiles`)."""
    shown = visible_line(name)
    return shown if shows_something(shown) else "attachment"


def is_half_pair(text: str) -> bool:
    """Whether `text` holds half a UTF-16 pair: JSON may escape one (`"\\ud800"`), and no
    UTF-8 encoder takes it, so it could never be stored, logged or sent back."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def holds_half_pair(value: Any) -> bool:
    """Whether any string in a JSON value (keys included) holds half a pair. Iterative:
    nesting depth is the sender's choice."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if is_half_pair(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False
