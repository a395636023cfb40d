"""Layer: the log. `tether.log.completion.to_completion`: a write awaited to its outcome
through a cancel, what the outcome calls for run to its end, the cancel raised after
(runs/test_cancelled_callers.py shows what it protects)."""

from __future__ import annotations

import asyncio

import pytest

from tether.log.completion import to_completion


async def slow_write(done: list[str], value: str = "written") -> str:
    await asyncio.sleep(0.1)
    done.append(value)
    return value


async def failing_write() -> str:
    await asyncio.sleep(0.05)
    raise ValueError("refused")


def test_without_a_cancel_it_is_the_write_then_what_its_outcome_calls_for() -> None:
    async def main() -> None:
        done: list[str] = []
        followed: list[str] = []
        assert await to_completion(slow_write(done), then=followed.append) == "written"
        assert followed == ["written"]
        undone: list[str] = []

        async def undo() -> None:
            undone.append("undone")

        with pytest.raises(ValueError, match="refused"):
            await to_completion(failing_write(), then=followed.append, undo=undo)
        assert undone == ["undone"] and followed == ["written"]

    asyncio.run(main())


def test_a_cancelled_caller_gets_what_success_calls_for_then_the_cancel() -> None:
    async def main() -> None:
        done: list[str] = []
        followed: list[str] = []
        task = asyncio.create_task(to_completion(slow_write(done), then=followed.append))
        await asyncio.sleep(0.02)
        task.cancel("the client went away")
        await asyncio.sleep(0.01)
        task.cancel()  # a second cancel is held back too
        with pytest.raises(asyncio.CancelledError) as raised:
            await task
        assert raised.value.args == ("the client went away",)
        assert done == ["written"] and followed == ["written"]

    asyncio.run(main())


def test_a_failed_write_runs_its_undo_whole_then_raises_the_cancel() -> None:
    async def main() -> None:
        undone: list[str] = []

        async def undo() -> None:
            await asyncio.sleep(0.05)
            undone.append("undone")

        task = asyncio.create_task(to_completion(failing_write(), undo=undo))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert undone == ["undone"]

    asyncio.run(main())


def test_a_timeout_still_reads_as_a_timeout_at_its_own_block() -> None:
    """The cancel is raised where the timeout set it, never re-armed for a later pause."""

    async def main() -> None:
        done: list[str] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await to_completion(slow_write(done))
        assert done == ["written"]
        await asyncio.sleep(0.01)  # no stray cancel after the block
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0

    asyncio.run(main())
