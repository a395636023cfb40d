"""Positions across replicas on one PostgreSQL database: the database admits one unfinished
run per session; a truncate, a branch switch or a deletion waits for another replica's run;
an edit or a switch checked before another replica wrote is refused, not misplaced; a
rotated session takes no turn, queued message or cut through any replica. Layers: the log's
batch writer (`log/pg_batch.py`) and its counter rows; contract invariants 1 and 9."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg
import pytest
from log.pg_replica_kit import open_store, turn

from tether.log import Draft
from tether.log.errors import (
    SessionContinued,
    SessionOccupied,
    TranscriptMoved,
)
from tether.log.pg_schema import MIGRATIONS, apply_migrations

pytestmark = pytest.mark.slow


def test_admission_is_decided_by_the_database_one_unfinished_run_per_session(url: str) -> None:
    """Layer: runs admission (contract invariant 9's `busy`, across replicas): of thirty
    turns submitted at once through three replicas, one is admitted and every other is
    refused with the winner's stream; once it has its run.finished, the next is admitted."""

    async def main() -> None:
        stores = [open_store(url, f"r{n}") for n in range(3)]
        await stores[0].create_session("s1", [Draft("session.created", {})])
        outcomes = await asyncio.gather(
            *(stores[n % 3].append("s1", [turn(n)]) for n in range(30)), return_exceptions=True
        )
        admitted = [o for o in outcomes if isinstance(o, list)]
        assert len(admitted) == 1
        winner = admitted[0][0].stream_id
        refusals = [o for o in outcomes if not isinstance(o, list)]
        assert all(isinstance(o, SessionOccupied) for o in refusals) and len(refusals) == 29
        assert {
            o.extra["active_stream_id"] for o in refusals if isinstance(o, SessionOccupied)
        } == {winner}
        types = [e.type for e in await stores[1].read("s1")]
        assert types == ["session.created", "turn.submitted"]  # refused turns wrote nothing
        # other events of the open run, and of the session, go on
        await stores[1].append("s1", [Draft("text.delta", {"text": "hi"}, winner)])
        await stores[2].append("s1", [Draft("run.finished", {"state": "completed"}, winner)])
        assert [e.stream_id for e in await stores[2].append("s1", [turn(99)])] == ["r99"]
        with pytest.raises(SessionOccupied):
            await stores[0].append("s1", [turn(100)])
        # a turn and its own run.finished in one batch, then the next: both admitted
        await asyncio.gather(
            stores[0].append("s1", [Draft("run.finished", {"state": "cancelled"}, "r99")]),
            stores[0].append("s1", [turn(101)]),
        )
        for store in stores:
            await store.aclose()

    asyncio.run(main())


def test_a_truncate_a_branch_switch_or_a_deletion_waits_for_another_replicas_run(
    url: str,
) -> None:
    """Layer: runs admission across replicas (edit or switch while a run is active: 409
    `session_busy`). A replica's own check cannot see a run another replica admitted a
    moment ago: the database refuses a `needs_no_run` event, and the deletion of the
    session, while the session has an unfinished run, and takes them once it has ended."""

    async def main() -> None:
        a, b = open_store(url, "ra"), open_store(url, "rb")
        await a.create_session("s1", [Draft("session.created", {})])
        await a.append("s1", [turn(1)])
        cut = Draft(
            "transcript.truncated",
            {"keep_count": 0, "transcript_generation": 1},
            needs_no_run=True,
        )
        with pytest.raises(SessionOccupied) as refused:
            await b.append("s1", [cut])
        assert refused.value.extra["active_stream_id"] == "r1"
        with pytest.raises(SessionOccupied):
            await b.delete_session("s1", only_idle=True)
        await b.append("s1", [Draft("session.updated", {"title": "still fine"})])
        assert [e.type for e in await b.read("s1")] == [
            "session.created",
            "turn.submitted",
            "session.updated",
        ]
        await a.append("s1", [Draft("run.finished", {"state": "completed"}, "r1", "u1")])
        await b.append("s1", [cut])
        await b.delete_session("s1", only_idle=True)
        assert await a.last_seq("s1") is None
        for store in (a, b):
            await store.aclose()

    asyncio.run(main())


def test_an_edit_or_switch_checked_before_another_replica_wrote_is_refused_not_misplaced(
    url: str,
) -> None:
    """Layer: the log, for edit, regenerate and branch switch across replicas (docs/api.md
    §10; contract invariant 1: the model gets the branch the user saw). They name rows by
    position in the transcript their replica read: a switch through another replica that
    lands between that read and the write moves those positions onto another branch, and
    the edit was applied there (both answered 200, the edited message on a branch the user
    never saw). The database refuses a draft whose `after_seq` is no longer the session's
    last seq (404 `row_not_found`, as a stale tab), writing nothing of its append."""

    async def main() -> None:
        a, b = open_store(url, "ra"), open_store(url, "rb")
        await a.create_session("s1", [Draft("session.created", {})])
        read = await a.last_seq("s1")  # what replica a checked its edit against
        assert read is not None
        switch = Draft(
            "branch.switched",
            {"row_id": "r1", "index": 1, "message_count": 2, "transcript_generation": 1},
            needs_no_run=True,
            after_seq=read,
        )
        await b.append("s1", [switch])  # replica b's switch lands first
        cut = Draft(
            "transcript.truncated",
            {"keep_count": 0, "transcript_generation": 1},
            needs_no_run=True,
            after_seq=read,
        )
        with pytest.raises(TranscriptMoved) as refused:
            await a.append("s1", [cut, turn(1)])
        assert refused.value.code == "row_not_found" and refused.value.status == 404
        assert [e.type for e in await a.read("s1")] == ["session.created", "branch.switched"]
        again = replace(cut, after_seq=await a.last_seq("s1"))  # checked against what is there
        await a.append("s1", [again, turn(1)])
        assert [e.type for e in await b.read("s1")][-2:] == [
            "transcript.truncated",
            "turn.submitted",
        ]
        for store in (a, b):
            await store.aclose()

    asyncio.run(main())


def test_a_rotated_session_takes_no_turn_queued_message_or_cut_through_any_replica(
    url: str,
) -> None:
    """Layer: the log, for rotation across replicas (contract "inactive compression
    continuation recovery": 409 `session_rotated` before any mutation). A replica's own check
    cannot see a rotation another replica wrote a moment ago: once the session has its
    `session.rotated`, the database refuses a new turn, a queued message, a truncate and a
    second rotation there (409 naming the child), writing nothing of their appends; the run
    events of a run, renames and an import of a rotated session's history go on."""

    async def main() -> None:
        a, b = open_store(url, "ra"), open_store(url, "rb")
        await a.create_session("s1", [Draft("session.created", {})])
        await a.append("s1", [turn(1)])
        await a.append("s1", [Draft("run.finished", {"state": "completed"}, "r1", "u1")])
        rotated = Draft("session.rotated", {"continuation_session_id": "s2"}, needs_no_run=True)
        await a.append("s1", [rotated])
        cut = Draft("transcript.truncated", {"keep_count": 0, "transcript_generation": 1})
        queued = Draft("queue.added", {"queue_id": "q1", "text": "later", "attachments": []})
        for refused in ([turn(2)], [replace(cut, needs_no_run=True)], [queued], [rotated]):
            with pytest.raises(SessionContinued) as info:
                await b.append("s1", refused)
            assert (info.value.code, info.value.status) == ("session_rotated", 409)
            assert info.value.extra["continuation_session_id"] == "s2"
        assert [e.type for e in await b.read("s1")][-1] == "session.rotated"
        await b.append("s1", [Draft("session.updated", {"title": "renamed"})])
        history = [Draft("session.created", {}), rotated, turn(3)]  # as an export has it
        await b.create_session("s3", history)
        for store in (a, b):
            await store.aclose()

    asyncio.run(main())


def test_the_continued_in_migration_fills_the_rotated_sessions_from_their_log(url: str) -> None:
    """Layer: the log's schema (m012_continued_in): a database rotated by an older version
    refuses a turn in its rotated sessions once migrated, as one rotated since."""
    names = [name for name, _ in MIGRATIONS]
    older = MIGRATIONS[: names.index("m012_continued_in")]
    with psycopg.connect(url, autocommit=True) as db:
        for _, fn in older:
            with db.transaction():
                fn(db)
        db.execute(
            "CREATE TABLE IF NOT EXISTS tether_migrations "
            "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        for name, _ in older:
            db.execute("INSERT INTO tether_migrations VALUES (%s, 0)", (name,))
        db.execute("INSERT INTO sessions (session_id, last_seq) VALUES ('s1', 2), ('s9', 1)")
        db.execute(
            "INSERT INTO events (session_id, seq, type, at, data) VALUES "
            "('s1', 1, 'session.created', 1, '{}'), "
            "('s1', 2, 'session.rotated', 2, '{\"continuation_session_id\": \"s2\"}'), "
            "('s9', 1, 'session.created', 1, '{}')"
        )
        assert apply_migrations(db) == names[len(older) :]
        rows = db.execute("SELECT session_id, continued_in FROM sessions ORDER BY 1").fetchall()
        assert rows == [("s1", "s2"), ("s9", None)]
