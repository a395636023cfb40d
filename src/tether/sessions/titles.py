"""What a user-given title may be: text a person can see, on one line.

A title is cleaned by the rule every one-line name follows (`tether.visible_text`: NFC, bidi
controls and joiner-less zero-width characters removed, line breaks and tabs made spaces,
runs of whitespace one space), and a title a person or a file gives is refused, rather than
silently changed, when it holds a control character (NUL, ESC, DEL, C1: a bug or an attack,
never a typing slip) or when nothing visible is left.
"""

from __future__ import annotations

import unicodedata

from tether.visible_text import LINE_BREAKS, shows_something, visible_line


class TitleRefused(ValueError):
    """The message says what is wrong, for the person who typed it."""


def normalise_title(title: str) -> str:
    control = next(
        (ch for ch in title if unicodedata.category(ch) == "Cc" and ch not in LINE_BREAKS), None
    )
    if control is not None:
        raise TitleRefused(
            f"The title contains the control character U+{ord(control):04X}; a title is plain text."
        )
    text = visible_line(title)
    if not shows_something(text):
        raise TitleRefused(
            "The title must not be empty (invisible characters such as zero-width spaces "
            "and direction marks do not count)."
        )
    return text
