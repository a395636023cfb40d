"""Layers: run journal, worker lifecycle registry, the run's steer inbox and the attachment
store (contract invariant 8 names them).

A caller of `RunEngine.start`, `QueueService.add`, `RunControls.steer`, `RunControls.cancel`
or `SessionService.delete` can be cancelled while its append waits for the writer: the client
went away, or the server is stopping. The append may still commit, so what follows it must
follow its outcome, not the cancel. Before, a start whose caller was cancelled there left a
committed turn that no worker ran (the session open until a restart recovered it) and
removed its upload's bytes while the turn holding them was being committed; a queued
message's bytes went the same way, and a deletion's bytes stayed on disk for good. A steer
is handed to its run (or given back) once its `steer.accepted` is committed, whoever stopped
waiting for it; a Stop, which stops its run at once, is recorded all the same.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tether.runs.intake import Upload
from tether.settings import Settings

from engine_harness import GatedRuntime, StatefulGatedRuntime, harness, until, writes_held

UPLOAD = Upload("notes.txt", "text/plain", b"the bytes a turn holds")


def stored_files(settings: Settings) -> int:
    return sum(1 for p in (settings.data_dir / "attachments").rglob("*") if p.is_file())


@pytest.mark.parametrize("runtime_class", [GatedRuntime, StatefulGatedRuntime])
def test_a_start_cancelled_during_its_append_still_runs_the_committed_turn(
    tmp_path: Path, runtime_class: type[GatedRuntime]
) -> None:
    async def main() -> None:
        runtime = runtime_class()
        runtime.gate.set()
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            with writes_held(settings):
                start = asyncio.create_task(h.engine.start(sid, "hi", [UPLOAD]))
                await until(lambda: h.registry.busy(sid))
                await asyncio.sleep(0.2)  # its append waits in the writer
                start.cancel()
                await asyncio.sleep(0.05)
                assert not start.done()  # it waits for the append's outcome
            with pytest.raises(asyncio.CancelledError):
                await start
            await h.wait_idle(sid)
            events = await h.store.read(sid)
            assert [e.type for e in events if e.stream_id] == [
                "turn.submitted",
                "run.started",
                "text.delta",
                "run.finished",
            ]
            assert events[-1].data["state"] == "completed"
            assert runtime.calls == 1
            ref = next(e for e in events if e.type == "turn.submitted").data["attachments"][0]
            stored = await h.store.attachment(ref["id"], sid)
            assert stored is not None
            path = await h.sessions.attachments.path(stored["blob"])
            assert path is not None and path.read_bytes() == UPLOAD.data

    asyncio.run(main())


def test_a_queued_message_cancelled_during_its_append_keeps_its_bytes(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = GatedRuntime()  # the gate stays shut: the first run keeps the session busy
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            await h.engine.start(sid, "first")
            await until(lambda: runtime.calls == 1)
            with writes_held(settings):
                add = asyncio.create_task(h.queue.add(sid, "next", [UPLOAD]))
                await until(lambda: stored_files(settings) == 1)  # its append comes next
                await asyncio.sleep(0.2)
                add.cancel()
                await asyncio.sleep(0.05)
            with pytest.raises(asyncio.CancelledError):
                await add
            fold = await h.sessions.folds.get(sid)
            (item,) = fold.transcript.queued.values()
            stored = await h.store.attachment(item["attachments"][0]["id"], sid)
            assert stored is not None
            path = await h.sessions.attachments.path(stored["blob"])
            assert path is not None and path.read_bytes() == UPLOAD.data
            runtime.gate.set()

    asyncio.run(main())


def test_a_delete_cancelled_during_its_commit_still_removes_the_sessions_bytes(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        runtime = GatedRuntime()
        runtime.gate.set()
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            await h.engine.start(sid, "keep this file", [UPLOAD])
            await h.wait_idle(sid)
            assert stored_files(settings) == 1
            with writes_held(settings):
                delete = asyncio.create_task(h.sessions.delete(sid))
                await asyncio.sleep(0.3)  # its deletion waits in the writer
                delete.cancel()
                await asyncio.sleep(0.05)
            with pytest.raises(asyncio.CancelledError):
                await delete
            assert await h.store.last_seq(sid) is None
            assert stored_files(settings) == 0  # before, the bytes stayed on disk for good

    asyncio.run(main())


def test_a_steer_cancelled_as_its_append_commits_still_reaches_its_run(tmp_path: Path) -> None:
    """Once `steer.accepted` commits, the run holds the steer: it is taken, or given back as
    `steer.leftover` when the run ends. The caller here is cancelled the moment the commit is
    published (after the controls saw it as their own): a hand-over skipped by that cancel
    left a steer the log calls accepted that neither the agent nor the composer got back."""

    async def main() -> None:
        runtime = GatedRuntime()  # never drains steers: what it holds comes back as leftover
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            stream_id = (await h.engine.start(sid, "first"))["stream_id"]
            await until(lambda: runtime.calls == 1)
            steer: asyncio.Task | None = None

            def cancel_on_commit(events: list) -> None:
                if steer is not None and any(e.type == "steer.accepted" for e in events):
                    steer.cancel()

            h.hub.on_batch(cancel_on_commit)
            steer = asyncio.create_task(h.controls.steer(stream_id, "mention the budget"))
            with pytest.raises(asyncio.CancelledError):
                await steer
            runtime.gate.set()
            await h.wait_idle(sid)
            events = await h.store.read(sid)
            (accepted,) = [e for e in events if e.type == "steer.accepted"]
            leftovers = [e for e in events if e.type == "steer.leftover"]
            assert [e.data["steer_ids"] for e in leftovers] == [[accepted.data["steer_id"]]]
            assert leftovers[0].data["text"] == "mention the budget"
            assert leftovers[0].seq < next(e.seq for e in events if e.type == "run.finished")

    asyncio.run(main())


def test_a_stop_cancelled_during_its_append_is_still_recorded(tmp_path: Path) -> None:
    """Layer: runs controls (invariant 9: a Stop is one durable `run.cancel_requested`, then
    the run's one `run.finished` in state `cancelled`). Stop closes the model request at
    once and records itself after; a caller cancelled while that record waited in the writer
    took the record with it (the write was withdrawn before it ran), and the worker, stopped
    all the same, ended the run `cancelled` with no Stop in the log."""

    async def main() -> None:
        runtime = StatefulGatedRuntime()  # the gate stays shut: only a Stop ends the run
        settings = Settings(data_dir=tmp_path)
        async with harness(tmp_path, runtime, settings) as h:
            sid = (await h.sessions.create(None))["session_id"]
            other = (await h.sessions.create(None))["session_id"]
            stream_id = (await h.engine.start(sid, "first"))["stream_id"]
            await until(lambda: runtime.calls == 1)
            with writes_held(settings):
                rename = asyncio.create_task(h.sessions.patch(other, {"title": "x"}))
                await asyncio.sleep(0.1)  # the writer has it, and waits for the lock
                stop = asyncio.create_task(h.controls.cancel(stream_id=stream_id))
                await until(lambda: h.registry.phase(sid) == "cancelling")
                await asyncio.sleep(0.2)  # its append waits in the writer
                stop.cancel()
                await asyncio.sleep(0.05)
            with pytest.raises(asyncio.CancelledError):
                await stop
            await rename
            await h.wait_idle(sid)
            events = await h.store.read(sid)
            assert [e.type for e in events if e.stream_id][-2:] == [
                "run.cancel_requested",
                "run.finished",
            ]
            assert events[-1].data["state"] == "cancelled"

    asyncio.run(main())
