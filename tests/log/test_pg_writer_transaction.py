"""The PostgreSQL writer's transaction, sent as statements of its pipeline (layer: the log;
contract invariants 3 and 5, named as invariant 8 asks: a batch is durable whole or not at
all, so seqs stay contiguous and a replay never meets half a batch; what a refused operation
wrote inside its batch goes with it). BEGIN, COMMIT and the import's savepoint are plain
statements there (log/postgres.py), so these tests hold what psycopg's `transaction()` did:
a batch the database refuses, or one a bug stops after its first writes were sent, commits
nothing and the writer goes on; a refused import leaves none of its rows in a batch that
commits. The other replicas' wake-up (NOTIFY) rides in the same pipeline behind COMMIT: when
the database refuses it, the batch is durable all the same, is reported as written, and
reaches the other replicas through their slow poll."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from tether.events import Event
from tether.log import Draft, Hub
from tether.log.errors import SessionExists, StorageError
from tether.log.postgres import PostgresEventStore
from tether.log.store import IndexFold

pytestmark = pytest.mark.slow

REFUSE = "refused-by-the-database"


def _store(url: str, fold: IndexFold = lambda state, event: {}) -> PostgresEventStore:
    return PostgresEventStore(url, index_fold=fold, index_version="t1")


def _created() -> list[Draft]:
    return [Draft("session.created", {})]


def _refuse_marked_events(url: str) -> None:
    """A trigger that fails any event carrying REFUSE: a failure of the database itself,
    in the middle of a batch, after the writer has sent its statements."""
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "CREATE FUNCTION refuse_marked() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql"
        )
        db.execute(
            "CREATE TRIGGER refuse_marked BEFORE INSERT ON events FOR EACH ROW "
            f"WHEN (NEW.data LIKE '%{REFUSE}%') EXECUTE FUNCTION refuse_marked()"
        )


def test_a_batch_the_database_refuses_leaves_nothing_and_the_writer_goes_on(url: str) -> None:
    async def main() -> None:
        store = _store(url)  # its migrations make the tables
        _refuse_marked_events(url)
        await store.create_session("s1", _created())
        await store.create_session("s2", _created())
        outcomes = await asyncio.gather(  # queued together: one batch
            store.append("s1", [Draft("note", {"text": "fine"})]),
            store.append("s2", [Draft("note", {"text": REFUSE})]),
            return_exceptions=True,
        )
        assert all(isinstance(o, StorageError) for o in outcomes), outcomes
        assert await store.last_seq("s1") == 1 and await store.last_seq("s2") == 1
        for _ in range(3):  # the next batches are written as before
            events = await store.append("s1", [Draft("note", {"text": "after"})])
            assert [e.seq for e in events] == [await store.last_seq("s1")]
        assert [e.seq for e in await store.read("s1")] == [1, 2, 3, 4]
        assert [e.seq for e in await store.read("s2")] == [1]
        await store.aclose()

    asyncio.run(main())


def test_a_refused_import_leaves_none_of_its_rows_in_a_batch_that_commits(url: str) -> None:
    async def main() -> None:
        store = _store(url)
        await store.create_session("old", _created())
        await store.create_session("s1", _created())
        imported, appended = await asyncio.gather(  # queued together: one batch
            store.create_sessions([("n1", _created()), ("old", _created())], owner="alice"),
            store.append("s1", [Draft("note", {"text": "kept"})]),
            return_exceptions=True,
        )
        assert isinstance(imported, SessionExists)
        assert isinstance(appended, list) and [e.seq for e in appended] == [2]
        assert await store.last_seq("n1") is None
        await store.aclose()

    asyncio.run(main())
    with psycopg.connect(url, autocommit=True) as db:  # n1's owner row went with it
        row = db.execute("SELECT count(*) FROM session_owners WHERE session_id='n1'").fetchone()
        assert row == (0,)


def _exploding(state: dict[str, Any] | None, event: Event) -> dict[str, Any]:
    """A fold with a bug: it raises on one event type, in the writer, mid-batch."""
    if event.type == "explode":
        raise RuntimeError("a bug in a fold")
    return {}


def test_a_batch_a_bug_stops_after_its_first_writes_were_sent_commits_none_of_them(
    url: str,
) -> None:
    """The new session's counter row is inserted (sent and answered) before the second
    operation's fold raises: the pipeline's exit then syncs what was sent, and only the
    open transaction (BEGIN) keeps that sync from committing it."""

    async def main() -> None:
        store = _store(url, _exploding)
        await store.create_session("s1", _created())
        outcomes = await asyncio.gather(  # queued together: one batch
            store.create_session("n1", _created()),
            store.append("s1", [Draft("explode", {})]),
            return_exceptions=True,
        )
        assert all(isinstance(o, StorageError) for o in outcomes), outcomes
        assert await store.last_seq("n1") is None and await store.last_seq("s1") == 1
        assert [e.seq for e in await store.append("s1", [Draft("note", {})])] == [2]
        await store.aclose()

    asyncio.run(main())
    with psycopg.connect(url, autocommit=True) as db:
        row = db.execute("SELECT count(*) FROM sessions WHERE session_id='n1'").fetchone()
        assert row == (0,)


def _refuse_wake_ups(url: str) -> None:
    """A `pg_notify` the writer's unqualified call resolves to, which fails: the database
    refusing the wake-up after the batch's COMMIT answered (new connections only)."""
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "CREATE FUNCTION public.pg_notify(text, text) RETURNS void AS $$ BEGIN "
            "RAISE EXCEPTION 'no wake-ups'; END $$ LANGUAGE plpgsql"
        )
        name = db.info.dbname
        db.execute(f'ALTER DATABASE "{name}" SET search_path = public, pg_catalog')


def test_a_refused_wake_up_after_commit_leaves_the_batch_written_and_published(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        await _store(url).aclose()  # its migrations make the tables
        _refuse_wake_ups(url)
        writer = _store(url)
        follower = PostgresEventStore(
            url, index_fold=lambda s, e: {}, index_version="t1", poll_seconds=0.5
        )
        hub = Hub(asyncio.get_running_loop())
        follower.attach_hub(hub)
        await follower.wait_listening()
        with hub.subscribe("s1") as heard:
            await writer.create_session("s1", _created())
            for n in range(3):  # reported written, every time: the connection is fine after
                events = await writer.append("s1", [Draft("note", {"n": n})])
                assert [e.seq for e in events] == [n + 2]
            seqs: list[int] = []
            async with asyncio.timeout(10):  # the slow poll publishes what no wake-up named
                while len(seqs) < 4:
                    seqs.extend(e.seq for e in await heard.next_batch(10))
        assert seqs == [1, 2, 3, 4]
        assert [e.seq for e in await writer.read("s1")] == [1, 2, 3, 4]
        await writer.aclose()
        await follower.aclose()

    asyncio.run(main())
    assert "could not notify" in caplog.text
