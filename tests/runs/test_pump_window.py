"""The pump's coalescing window (layer: the runs' pump; contract invariant 3, order kept, and
the live-stream promise that a delta reaches followers as soon as it is durable): deltas
within one window of the last flush's start are merged into one append per item, what arrives
while an append is in flight goes into the next one, and a delta arriving a window or more
after the last flush began is appended at once, however long that flush's durable write took
(timed from the write's end, a slow write held every next delta back by its own duration)."""

from __future__ import annotations

import asyncio
import time

from tether.ingest.normalizer import Normalizer
from tether.log import Draft
from tether.runs.pump import END, pump
from tether.runs.registry import Run
from tether.runtimes.base import TextDelta

WINDOW = 0.4  # long, so that a loaded machine's scheduling delays stay well inside the margins


class SlowLog:
    """An append that takes `seconds` to become durable, noting when each one was called."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls: list[tuple[float, list[str]]] = []

    async def append(self, drafts: list[Draft]) -> None:
        self.calls.append((time.monotonic(), [d.data.get("text", "") for d in drafts]))
        await asyncio.sleep(self.seconds)


async def run_pump(log: SlowLog, feed) -> None:  # noqa: ANN001 - the scenario's coroutine
    run = Run("s_1", "r_1", "u_1")
    worker = asyncio.get_running_loop().create_task(
        pump(run, Normalizer("r_1", "u_1"), log.append, coalesce_seconds=WINDOW)
    )
    await feed(run)
    run.inbox.put_nowait(END)
    assert await asyncio.wait_for(worker, 10) is END


def test_a_delta_a_window_after_a_slow_flush_began_is_appended_at_once() -> None:
    log = SlowLog(seconds=0.6)  # longer than the window
    sent: list[float] = []

    async def feed(run: Run) -> None:
        for text in ("one", "two"):
            sent.append(time.monotonic())
            run.inbox.put_nowait(TextDelta(text))
            await asyncio.sleep(0.7)  # after the append returned, one window and more later

    asyncio.run(run_pump(log, feed))
    assert [texts for _, texts in log.calls] == [["one"], ["two"]]
    # timed from the append's end, "two" waited 0.6 + 0.4 - 0.7 = 0.3 s more
    assert log.calls[1][0] - sent[1] < 0.15


def test_deltas_within_the_window_and_during_an_append_are_merged() -> None:
    log = SlowLog(seconds=0.1)

    async def feed(run: Run) -> None:
        run.inbox.put_nowait(TextDelta("a"))  # an idle stream: flushed at once
        await asyncio.sleep(0.05)  # during its append
        run.inbox.put_nowait(TextDelta("b"))
        await asyncio.sleep(0.1)  # the append is done, the window still open
        sent.append(time.monotonic())
        run.inbox.put_nowait(TextDelta("c"))
        await asyncio.sleep(0.5)

    sent: list[float] = []
    asyncio.run(run_pump(log, feed))
    assert [texts for _, texts in log.calls] == [["a"], ["bc"]]
    # "b" waited in the window until "c" came, and went with it at once (not 0.25 s later,
    # at the window's end)
    assert log.calls[1][0] - sent[0] < 0.15
