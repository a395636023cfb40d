"""The import's child process (`sessions/transfer/worker.py`) stays out of the server's way."""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.errors import ImportInvalid
from tether.runs import maintenance
from tether.services import build_services
from tether.sessions.transfer import worker
from tether.settings import Settings

from chatgpt_kit import many


async def upload(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def test_the_child_gets_the_lowest_cpu_priority_from_the_server_at_once() -> None:
    """The child lowers its own priority only once its interpreter has started and imported
    the server's modules, a few hundred ms of CPU at the server's priority; the server sets
    it as soon as the child exists."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        worker.lowest_priority(child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
    finally:
        child.kill()
        child.wait()
    worker.lowest_priority(child.pid)  # a child already gone is no error
    worker.lowest_priority(None)  # nor one that never started


def test_the_file_reaches_the_child_in_the_chunks_it_came_in_and_is_planned_whole() -> None:
    """The server hands the request's chunks over as they came (joining 15 MiB on the loop
    held it for up to 20 ms); the child joins them, an empty chunk ending the file."""
    raw = json.dumps(many(3, turns=2)).encode()
    chunks = [raw[i : i + 1000] for i in range(0, len(raw), 1000)]
    chunks.insert(2, b"")  # an empty chunk from the request is not the end of the file
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=worker.child_main, args=(theirs,), daemon=True)
    child.start()
    theirs.close()
    try:
        worker.send_file(ours, chunks)
        plans: list = []
        while (message := ours.recv())[0] != "done":
            assert message[0] in ("progress", "plans"), message
            if message[0] == "plans":
                plans.extend(message[1])
    finally:
        child.join(30)
    assert len(chunks) > 3
    assert [len(plan.drafts) > 1 for plan in plans] == [True, True, True]


def test_a_finished_import_leaves_its_survivors_frozen_and_a_failed_one_collectable(
    tmp_path: Path,
) -> None:
    """The collector pauses for an import; when it resumes it would walk everything the
    import left alive at once (15-18 ms on the loop, nothing to collect), so a finished
    import freezes them first. A failed one does not: its traceback holds the plans."""
    assert gc.isenabled()

    async def main() -> None:
        settings = Settings(data_dir=tmp_path / "data")
        services = build_services(settings)
        importer = services.importer
        try:
            frozen = gc.get_freeze_count()
            raw = json.dumps(many(3, turns=2)).encode()
            status, body = await importer.run(upload(raw), importer.jobs.open(None))
            assert (status, json.loads(body)["created"]) == (201, 3)
            assert gc.isenabled() and gc.get_freeze_count() > frozen
            frozen = gc.get_freeze_count()
            many_more = many(50, turns=2, start=1_700_000_000.0)
            last = many_more[-1]["mapping"].values()
            user = next(
                n for n in last if n["message"] and n["message"]["author"]["role"] == "user"
            )
            user["message"]["content"]["parts"] = ["\ud800"]  # planned, then refused by the log
            raw = json.dumps(many_more).encode()
            with pytest.raises(ImportInvalid):
                await importer.run(upload(raw), importer.jobs.open(None))
            assert gc.isenabled() and gc.get_freeze_count() <= frozen
        finally:
            await maintenance.shutdown(services.engine, grace=1)
            await services.store.aclose()
            gc.unfreeze()

    asyncio.run(main())
