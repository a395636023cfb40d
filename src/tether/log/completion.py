"""A write to the log awaited to its outcome through a cancel. What a write's outcome calls
for (start the run's worker; or undo its registration and release the new bytes) must not be
split from it, and a client going away or a shutdown cancels the task awaiting the write,
which the writer may commit all the same. With `to_completion` the log never holds a turn
nobody works, nor an event whose bytes were released while it was being committed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_completion(write: Awaitable[T]) -> T:
    """Await `write` to its outcome even when the caller is cancelled meanwhile. A write that
    succeeded returns its result as if nothing happened, and the cancel is delivered again
    at the caller's next pause, so what the success calls for runs first and the caller
    still stops; one that failed raises the cancel now, so the caller's undo runs with no
    cancel pending to cut it short."""
    task = asyncio.ensure_future(write)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        caller = asyncio.current_task()
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        if task.cancelled() or task.exception() is not None:
            raise
        if caller is not None:  # one cancel still pending, as asyncio.timeout counts them
            caller.uncancel()
            caller.cancel()
        return task.result()
