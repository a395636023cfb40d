"""Whitespace-insensitive echo detection for one reasoning transcript.

A runtime may echo its visible interim progress through the reasoning channel, or send interim
text that repeats the tail of the reasoning. Tether strips that echo once, where runtime output
enters the log, so a replay shows the content once (contract invariant 5).

The rule, in short: an echo is a suffix of the reasoning that equals the candidate once *all*
whitespace (``str.isspace``: spaces, tabs, newlines, NBSP, U+3000, ...) is removed from both
sides, however much whitespace sits between its characters in the raw text. There is no search
window: a suffix whose raw span is stretched by 100k spaces is still an echo. Matching is
case-sensitive and ignores word boundaries (``"the files"`` and ``"thefiles"`` are the same).

To keep that cheap, the folded view (whitespace removed) and the raw offset of every folded
character are built as each chunk is appended. A probe folds the candidate and compares it with
the folded tail, so it costs O(len(candidate)) and never rescans the transcript's whitespace.
Retired designs: a fixed window (missed echoes whose span outgrew it) and a raw backward walk
per probe (quadratic on whitespace-heavy transcripts).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right

__all__ = ["CompactEchoIndex", "fold"]

# For str patterns, ``\s`` is Py_UNICODE_ISSPACE: exactly the characters ``str.isspace`` accepts.
_WS = re.compile(r"\s+")
_NON_WS = re.compile(r"\S+")

# Folded text is kept as UTF-32-LE bytes: 4 bytes per character, so a tail of k characters is
# the last 4k bytes and comparing it is a single memcmp. surrogatepass keeps any str encodable.
_ENCODING = "utf-32-le"
_WIDTH = 4


def fold(text: str) -> str:
    """``text`` with every whitespace character (``str.isspace`` semantics) removed."""
    return _WS.sub("", text)


def _encode(folded: str) -> bytes:
    return folded.encode(_ENCODING, "surrogatepass")


class CompactEchoIndex:
    """Raw transcript plus its folded view, maintained incrementally.

    - ``append`` costs amortized O(len(chunk)).
    - ``probe`` costs O(len(candidate)), independent of the transcript's size.
    - ``truncate`` costs O(log n) plus what it removes.
    """

    def __init__(self) -> None:
        # Raw text as appended pieces; piece i covers raw[_starts[i]:end], where end is the next
        # piece's start (or raw_length for the last). A truncated last piece may be longer than
        # the part in use; the excess is never read.
        self._pieces: list[str] = []
        self._starts: list[int] = []
        self._raw_length = 0
        self._folded = bytearray()  # fold(raw), UTF-32-LE
        self._offsets = array("q")  # raw index of each folded character

    @property
    def raw_length(self) -> int:
        return self._raw_length

    @property
    def folded_length(self) -> int:
        return len(self._offsets)

    @property
    def text(self) -> str:
        """The raw transcript. O(n): for tests and diagnostics, not the hot path."""
        if not self._pieces:
            return ""
        ends = [*self._starts[1:], self._raw_length]
        return "".join(
            piece[: end - start]
            for piece, start, end in zip(self._pieces, self._starts, ends, strict=True)
        )

    def append(self, chunk: str) -> None:
        if not chunk:
            return
        base = self._raw_length
        self._pieces.append(chunk)
        self._starts.append(base)
        self._raw_length = base + len(chunk)
        for run in _NON_WS.finditer(chunk):
            self._folded += _encode(run.group())
            self._offsets.extend(range(base + run.start(), base + run.end()))

    def probe(self, candidate: str) -> int | None:
        """Raw offset where an echo of ``candidate`` begins, or None if the tail is no echo.

        The offset is that of the echo's first non-whitespace character, moved left over the
        whitespace right before it, so ``raw[:cut]`` keeps no dangling trailing whitespace.
        An empty or whitespace-only candidate never matches.
        """
        needle = _encode(fold(candidate))
        k = len(needle) // _WIDTH
        n = len(self._offsets)
        if k == 0 or k > n:
            return None
        if self._folded[len(self._folded) - len(needle) :] != needle:
            return None
        first = n - k  # folded index where the echo starts
        return self._offsets[first - 1] + 1 if first else 0

    def raw_from(self, start: int) -> str:
        """``raw[start:]``, at a cost of O(log n) plus the length returned."""
        first = max(bisect_right(self._starts, start) - 1, 0)
        parts = []
        for i in range(first, len(self._pieces)):
            begin = self._starts[i]
            end = self._starts[i + 1] if i + 1 < len(self._starts) else self._raw_length
            parts.append(self._pieces[i][max(start - begin, 0) : end - begin])
        return "".join(parts)

    def repeats_exactly(self, candidate: str, cut: int) -> bool:
        """Is the tail from ``cut`` (a ``probe`` result) the candidate exactly, whitespace
        included, and a whole segment (at the start, or after whitespace), not the end of a
        longer word? The stronger evidence a short candidate needs: ``"done."`` folds into
        the tail of ``"undone."``, but does not repeat it."""
        tail = self.raw_from(cut)
        at_boundary = cut == 0 or tail[:1].isspace()
        return at_boundary and tail.strip() == candidate.strip()

    def truncate(self, raw_cut: int) -> None:
        """Cut the transcript back to its first ``raw_cut`` characters."""
        if not 0 <= raw_cut <= self._raw_length:
            raise ValueError(f"raw_cut {raw_cut} outside 0..{self._raw_length}")
        if raw_cut == self._raw_length:
            return
        keep_folded = bisect_left(self._offsets, raw_cut)
        del self._offsets[keep_folded:]
        del self._folded[keep_folded * _WIDTH :]
        # Drop whole pieces starting at or after the cut; the piece holding it becomes last.
        keep_pieces = bisect_left(self._starts, raw_cut)
        del self._pieces[keep_pieces:]
        del self._starts[keep_pieces:]
        if self._pieces:
            last = self._pieces[-1]
            kept = raw_cut - self._starts[-1]
            if kept <= len(last) - kept:  # copying costs no more than what is removed
                self._pieces[-1] = last[:kept]
        self._raw_length = raw_cut
