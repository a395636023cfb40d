"""What a user-given title may be: text a person can see, on one line.

A title made only of zero-width characters shows as an empty row; bidi overrides let a title
display as something other than what it holds (`invoice\\u202egnp.exe`); NUL and other
control characters break logs, terminals and exports. So a title is normalised (NFC, the
invisible formatting characters removed, line breaks and tabs turned into spaces) and refused
when a control character remains or nothing visible is left.
"""

from __future__ import annotations

import unicodedata

# Removed wherever they are: the bidi embeddings, overrides, isolates and marks, and the
# zero-width characters that join nothing (ZWJ and ZWNJ stay: emoji sequences and several
# scripts need them).
INVISIBLE = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    "\u200b\u2060\u2061\u2062\u2063\u2064\ufeff\u180e\u00ad"
)
LINE_BREAKS = frozenset("\t\n\v\f\r\x85\u2028\u2029")
# Letters that render as nothing; kept in a title but not enough to make one.
BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
NOT_SHOWN = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Me", "Cn", "Co", "Cs"})


class TitleRefused(ValueError):
    """The message says what is wrong, for the person who typed it."""


def normalise_title(title: str) -> str:
    text = unicodedata.normalize("NFC", title)
    text = "".join(" " if ch in LINE_BREAKS else ch for ch in text if ch not in INVISIBLE).strip()
    control = next((ch for ch in text if unicodedata.category(ch) == "Cc"), None)
    if control is not None:
        raise TitleRefused(
            f"The title contains the control character U+{ord(control):04X}; a title is plain text."
        )
    if not any(
        unicodedata.category(ch) not in NOT_SHOWN and ch not in BLANK_LETTERS for ch in text
    ):
        raise TitleRefused(
            "The title must not be empty (invisible characters such as zero-width spaces "
            "and direction marks do not count)."
        )
    return text
