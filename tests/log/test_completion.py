"""Layer: the log. `tether.log.completion.to_completion`: a write awaited to its outcome
through a cancel, the cancel delivered after (runs/test_cancelled_callers.py shows what it
protects)."""

from __future__ import annotations

import asyncio

import pytest

from tether.log.completion import to_completion


async def slow_write(done: list[str], value: str = "written") -> str:
    await asyncio.sleep(0.1)
    done.append(value)
    return value


def test_a_cancelled_caller_gets_the_outcome_then_the_cancel_at_its_next_pause() -> None:
    async def main() -> None:
        done: list[str] = []
        after: list[str] = []

        async def caller() -> None:
            result = await to_completion(slow_write(done))
            after.append(result)  # what the outcome calls for runs before the cancel
            await asyncio.sleep(10)  # the next pause: the cancel lands here
            after.append("never")

        task = asyncio.create_task(caller())
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.sleep(0.01)
        task.cancel()  # a second cancel is held back too
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done == ["written"] and after == ["written"]

    asyncio.run(main())


def test_a_timeout_still_reads_as_a_timeout() -> None:
    async def main() -> None:
        done: list[str] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await to_completion(slow_write(done))
                await asyncio.sleep(10)
        assert done == ["written"]

    asyncio.run(main())


def test_a_failed_write_raises_the_cancel_and_the_undo_runs_whole() -> None:
    async def failing() -> None:
        await asyncio.sleep(0.05)
        raise ValueError("refused")

    async def main() -> None:
        undone: list[str] = []

        async def caller() -> None:
            try:
                await to_completion(failing())
            except BaseException:
                await asyncio.sleep(0.01)  # an undo that pauses is not cut short
                undone.append("undo")
                raise

        task = asyncio.create_task(caller())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert undone == ["undo"]

    asyncio.run(main())
