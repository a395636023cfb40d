"""The runtime reads the provider's SSE body by raw reads under one idle deadline
(`openai_stream.sse_lines`): lines must come out whole whatever the read boundaries, and a
provider that sends nothing for the idle timeout still ends the stream. After `[DONE]` it
reads the body's end, so the next request reuses the connection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.runtimes.base import TextDelta, TurnInput
from tether.runtimes.openai import OpenAIRuntime
from tether.runtimes.openai_stream import sse_lines
from tether.settings import Settings

from fake_openai import FakeOpenAI, hang, raw, reply, text


async def _reads(parts: list[bytes], pause: float = 0.0) -> AsyncIterator[bytes]:
    for part in parts:
        if pause:
            await asyncio.sleep(pause)
        yield part


def _lines(parts: list[bytes], idle: float = 5.0, pause: float = 0.0) -> list[str]:
    async def main() -> list[str]:
        return [line async for line in sse_lines(_reads(parts, pause), idle)]

    return asyncio.run(main())


BODY = 'data: {"a":"é😀"}\r\n\r\ndata: [DONE]\n\n: ping\rdata: x'.encode()


def test_lines_come_out_whole_at_every_read_boundary() -> None:
    whole = [line for line in _lines([BODY]) if line]
    assert whole == ['data: {"a":"é😀"}', "data: [DONE]", ": ping", "data: x"]
    for cut in range(1, len(BODY)):  # inside a CRLF, inside a multi-byte character, ...
        got = _lines([BODY[:cut], BODY[cut:]])
        assert [line for line in got if line] == whole, cut
    one_byte_reads = _lines([BODY[i : i + 1] for i in range(len(BODY))])
    assert [line for line in one_byte_reads if line] == whole


def test_the_idle_timeout_counts_from_the_last_byte() -> None:
    # bytes keep coming (every 50 ms, idle 0.2 s) but no line ends for 0.5 s: not a stall
    parts = [b"data: ", b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"\n"]
    assert _lines(parts, idle=0.2, pause=0.05) == ["data: abcdefghi"]
    with pytest.raises(TimeoutError):
        _lines([b"data: a\n", b"data: b\n"], idle=0.05, pause=0.2)


def test_a_fast_stream_of_many_lines_per_read_arrives_whole(tmp_path: Path) -> None:
    words = [f"é{k}😀 " for k in range(2000)]
    with FakeOpenAI() as fake:
        fake.script(reply(*(text(w) for w in words)))
        settings = Settings(
            runtime="openai", base_url=fake.base_url, model="fake-model", data_dir=tmp_path / "d"
        )
        runtime = OpenAIRuntime(settings)

        async def main() -> str:
            try:
                turn = TurnInput("s1", "st1", "t1", [{"role": "user", "content": "hi"}])
                return "".join(
                    [e.text async for e in runtime.stream(turn) if isinstance(e, TextDelta)]
                )
            finally:
                await runtime.aclose()

        assert asyncio.run(main()) == "".join(words)


def _turns(runtime: OpenAIRuntime, count: int) -> list[str]:
    async def main() -> list[str]:
        texts = []
        try:
            for _ in range(count):
                turn = TurnInput("s1", "st1", "t1", [{"role": "user", "content": "hi"}])
                texts.append(
                    "".join(
                        [e.text async for e in runtime.stream(turn) if isinstance(e, TextDelta)]
                    )
                )
        finally:
            await runtime.aclose()
        return texts

    return asyncio.run(main())


def _runtime(fake: FakeOpenAI, tmp_path: Path) -> OpenAIRuntime:
    return OpenAIRuntime(
        Settings(
            runtime="openai", base_url=fake.base_url, model="fake-model", data_dir=tmp_path / "d"
        )
    )


def test_turns_reuse_one_connection_to_the_model(tmp_path: Path) -> None:
    # The runtime used to close each response at [DONE], before the body's end, which cost
    # the connection: every turn opened a new one (with a remote provider, a TLS handshake).
    with FakeOpenAI() as fake:
        fake.script(reply(text("a")), reply(text("b")), reply(text("c")))
        assert _turns(_runtime(fake, tmp_path), 3) == ["a", "b", "c"]
        peers = fake.request_peers
        assert len(peers) == 3 and None not in peers
        assert len(set(peers)) == 1, peers


def test_a_body_kept_open_after_done_still_ends_the_turn_at_once(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        fake.script(reply(text("a"), raw("[DONE]"), hang()), reply(text("b")))
        started = time.monotonic()
        assert _turns(_runtime(fake, tmp_path), 2) == ["a", "b"]
        assert time.monotonic() - started < 5.0  # the drain is bounded (0.1 s)
        assert fake.wait_disconnects(1), "the open response was cut"
        peers = fake.request_peers
        assert len(set(peers)) == 2, "a cut connection is not reused"


def _seconds_to_split(megabytes: int) -> float:
    """The time `sse_lines` takes over one line of `megabytes` arriving in 64 KiB reads."""
    size = 65536
    count = megabytes * 1_000_000 // size
    parts = [b"data: "] + [b"x" * size] * count + [b"\n", b"data: [DONE]\n"]
    started = time.perf_counter()
    got = _lines(parts)
    elapsed = time.perf_counter() - started
    assert [len(line) for line in got] == [6 + size * count, 12]
    return elapsed


def test_a_huge_line_costs_time_in_proportion_to_its_size() -> None:
    # A multi-megabyte chunk (an image sent as a data URL, a huge tool argument) arrives in
    # many reads. Each read used to join and split the whole line so far, so ten times the
    # size cost a hundred times the time (20 MB took 5 s of the server's event loop); joined
    # once, it costs about ten times. A ratio, measured in this run, not a time.
    small = min(_seconds_to_split(3) for _ in range(3))
    large = min(_seconds_to_split(30) for _ in range(2))
    assert large < 30 * small, (small, large)
