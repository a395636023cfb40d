"""Queued messages started while another replica sharing the PostgreSQL database hides rows
of the transcript (a truncate, a branch switch: docs/api.md §4). Two engines wired as the app
wires them (tests/runs/engine_harness.py), each with its own pool, on one real database:
replica A's append is held until replica B's command has committed, so the interleaving is
the same on every run. Contract invariant 1: a queued message is never started after rows
its sender never saw; the database refuses what A checked before B's write."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from pg import database

from tether.log.errors import SeenTranscriptChanged
from tether.settings import Settings

from engine_harness import GatedRuntime, Harness, harness, has, hold_append

pytestmark = pytest.mark.slow


def _replica(data: Path, url: str) -> AbstractAsyncContextManager[Harness]:
    runtime = GatedRuntime()
    runtime.gate.set()  # answers "answer" at once
    return harness(data, runtime, Settings(data_dir=data, database_url=url))


async def _answered(h: Harness, sid: str, text: str) -> None:
    await h.engine.start(sid, text)
    await h.wait_idle(sid)


async def _users(h: Harness, sid: str) -> list[str]:
    return [m["content"] for m in (await h.sessions.view(sid))["messages"] if m["role"] == "user"]


def test_an_automatic_start_checked_before_another_replica_hid_rows_is_refused(
    tmp_path: Path,
) -> None:
    """Layer: the queue's automatic start (`RunEngine.start_next`, its position checked as a
    stale view's start: log/pg_batch.py `Draft.shown_generation`); contract invariant 1.
    Replica A queues "later" into its idle session, so starts it at once, and checked it
    against [one, answer, two, answer]; replica B cuts the last exchange before A's append.
    The database refuses the start: "later" stays queued, waiting for the user (a run that
    completes later does not send it), and no run starts."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            await _answered(a, sid, "one")
            await _answered(a, sid, "two")
            hold_append(a, has("turn.submitted"), lambda: b.sessions.truncate(sid, 2))
            queued = await a.queue.add(sid, "later", ())
            assert queued["started"] is None and not a.registry.busy(sid)
            assert "turn.submitted" not in (await a.types(sid))[-2:]
            assert await _users(a, sid) == ["one"]
            fold = await a.sessions.folds.get(sid)
            assert fold.transcript.held == {queued["queue_id"]}

            await _answered(a, sid, "three")  # completes: "later" still waits for the user
            view = await a.sessions.view(sid)
            assert [q["queue_id"] for q in view["queued"]] == [queued["queue_id"]]
            assert await _users(a, sid) == ["one", "three"]

    with database() as url:
        asyncio.run(main(url))


def test_a_message_queued_from_a_view_checked_before_another_replica_hid_its_rows(
    tmp_path: Path,
) -> None:
    """Layer: the log (log/pg_batch.py, `Draft.shown_generation` on the `queue.added`), for
    `POST /api/chat/queue {after_seq}` into an idle session, which starts it at once; contract
    invariant 1. Replica A checks the message against the user's view [one, answer, two,
    answer] (nothing hidden since), and replica B cuts the last exchange before A's append:
    the database refuses it, 409 `transcript_changed`, and nothing is queued or started. From
    the view now shown it is queued and starts."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            await _answered(a, sid, "one")
            await _answered(a, sid, "two")
            seen = await a.store.last_seq(sid)
            hold_append(a, has("queue.added"), lambda: b.sessions.truncate(sid, 2))
            logged = await a.types(sid)
            with pytest.raises(SeenTranscriptChanged) as refused:
                await a.queue.add(sid, "later", (), after_seq=seen)
            assert (refused.value.code, refused.value.status) == ("transcript_changed", 409)
            assert await a.types(sid) == [*logged, "transcript.truncated"]
            assert not a.registry.busy(sid)

            queued = await a.queue.add(sid, "later", (), after_seq=await a.store.last_seq(sid))
            assert queued["started"] is not None
            await a.wait_idle(sid)
            assert await _users(a, sid) == ["one", "later"]

    with database() as url:
        asyncio.run(main(url))
