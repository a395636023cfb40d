"""Runs that need settling without a worker: the reclaimer, start-up recovery, shutdown.
All of it is maintenance (contract invariant 4): it appends ordinary events and never moves a
session's `updated_at`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from tether import events as ev
from tether.log import Draft, SessionNotFound, StorageError, StreamClosed
from tether.log.store import OpenStream
from tether.runs.engine import RunEngine
from tether.runs.pump import SHUTDOWN
from tether.runs.registry import CANCELLING, Run

log = logging.getLogger("tether.runs")

RECOVERED_REASON = "Tether stopped before this run finished"
SHUTDOWN_GRACE_SECONDS = 5.0  # for the workers to record their runs' ends at shutdown


def reclaim(engine: RunEngine, window: float, now: float | None = None) -> list[Run]:
    """Free cancelling runs older than `window` (from the cancel) whose channel is closed:
    both conditions, never age alone (contract invariant 9)."""
    now = time.time() if now is None else now
    freed = []
    for run in engine.registry.runs():
        if (
            run.phase == CANCELLING
            and not run.channel_open
            and run.cancelled_at is not None
            and now - run.cancelled_at >= window
        ):
            engine.registry.remove(run)
            freed.append(run)
    return freed


async def reclaim_forever(engine: RunEngine, window: float) -> None:
    while True:
        await asyncio.sleep(min(max(window / 4, 0.05), 5.0))
        for run in reclaim(engine, window):
            log.warning(
                "reclaimed run %s: its worker did not unwind within %.1f s", run.stream_id, window
            )


async def recover(engine: RunEngine, *, mine: bool = False) -> int:
    """Settle every run the log shows open without a live worker, as interrupted. Its turn
    and partial output stay visible and in the model context (invariant 1). On a log shared
    by several replicas only the runs nobody live owns (log/pg_leases.py): those of replicas
    whose lease expired, those without an owner, and with `mine` (shutdown) this replica's;
    never a live replica's run."""
    if engine.shared is not None:
        unfinished = await engine.shared.claim_orphans(mine=mine, strays=True)
    else:
        unfinished = await engine.store.unfinished_streams()
    return await settle(engine, unfinished)


async def settle(engine: RunEngine, unfinished: list[OpenStream]) -> int:
    """Record each stream interrupted (maintenance), unless a live worker here runs it."""
    settled = 0
    for session_id, stream_id, turn_id in unfinished:
        if engine.registry.get(stream_id) is not None:
            continue  # a live worker owns it
        with contextlib.suppress(StreamClosed, SessionNotFound):
            await engine.store.append(
                session_id,
                [
                    Draft(
                        ev.RUN_FINISHED,
                        {
                            "stream_id": stream_id,
                            "turn_id": turn_id,
                            "state": "interrupted",
                            "reason": RECOVERED_REASON,
                            "maintenance": True,
                        },
                        stream_id=stream_id,
                        turn_id=turn_id,
                    )
                ],
            )
            settled += 1
    return settled


async def shutdown(engine: RunEngine, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
    """Make every in-flight run durable as interrupted before the process exits."""
    engine.closing = True
    runs = engine.registry.runs()
    for run in runs:
        if not run.resolved:
            run.inbox.put_nowait(SHUTDOWN)
        if run.producer is not None:
            run.producer.cancel()
    workers = [r.worker for r in runs if r.worker is not None and not r.worker.done()]
    if workers:
        await asyncio.wait(workers, timeout=grace)
    for run in engine.registry.runs():
        engine.registry.remove(run)  # wedged: the process is leaving anyway
    try:
        await recover(engine, mine=True)
    except StorageError as exc:
        log.error("could not record interrupted runs at shutdown: %s", exc)
