"""The names in the Markdown export (docs/api.md §12): a session's title, an attachment's
file name, the model of an answer and a notice are one line of text each, shown in the file
exactly as the page shows them by CommonMark viewers (markdown-it-py, cmark) and GitHub's
renderer (cmark-gfm with autolinks, tables and strikethrough): no character of a name is
markup there, an entity reference (`&amp;`) included, and no bare link takes the escapes
of the characters after it as its text. Layer: sessions/transfer (Markdown export). Over
real HTTP against a real server."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from tether.visible_text import visible_line

from helpers import ServerProcess
from markdown_kit import VIEWERS, exported

NAMES = {
    "entities": "Tom &amp; Jerry &lt;b&gt; &copy; &#42; &#x2A; &nbsp;& &",
    "inline markup": "a*b* _c_ **d** __e__ [x](y) ![i](j) [r][] [^1] <b>b</b> <!-- c -->",
    "code and tables": "`code` ``x`` ```fence ~~~ ~~struck~~ | a | b | end\\",
    "bare links": "see https://example.org/a_b*c*?q=1&amp;r=2, www.example.org/x_y and "
    "HTTP://A.B/_c_ <https://a.b> ftp://f.g/h_i",
    "hashes": "# ## not a heading #",
    "escapes": "snake_case_name 2*3*4 a\\*b \\\\ \\&amp;",
}


class _Blocks(HTMLParser):
    """Each heading, list item and quote of rendered HTML: its text, and the tags in it."""

    BLOCKS = frozenset({"h1", "h2", "li", "blockquote"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str, set[str]]] = []
        self.open: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if self.open is None and tag in self.BLOCKS:
            self.open = tag
            self.found.append((tag, "", set()))
        elif self.open is not None and tag != "p":
            self.found[-1][2].add(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == self.open:
            self.open = None

    def handle_data(self, data: str) -> None:
        if self.open is not None:
            tag, text, tags = self.found[-1]
            self.found[-1] = (tag, text + data, tags)


def blocks(html: str) -> list[tuple[str, str, set[str]]]:
    parser = _Blocks()
    parser.feed(html)
    return [(tag, text.strip(), tags) for tag, text, tags in parser.found]


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
def test_names_show_as_their_text_in_commonmark_and_githubs_renderer(
    shared_server: ServerProcess, name: str
) -> None:
    """`&amp;` in a title showed as `&`, and `www.example.org/x_y` as `www.example.org/x\\_y`
    on GitHub (its autolink takes escapes as they are): each name now shows as itself."""
    file_name = name.replace("/", "_").replace("\\", "_")  # a file name holds no path
    markdown = exported(
        shared_server, [("q", "a")], title=name, model=name, reason=name, attachment=file_name
    )
    shown, file_shown = visible_line(name), visible_line(file_name)
    for viewer, render in VIEWERS.items():
        found = blocks(render(markdown))
        assert [tag for tag, _, _ in found] == ["h1", "h2", "li", "h2", "blockquote"], (
            viewer,
            markdown,
        )
        (_, title, _), _, (_, attached, _), (_, answered, _), (_, notice, _) = found
        assert title == shown, (viewer, markdown)
        assert attached == f"Attachment: {file_shown} (2 bytes)", (viewer, markdown)
        assert answered.startswith(f"Assistant ({shown}) · "), (viewer, markdown)
        assert notice == f"Stopped: {shown}", (viewer, markdown)
        assert not set().union(*(tags for _, _, tags in found)), (viewer, markdown)
