"""The render worker: `POST /api/render` bodies are parsed, rendered and encoded in a
separate process, and so is a session's Markdown export (whose answers are parsed to check
their escaping), so no Markdown ever runs on the event loop.

Why a process and not threads: markdown-it-py is pure Python and holds the GIL, so a render
thread still takes the loop's time (docs/security.md, "Markdown rendering", has the
figures). One worker (two on machines with more than two cores), started on first use with
`spawn` (the server has threads; `fork` would copy their locks) and at the lowest CPU
priority, so the server's own requests win the CPU. Admission is bounded: `MAX_WAITING`
requests may wait for a worker; more get 503 `render_busy`. Each request's work is bounded by
the caps in http/markdown.py, an export's by those in sessions/transfer/exporter.py.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tether.http import markdown

log = logging.getLogger("tether.http")

MAX_WAITING = 8


class RenderQueueFull(Exception):
    """Too many render requests are waiting for the worker."""


class RenderFailed(Exception):
    """The worker died (killed, out of memory); the next request starts a new one."""


def _lower_priority() -> None:
    os.nice(19)


class RenderPool:
    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or (2 if (os.cpu_count() or 1) > 2 else 1)
        self._executor: ProcessPoolExecutor | None = None
        self._admitted = 0

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_lower_priority,
            )
        return self._executor

    async def render(self, raw: bytes) -> tuple[str, Any]:
        """`markdown.render_request(raw)`, in the worker."""
        result: tuple[str, Any] = await self.run(markdown.render_request, raw)
        return result

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in the worker: `fn` a module-level function, its arguments and result
        things that pickle."""
        if self._admitted >= self.workers + MAX_WAITING:
            raise RenderQueueFull
        self._admitted += 1
        try:
            pool = self._pool()
            return await asyncio.wrap_future(pool.submit(fn, *args))
        except BrokenProcessPool as exc:
            log.error("the render worker died: %s", exc)
            self._executor = None
            raise RenderFailed from exc
        finally:
            self._admitted -= 1

    def close(self) -> None:
        """Cancel what waits; a render in progress ends within its budget."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
