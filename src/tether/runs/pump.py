"""The worker's pump: runtime events from the run's inbox into the log, in order.

Stop, shutdown and the runtime's own end are signals in the same inbox, so output received
before a Stop is always logged before the terminal event. Deltas that arrive while an append
is in flight, or within one coalescing window of the last flush's start, become one event per
item; an idle stream is flushed at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tether.ingest.normalizer import Normalizer, coalesce
from tether.log import Draft
from tether.runs.registry import CANCELLING, Run
from tether.runtimes.base import ProviderError, ReasoningDelta, TextDelta

SHUTDOWN_REASON = "the server was shut down while this run was active"
LEASE_LOST_REASON = "this server could not reach the database for a while and let go of the run"


@dataclass(frozen=True)
class Signal:
    kind: str  # "end" | "stop" | "shutdown" | "lease_lost" | "error"
    error: ProviderError | None = None


END, STOP, SHUTDOWN = Signal("end"), Signal("stop"), Signal("shutdown")
LEASE_LOST = Signal("lease_lost")  # runs/leases.py: maintenance, not the user's Stop


async def pump(
    run: Run,
    normalizer: Normalizer,
    append: Callable[[list[Draft]], Awaitable[object]],
    coalesce_seconds: float,
) -> Signal:
    """Move runtime events into the log until a signal ends the run."""
    inbox = run.inbox
    last_flush = 0.0
    while True:
        items = [await inbox.get()]
        while not inbox.empty():
            items.append(inbox.get_nowait())
        wait = last_flush + coalesce_seconds - time.monotonic()
        if wait > 0 and all(isinstance(i, ReasoningDelta | TextDelta) for i in items):
            try:  # gather deltas for at most one coalescing window (not wait_for: on Python
                async with asyncio.timeout(wait):  # 3.11 it can swallow a cancel)
                    items.append(await inbox.get())
                while not inbox.empty():
                    items.append(inbox.get_nowait())
            except TimeoutError:
                pass
        drafts: list[Draft] = []
        signal = None
        for item in items:
            if isinstance(item, Signal):
                signal = item
                break
            drafts.extend(normalizer.feed(item))
        if drafts:
            # The window runs from the flush's start: what arrives during a slow append is
            # merged anyway, and timing it from the append's end would hold the next delta
            # back by the append's own duration (bench/README.md, pg_replicas).
            last_flush = time.monotonic()
            await append(coalesce(drafts))
        if signal is None and normalizer.finished is not None:
            signal = END
        if signal is not None:
            return signal


def outcome(run: Run, signal: Signal, normalizer: Normalizer) -> tuple[str, dict[str, Any]]:
    """The run's terminal state. Called with no await before it is acted on: from here a Stop
    changes nothing (`run.resolved`)."""
    run.resolved = True
    if signal is SHUTDOWN:
        return "interrupted", {"reason": SHUTDOWN_REASON, "maintenance": True}
    if signal is LEASE_LOST:
        return "interrupted", {"reason": LEASE_LOST_REASON, "maintenance": True}
    if run.phase == CANCELLING or signal is STOP:
        return "cancelled", {}
    if signal.kind == "error" and signal.error is not None:
        return "error", {"error": {"code": signal.error.code, "message": signal.error.message}}
    if normalizer.finished is not None:
        return normalizer.finished.state, {"reason": normalizer.finished.reason}
    return "completed", {}
