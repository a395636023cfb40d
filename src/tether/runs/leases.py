"""This replica's lease and the takeover of dead replicas' runs, on a log shared by several
replicas (log/pg_leases.py, docs/operations.md "Several replicas"). Maintenance (contract
invariant 4): a taken-over run is recorded `interrupted` with `maintenance: true`, as start-up
recovery records it.

Every RENEW_SECONDS the replica renews its lease and claims the runs whose owner's lease has
expired (at most LEASE_SECONDS + RENEW_SECONDS after the owner's last renewal, well within
30 s). A replica that has not renewed its lease for LEASE_SECONDS (the database unreachable,
the process paused) stops its own runs: another replica may have taken them over, and the
log refuses their appends anyway (RunTakenOver)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tether.log import StorageError
from tether.log.pg_leases import LEASE_SECONDS, RENEW_SECONDS
from tether.runs.controls import stop_locally
from tether.runs.engine import RunEngine
from tether.runs.maintenance import settle
from tether.runs.pump import LEASE_LOST
from tether.runs.registry import RUNNING, STARTING

log = logging.getLogger("tether.runs")


async def lease_forever(engine: RunEngine, clock: Callable[[], float] = time.monotonic) -> None:
    """Renew the lease every RENEW_SECONDS (on the lease's own connection, log/pg_leases.py)
    and, after a renewal, take over dead replicas' runs in a task of its own: the takeover
    reads and writes through the log's pool, and waiting for it must never delay the next
    renewal (a busy pool would cost this replica its lease)."""
    shared = engine.shared
    assert shared is not None
    renewed = clock()
    takeover: asyncio.Task | None = None
    try:
        while True:
            await asyncio.sleep(RENEW_SECONDS)
            if clock() - renewed >= LEASE_SECONDS:
                stop_own_runs(engine)
            try:
                await shared.renew_lease()
                renewed = clock()
            except StorageError as exc:
                log.error("could not renew this replica's lease: %s", exc)
                continue
            if takeover is None or takeover.done():
                takeover = asyncio.create_task(take_over(engine))
    finally:
        if takeover is not None:
            takeover.cancel()


async def take_over(engine: RunEngine) -> None:
    """Claim and settle the runs of replicas whose lease expired. A run whose settling fails
    is claimed again next round (log/pg_leases.py)."""
    assert engine.shared is not None
    try:
        taken = await engine.shared.claim_orphans()
        if taken:
            count = await settle(engine, taken)
            log.warning("took over %d run(s) of replicas whose lease expired", count)
    except StorageError as exc:
        log.error("could not take over the runs of replicas whose lease expired: %s", exc)


def stop_own_runs(engine: RunEngine) -> None:
    """The lease is lost: stop every run this replica runs. Their end is fenced if another
    replica took them over; if none did, it is `interrupted` by maintenance, never the
    `cancelled` of a Stop nobody made."""
    for run in engine.registry.runs():
        if not run.resolved and run.phase in (STARTING, RUNNING):
            log.warning("stopping run %s: this replica's lease expired", run.stream_id)
            stop_locally(engine.registry, run, LEASE_LOST)
