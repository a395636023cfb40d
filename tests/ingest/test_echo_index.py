"""CompactEchoIndex: whitespace-insensitive, windowless echo matching at bounded probe cost."""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tether import events as ev
from tether.ingest.echo import CompactEchoIndex, fold
from tether.ingest.normalizer import SHORT_ECHO_CHARS, Normalizer
from tether.runtimes.base import ReasoningDelta, TextDelta

# --- the naive oracle: fold everything, then walk the raw text --------------------------------


def oracle_fold(text: str) -> str:
    return "".join(c for c in text if not c.isspace())


def oracle_probe(raw: str, candidate: str) -> int | None:
    needle = oracle_fold(candidate)
    if not needle or not oracle_fold(raw).endswith(needle):
        return None
    i, remaining = len(raw), len(needle)
    while remaining:
        i -= 1
        if not raw[i].isspace():
            remaining -= 1
    while i and raw[i - 1].isspace():
        i -= 1
    return i


# --- strategies -------------------------------------------------------------------------------

WHITESPACE = " \t\n\r\u3000\xa0\u2009\x0b\u2028"
LETTERS = "abcLMX漢字かな.,"

words = st.text(alphabet=LETTERS, min_size=1, max_size=6)
spaces = st.text(alphabet=WHITESPACE, min_size=1, max_size=8)
segments = st.lists(st.one_of(words, spaces), max_size=10).map("".join)
maybe_spaces = st.text(alphabet=WHITESPACE, max_size=3)


def respaced(draw: Callable, compact: str) -> str:
    """``compact`` with random whitespace before, between and after its characters."""
    gaps = draw(st.lists(maybe_spaces, min_size=len(compact) + 1, max_size=len(compact) + 1))
    return "".join(gap + ch for gap, ch in zip(gaps[:-1], compact, strict=True)) + gaps[-1]


def draw_candidate(draw: Callable, raw: str) -> str:
    folded = oracle_fold(raw)
    kind = draw(st.sampled_from(["suffix", "suffix", "near-miss", "other", "blank"]))
    if kind == "blank":
        return draw(st.text(alphabet=WHITESPACE, max_size=5))
    if kind == "other" or not folded:
        return draw(segments)
    length = draw(st.integers(1, min(len(folded), 30)))
    compact = folded[-length:]
    if kind == "near-miss":
        how = draw(st.sampled_from(["swap", "extend", "drop", "case"]))
        pos = draw(st.integers(0, length - 1))
        if how == "swap":
            other = draw(st.sampled_from(LETTERS).filter(lambda c: c != compact[pos]))
            compact = compact[:pos] + other + compact[pos + 1 :]
        elif how == "extend":
            compact = draw(st.sampled_from(LETTERS)) + compact
        elif how == "drop":
            compact = compact[:-1]
        else:
            compact = compact.swapcase()
    return respaced(draw, compact)


# --- 1. equivalence with the oracle -----------------------------------------------------------


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_index_agrees_with_naive_oracle(data: st.DataObject) -> None:
    draw = data.draw
    index = CompactEchoIndex()
    raw = ""
    for _ in range(draw(st.integers(1, 10))):
        op = draw(st.sampled_from(["append", "append", "truncate", "probe", "strip"]))
        if op == "append":
            segment = draw(segments)
            # Random chunk boundaries, which land inside whitespace runs as often as not.
            cuts = sorted(draw(st.lists(st.integers(0, len(segment)), max_size=4)))
            for start, end in zip([0, *cuts], [*cuts, len(segment)], strict=True):
                index.append(segment[start:end])
            raw += segment
        elif op == "truncate":
            cut = draw(st.integers(0, len(raw)))
            index.truncate(cut)
            raw = raw[:cut]
        for _ in range(2):
            candidate = draw_candidate(draw, raw)
            got = index.probe(candidate)
            assert got == oracle_probe(raw, candidate), (raw, candidate)
            event("match" if got is not None else "no match")
            if op == "strip" and got is not None:
                index.truncate(got)
                raw = raw[:got]
                assert not raw or not raw[-1].isspace()
        assert index.raw_length == len(raw)
        assert index.text == raw
        start = draw(st.integers(0, len(raw)))
        assert index.raw_from(start) == raw[start:]
        assert index.folded_length == len(oracle_fold(raw))


def test_fold_is_str_isspace_over_all_code_points() -> None:
    everything = "".join(map(chr, range(0x110000)))
    assert fold(everything) == oracle_fold(everything)


# --- 2. cost: probes do not grow with the transcript, appends are linear ----------------------


def whitespace_heavy(size: int, seed: int) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size:
        part = rng.choice(["word", "漢字", "files", "check"]) + "".join(
            rng.choice(" \t\n\u3000") for _ in range(rng.randint(50, 400))
        )
        parts.append(part)
        total += len(part)
    return "".join(parts)


TAIL = "Let   me\n\tcheck\u3000the  files   and then\n\nrun the\t\ttests once more."
CANDIDATE = "Let me check the files and then run the tests once more."


def build(text: str, chunk: int = 4096) -> CompactEchoIndex:
    index = CompactEchoIndex()
    for start in range(0, len(text), chunk):
        index.append(text[start : start + chunk])
    return index


def median_ratio(large: Callable[[], object], small: Callable[[], object], reps: int = 9) -> float:
    """Median over repetitions of time(large) / time(small), timed back to back so that load
    from elsewhere on the machine hits both sides alike. Ratios only, never absolute times."""
    large(), small()  # warm up
    ratios = []
    gc.disable()
    try:
        for _ in range(reps):
            start = time.perf_counter()
            small()
            middle = time.perf_counter()
            large()
            ratios.append((time.perf_counter() - middle) / (middle - start))
    finally:
        gc.enable()
    return statistics.median(ratios)


def transcript(size: int, seed: int, layout: str) -> tuple[str, int]:
    """A whitespace-heavy transcript of about ``size`` chars ending in an echo, and its cut."""
    if layout == "tail":  # the echo follows size chars of words and long whitespace runs
        head = whitespace_heavy(size, seed)
        return head + TAIL, len(head.rstrip())
    # "stretched": the echo's own raw span holds size chars of whitespace
    head = "I looked around."
    rng = random.Random(seed)
    gap = "".join(rng.choice(" \t\n\u3000\xa0") for _ in range(size))
    return head + " " + TAIL.replace("me\n", "me\n" + gap, 1), len(head)


@pytest.mark.parametrize("layout", ["tail", "stretched"])
def test_probe_cost_does_not_grow_with_transcript(layout: str) -> None:
    indexes = []
    for size, seed in ((10_000, 1), (1_000_000, 2)):
        raw, expected_cut = transcript(size, seed, layout)
        assert len(raw) >= size
        index = build(raw)
        assert index.probe(CANDIDATE) == oracle_probe(raw, CANDIDATE) == expected_cut
        assert index.probe(CANDIDATE.replace("more.", "more!")) is None
        indexes.append(index)

    def probes(index: CompactEchoIndex) -> Callable[[], None]:
        def run() -> None:
            for _ in range(10_000):
                index.probe(CANDIDATE)

        return run

    small, large = indexes
    ratio = median_ratio(probes(large), probes(small), reps=11)
    print(f"probe cost 1 MB / 10 KB ({layout}): {ratio:.2f}")
    assert ratio < 2, ratio


def test_append_cost_is_linear() -> None:
    small_raw = whitespace_heavy(10_000, seed=3)
    large_raw = whitespace_heavy(1_000_000, seed=4)
    # Both sides append the same number of bytes: 1 MB once vs 10 KB a hundred times.
    repeat_small = len(large_raw) // len(small_raw)

    def append_small() -> None:
        for _ in range(repeat_small):
            build(small_raw)

    ratio = median_ratio(lambda: build(large_raw), append_small, reps=5)
    ratio *= repeat_small * len(small_raw) / len(large_raw)  # per byte
    print(f"append cost per byte 1 MB / 10 KB: {ratio:.2f}")
    assert ratio < 3, ratio


# --- 3. concrete cases ------------------------------------------------------------------------


def index_of(*chunks: str) -> CompactEchoIndex:
    index = CompactEchoIndex()
    for chunk in chunks:
        index.append(chunk)
    return index


def test_interior_whitespace_differs() -> None:
    index = index_of("Let me check   the\n\nfiles")
    assert index.probe("Let me check the files") == 0
    assert index.probe("  Let me check the files \n") == 0


def test_cut_leaves_no_trailing_whitespace() -> None:
    raw = "I think. Let me check the files."
    index = index_of(raw)
    cut = index.probe("Let me check the files.")
    assert cut == len("I think.")
    index.truncate(cut)
    assert index.text == "I think."


def test_matching_is_case_sensitive() -> None:
    index = index_of("I think. Let me check the files.")
    assert index.probe("let me check the files.") is None


def test_cjk_with_ideographic_spaces() -> None:
    head = "考えています。"
    raw = head + "\u3000次に\u3000ファイルを\u3000\u3000確認します。"
    index = index_of(head, "\u3000次に\u3000ファ", "イルを\u3000", "\u3000確認します。")
    assert index.probe("次にファイルを確認します。") == len(head)
    spaced = "次に ファイルを 確認します。"
    assert index.probe(spaced) == oracle_probe(raw, spaced) == len(head)
    assert index.probe("ファイルを確認しません。") is None


def test_echo_spanning_100k_spaces_is_found() -> None:
    head = "Thinking about it."
    index = index_of(head, " Let me", " " * 50_000, "\n" * 50_000, "check the files")
    assert index.probe("Let me check the files") == len(head)
    assert index.probe("Let me" + " " * 3 + "check the files") == len(head)


def test_blank_and_oversized_candidates_never_match() -> None:
    index = index_of("some  reasoning")
    assert index.probe("") is None
    assert index.probe(" \t\n\u3000\xa0") is None
    assert index.probe("more than some reasoning") is None
    assert CompactEchoIndex().probe("x") is None


def test_truncate_bounds_and_reuse() -> None:
    index = index_of("abc ", "def ", "ghi")
    with pytest.raises(ValueError):
        index.truncate(index.raw_length + 1)
    with pytest.raises(ValueError):
        index.truncate(-1)
    index.truncate(6)  # inside the middle chunk
    assert index.text == "abc de"
    assert index.probe("c de") == 2
    index.append("  xyz")
    assert index.text == "abc de  xyz"
    assert index.probe("dexyz") == 3
    index.truncate(0)
    assert index.text == "" and index.raw_length == 0 and index.probe("a") is None


# --- the normaliser's echo rule: no minimum, stronger evidence for short candidates ----------


def strip_result(*steps: tuple[str, str]) -> tuple[str, bool]:
    """Feed ("reasoning"|"text", chunk) steps, end the item; (the reasoning kept, trimmed?)."""
    normalizer = Normalizer("r1", "u1")
    drafts = []
    for kind, chunk in steps:
        delta = ReasoningDelta(chunk) if kind == "reasoning" else TextDelta(chunk)
        drafts += normalizer.feed(delta)
    drafts += normalizer.end_item()
    reasoning = "".join(d.data["text"] for d in drafts if d.type == ev.REASONING_DELTA)
    for d in drafts:
        if d.type == ev.REASONING_TRIMMED:
            return reasoning[: d.data["length"]], True
    return reasoning, False


@pytest.mark.parametrize(
    ("steps", "kept", "trimmed"),
    [
        # Short exact repeats at the reasoning's tail, either direction: stripped.
        (
            [("reasoning", "Everything is in place. Done."), ("text", "Done.")],
            "Everything is in place.",
            True,
        ),
        (
            [("reasoning", "Starting.\n"), ("reasoning", "On it.."), ("text", "On it..")],
            "Starting.",
            True,
        ),
        ([("text", "On it.."), ("reasoning", "I will begin. On it..")], "I will begin.", True),
        ([("reasoning", "OK"), ("text", "OK")], "", True),  # the whole reasoning repeated
        # Short folded matches without the exact repeat: both kept.
        (
            [("reasoning", "The migration is undone."), ("text", "done.")],
            "The migration is undone.",
            False,
        ),
        ([("reasoning", "Plan: Onit.."), ("text", "On it..")], "Plan: Onit..", False),
        ([("reasoning", "Then On\n it.."), ("text", "On it..")], "Then On\n it..", False),
        # From SHORT_ECHO_CHARS folded characters on, the folded match is enough.
        (
            [("reasoning", "Reading the notes.Let me   check"), ("text", "Let me check")],
            "Reading the notes.",
            True,
        ),
    ],
)
def test_short_echoes_need_an_exact_repeat_long_ones_a_folded_one(
    steps: list, kept: str, trimmed: bool
) -> None:
    assert strip_result(*steps) == (kept, trimmed)


def test_the_short_threshold_is_where_the_folded_match_starts_to_suffice() -> None:
    long_enough = "x" * SHORT_ECHO_CHARS
    short = "x" * (SHORT_ECHO_CHARS - 1)
    # Glued to the previous word (no boundary): only a long candidate is an echo.
    assert strip_result(("reasoning", "ab" + long_enough), ("text", long_enough)) == ("ab", True)
    assert strip_result(("reasoning", "ab" + short), ("text", short)) == ("ab" + short, False)
    assert strip_result(("reasoning", "ab " + short), ("text", short)) == ("ab", True)
