"""The PostgreSQL writer's batches in flight (layer: the log; contract invariants 3 and 5, as
invariant 8 asks: each session's events keep the order they were appended in and get
contiguous seqs, whatever else is being written). Up to two batches are written at once, on
sessions no other batch in flight holds (log/postgres.py `_writer_loop`): a session's next
operations wait for its batch, another session's go ahead without waiting for that batch's
WAL flush."""

from __future__ import annotations

import asyncio
import concurrent.futures

import psycopg
import pytest

from tether.log import Draft, StorageError, postgres
from tether.log.errors import StreamClosed
from tether.log.pg_rows import Op, take_runnable

PostgresEventStore = postgres.PostgresEventStore

STALL = "stalled-by-the-database"


def _op(sid: str, kind: str = "append", many: tuple[str, ...] = ()) -> Op:
    future = concurrent.futures.Future()  # never awaited: only the sessions count here
    return Op(kind, sid, [], future, many=[(m, []) for m in many])  # type: ignore[arg-type]


def test_an_operation_on_a_session_in_flight_waits_and_so_do_the_later_ones_on_it() -> None:
    a1, b1, a2, c1, b2 = _op("a"), _op("b"), _op("a"), _op("c"), _op("b")
    batch, rest = take_runnable([a1, b1, a2, c1, b2], held={"a"}, limit=10)
    assert batch == [b1, c1, b2]
    assert rest == [a1, a2]


def test_an_import_waits_while_any_of_its_sessions_is_in_flight_and_holds_them_all() -> None:
    imported = _op("n1", "create_many", ("n1", "n2"))
    later_n2, other = _op("n2"), _op("x")
    batch, rest = take_runnable([imported, later_n2, other], held={"n2"}, limit=10)
    assert batch == [other]
    assert rest == [imported, later_n2]


def test_a_batch_stops_at_its_limit_and_what_is_left_keeps_its_order() -> None:
    ops = [_op(f"s{n}") for n in range(5)]
    more_s1 = _op("s1")
    batch, rest = take_runnable([*ops, more_s1], held=set(), limit=3)
    assert batch == ops[:3]
    assert rest == [ops[3], ops[4], more_s1]


def _stall_marked_events(url: str, seconds: float) -> None:
    """A trigger that holds any event carrying STALL in the database for `seconds`: a batch
    whose commit is slow, as under a slow disk."""
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "CREATE FUNCTION stall_marked() RETURNS trigger AS $$ BEGIN "
            f"PERFORM pg_sleep({seconds}); RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        db.execute(
            "CREATE TRIGGER stall_marked BEFORE INSERT ON events FOR EACH ROW "
            f"WHEN (NEW.data LIKE '%{STALL}%') EXECUTE FUNCTION stall_marked()"
        )


async def _stalled_store(url: str, seconds: float, *sids: str) -> postgres.PostgresEventStore:
    """A store with `sids` created, whose events carrying STALL then wait `seconds`."""
    store = PostgresEventStore(url, index_fold=lambda state, event: {}, index_version="t1")
    _stall_marked_events(url, seconds)
    for sid in sids:
        await store.create_session(sid, [Draft("session.created", {})])
    return store


@pytest.mark.slow
def test_a_slow_batch_holds_back_its_own_session_but_not_another(url: str) -> None:
    async def main() -> None:
        store = await _stalled_store(url, 1.5, "s1", "s2")
        slow = asyncio.create_task(store.append("s1", [Draft("note", {"text": STALL})]))
        await asyncio.sleep(0.3)  # its batch is in the database, stalled
        next_on_s1 = asyncio.create_task(store.append("s1", [Draft("note", {"n": 1})]))
        other = await asyncio.wait_for(store.append("s2", [Draft("note", {"n": 2})]), 1.0)
        assert [e.seq for e in other] == [2]
        assert not slow.done() and not next_on_s1.done()  # s1's next one waits its turn
        assert [e.seq for e in await slow] == [2]
        assert [e.seq for e in await next_on_s1] == [3]
        assert [e.data.get("n") for e in await store.read("s1", after=1)] == [None, 1]
        await store.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_a_finished_stream_stays_finished_for_a_batch_while_another_clears_the_cache(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 2 finds the stream finished in the replica's cache, then waits for its session's
    lock (held here by another transaction, as another replica would); batch 1 commits
    meanwhile and, past the cache's bound, clears it. Batch 2 must still refuse the append."""

    async def main() -> None:
        store = PostgresEventStore(url, index_fold=lambda state, event: {}, index_version="t1")
        for sid in ("sa", "sb"):
            await store.create_session(sid, [Draft("session.created", {})])
        await store.append(
            "sb", [Draft("note", {}, stream_id="rb"), Draft("run.finished", {}, stream_id="rb")]
        )
        monkeypatch.setattr(postgres, "_CLOSED_STREAM_CACHE", 0)  # every commit clears it
        async with await psycopg.AsyncConnection.connect(url) as other:  # holds sb's row
            await other.execute("SELECT 1 FROM sessions WHERE session_id='sb' FOR UPDATE")
            late = asyncio.create_task(store.append("sb", [Draft("note", {}, stream_id="rb")]))
            await asyncio.sleep(0.3)  # batch 2 has read the cache and waits for the lock
            await store.append("sa", [Draft("run.finished", {}, stream_id="ra")])
            await other.commit()
        with pytest.raises(StreamClosed):
            await late
        assert [e.type for e in await store.read("sb")][-1] == "run.finished"
        await store.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_a_cancelled_writer_answers_every_append_it_took_or_that_was_queued(url: str) -> None:
    async def main() -> None:
        store = await _stalled_store(url, 1.0, "s1")
        slow = asyncio.create_task(store.append("s1", [Draft("note", {"text": STALL})]))
        await asyncio.sleep(0.3)
        behind = [
            asyncio.create_task(store.append("s1", [Draft("note", {"n": n})])) for n in range(3)
        ]
        await asyncio.sleep(0.1)  # taken by the writer, held back behind s1's batch
        assert store._writer is not None
        store._writer.cancel()  # as a loop torn down under it would
        outcomes = await asyncio.wait_for(asyncio.gather(*behind, return_exceptions=True), 5)
        assert all(isinstance(o, StorageError) for o in outcomes), outcomes
        assert [e.seq for e in await slow] == [2]  # the batch in flight finished and answered
        with pytest.raises(StorageError):
            await store.append("s1", [Draft("note", {})])
        assert [e.seq for e in await store.read("s1")] == [1, 2]
        await store.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_a_close_cancelled_while_a_batch_is_in_flight_still_closes_the_pool_and_listener(
    url: str,
) -> None:
    """A shutdown whose deadline cancels `aclose` while it waits for the writer: the batch in
    flight still finishes and answers, and the replica's connections are closed all the same
    (none left open on the database)."""

    async def main() -> None:
        store = await _stalled_store(url, 1.0, "s1")
        slow = asyncio.create_task(store.append("s1", [Draft("note", {"text": STALL})]))
        await asyncio.sleep(0.3)
        closing = asyncio.create_task(store.aclose())
        await asyncio.sleep(0.1)  # waiting for the writer's batch
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert store._pool.closed
        assert store._fanout._task is None  # the listener was stopped
        assert [e.seq for e in await slow] == [2]

    asyncio.run(main())
