"""A wait that is woken in the same moment its task is cancelled must end in the cancel.

`asyncio.wait_for` on Python 3.11 returns the finished wait instead (the cancel is lost), so a
cancelled task went on: an SSE stream whose client left, a fan-out worker `aclose` waits for
(it hung bench/pg_append.py), a run's pump Stop cancels. Layers (contract invariant 8): the
log's subscriptions (a closed stream publishes nothing more) and the runs' pump (Stop ends a
run, invariant 2 of the cancellation rules: a Stop is never lost). Each waits with
`asyncio.timeout` now; these tests fail with `wait_for` on 3.11."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tether.events import Event
from tether.ingest.normalizer import Normalizer
from tether.log import Hub
from tether.runs.pump import pump
from tether.runs.registry import Run
from tether.runtimes.base import TextDelta


async def cancelled_as_woken(
    wait: Callable[[], Awaitable[object]], wake: Callable[[], None]
) -> None:
    for _ in range(3):
        task = asyncio.get_running_loop().create_task(wait())
        await asyncio.sleep(0.05)  # asleep, waiting
        wake()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 2)


def test_a_subscription_cancelled_as_an_event_arrives_is_cancelled() -> None:
    async def main() -> None:
        hub = Hub(asyncio.get_running_loop())
        sub = hub.subscribe("s_1")
        seq = iter(range(1, 100))

        async def waiting() -> list[Event]:
            sub.take()  # what the last round published: this wait starts empty
            return await sub.next_batch(30.0)

        await cancelled_as_woken(
            waiting,
            # what `publish` schedules on the loop, run here in the same tick as the cancel
            lambda: hub._dispatch([Event("s_1", next(seq), "text.delta", 0.0, {}, "r_1", "u_1")]),
        )

    asyncio.run(main())


def test_a_pump_cancelled_as_a_delta_arrives_in_its_coalescing_window_is_cancelled() -> None:
    async def main() -> None:
        run = Run("s_1", "r_1", "u_1")
        appended: list[list] = []

        async def append(drafts: list) -> None:
            appended.append(drafts)

        for _ in range(3):
            worker = asyncio.get_running_loop().create_task(
                pump(run, Normalizer("r_1", "u_1"), append, coalesce_seconds=30.0)
            )
            run.inbox.put_nowait(TextDelta("first"))  # flushed at once
            await asyncio.sleep(0.05)
            run.inbox.put_nowait(TextDelta("second"))  # within the window: it waits for more
            await asyncio.sleep(0.05)
            run.inbox.put_nowait(TextDelta("third"))
            worker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(worker, 2)
            while not run.inbox.empty():
                run.inbox.get_nowait()

    asyncio.run(main())
