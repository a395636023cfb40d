"""The same file imported through two replicas at once (layer: sessions/transfer, the
idempotent import of docs/api.md §12, on a PostgreSQL log several replicas share). Two
servers' services as the app builds them, each with its own connection pool, on one real
database; replica A's import is held between its look for what is there and its write until
replica B's import has written or waits for A."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg import database

from tether.runs import maintenance
from tether.services import Services, build_services
from tether.settings import Settings

from chatgpt_kit import many

pytestmark = pytest.mark.slow


async def upload(raw: bytes) -> AsyncIterator[bytes]:
    yield raw


async def _waits_for_a_lock(url: str) -> None:
    """Until a backend of the database waits for a lock (B's import, behind A's)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        while True:
            cur = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.02)


def test_the_same_file_imported_through_two_replicas_at_once_is_created_once(
    tmp_path: Path,
) -> None:
    """Layer: sessions/transfer/importer; contract invariant 5 as docs/invariants.md maps it
    (what enters the log again is never duplicated): an import is idempotent (the same file
    again creates nothing, 200), across replicas too. Each replica looked for the file's
    sessions in the log, found none, and created them: two copies of every conversation,
    both 201. Now the look and the write are one replica's at a time, decided by the
    database (an advisory lock on the import): the second import finds the first one's
    sessions, 200 with `existing`, and nothing is made twice."""
    gc_was_enabled = gc.isenabled()

    async def main(url: str) -> None:
        replicas: list[Services] = [
            build_services(Settings(data_dir=tmp_path / name, database_url=url))
            for name in ("a", "b")
        ]
        a, b = replicas
        raw = json.dumps(many(2, turns=1)).encode()
        try:
            b_import: asyncio.Future | None = None  # started while A holds its write
            real_create = a.store.create_sessions

            async def create_sessions(*args: Any, **kwargs: Any) -> Any:
                nonlocal b_import
                b_import = asyncio.ensure_future(
                    b.importer.run(upload(raw), b.importer.jobs.open(None))
                )
                waiting = asyncio.ensure_future(_waits_for_a_lock(url))
                await asyncio.wait([b_import, waiting], return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                return await real_create(*args, **kwargs)

            a.store.create_sessions = create_sessions  # type: ignore[method-assign]
            status_a, body_a = await a.importer.run(upload(raw), a.importer.jobs.open(None))
            assert b_import is not None
            status_b, body_b = await b_import
            assert sorted([status_a, status_b]) == [200, 201]
            bodies = {status_a: json.loads(body_a), status_b: json.loads(body_b)}
            assert (bodies[201]["created"], bodies[200]["created"]) == (2, 0)
            assert bodies[200]["existing"] == 2
            states = await b.store.index_states()
            keys = [s["import_key"] for s in states.values()]
            assert len(keys) == 2 and len(set(keys)) == 2, keys
            assert sorted(s["session_id"] for s in bodies[200]["sessions"]) == sorted(states)
        finally:
            for services in replicas:
                await maintenance.shutdown(services.engine, grace=1)
                await services.store.aclose()
                await services.aclose_shared()

    try:
        with database() as url:
            asyncio.run(main(url))
    finally:
        gc.unfreeze()
        if gc_was_enabled:
            gc.enable()
