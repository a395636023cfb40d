"""A write to the log awaited to its outcome through a cancel. What a write's outcome calls
for (start the run's worker; or undo its registration and release the new bytes) must not be
split from it, and a client going away or a shutdown cancels the task awaiting the write,
which the writer may commit all the same. With `to_completion` the log never holds a turn
nobody works, nor an event whose bytes were released while it was being committed.

The cancel is never re-armed: it is raised once what the outcome calls for is done, so
`asyncio.timeout` and task groups count it as they count any other. One thing it cannot
cover: the loop's own teardown (`asyncio.run` ending) cancels the write's task itself; the
write is then treated as failed although a writer thread may still commit it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def _through_cancels(task: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait for `task` whatever cancels its waiter meanwhile (asyncio.wait never cancels
    what it waits for); return the first such cancel."""
    cancel = None
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError as exc:
            cancel = cancel or exc
    return cancel


async def to_completion(
    write: Awaitable[T],
    *,
    then: Callable[[T], None] | None = None,
    undo: Callable[[], Awaitable[None]] | None = None,
) -> T:
    """Await `write`. When it succeeds, call `then(result)` (synchronous, so nothing can
    come between the commit and it) and return the result; when it fails, await `undo()`
    and raise the write's error. Both happen even when the caller is cancelled meanwhile,
    and the cancel is raised after them, in place of the result or the error. A follow-up
    that must pause belongs in `write` itself (one coroutine, run to its end)."""
    task = asyncio.ensure_future(write)
    cancel = await _through_cancels(task)
    if task.cancelled() or task.exception() is not None:
        if undo is not None:
            undoing = asyncio.ensure_future(undo())
            cancel = await _through_cancels(undoing) or cancel
            undone = undoing.cancelled() or undoing.exception() is None  # retrieved either way
            if not undone and cancel is None:
                undoing.result()  # an undo that failed says so
    elif then is not None:
        then(task.result())
    if cancel is not None:
        raise cancel
    return task.result()
