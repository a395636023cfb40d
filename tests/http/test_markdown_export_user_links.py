"""A user's message holding a bare link, in the Markdown export (docs/api.md §12): the page
shows a user's message as plain text, so CommonMark viewers (markdown-it-py, cmark) and
GitHub's renderer (cmark-gfm, whose autolinks take the characters a `http://`, `https://`,
`ftp://` or `www.` link runs over as they are, backslashes too) must all show exactly the
text typed. Layer: sessions/transfer (Markdown export). Over real HTTP against a real
server."""

from __future__ import annotations

import re

import pytest

from helpers import ServerProcess
from markdown_kit import VIEWERS, exported, sections, shown_text

LINKED = {
    "escapes in links": "see http://a/x_y and www.example.com/a_b, then https://e.org/a*b*c?q=1"
    "&amp;r=2#f~x~ [y] `z` ftp://f.g/h_i",
    "link before a line break": "ends with http://a/x_y\nthe next line\nwww.b.c/d_e\nlast",
    "spaces after a link": "a link http://a/b_c   \n   www.d.e/f_g\t\nend",
    "case and delimiters": "HTTP://A.B/_c_ Https://d/e_f (www.a.b/c_d) *www.e.f/g_h* ~www.i.j/k_l",
    "lt in a link": "http://a<b>x</b> and www.a.b\\<i> and www.a.b/&lt;i&gt;_",
    "a list's number": "1. http://a/b_c\n2) www.d.e/f_g",
    "email": "a_b@c.d and mailto:e_f@g.h/i_j",
}


def shown(html: str) -> tuple[list[str], set[str]]:
    """(the lines shown, the tags built)."""
    text, tags = shown_text(html)
    return text.strip("\n").split("\n"), tags


@pytest.mark.parametrize("text", LINKED.values(), ids=LINKED.keys())
def test_a_bare_link_in_a_user_message_shows_as_typed_in_every_viewer(
    shared_server: ServerProcess, text: str
) -> None:
    """GitHub made a link of `http://a/x_y` and showed the export's escapes in it
    (`http://a/x\\_y`), and one that ended a line took the hard break's backslash too (the
    line break was lost): the export makes no bare link of a user's text now (the `:` of a
    `://` and the `.` of a `www.` are escaped), and each viewer shows the lines typed. An
    e-mail address GitHub links still shows as typed (its text is the parsed text)."""
    (section, _) = sections(exported(shared_server, [(text, "ok")]))
    want = re.split(r"\r\n|\r|\n", text)
    for viewer, render in VIEWERS.items():
        lines, tags = shown(render(section))
        assert lines == want, (viewer, section, lines)
        assert tags <= ({"p", "br", "a"} if "@" in text else {"p", "br"}), (viewer, section)
