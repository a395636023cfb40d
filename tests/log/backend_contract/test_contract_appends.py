"""Backend contract, layer: the log. Contract "run-journal sequence publication": seqs are
allocated in the transaction that writes the events, contiguous per session whatever the
concurrency, in disk order; an append is atomic; a refused append writes nothing."""

from __future__ import annotations

import asyncio

import pytest
from backend_kit import Backend

from tether.log import Draft, SessionExists, SessionNotFound, StreamClosed
from tether.log.errors import InvalidEvent


def created(title: str = "t") -> list[Draft]:
    return [Draft("session.created", {"title": title})]


def test_concurrent_appenders_get_contiguous_seqs_in_disk_order(backend: Backend) -> None:
    async def main() -> tuple[list[int], list[list[int]]]:
        store = await backend.open()
        await store.create_session("s1", created())

        async def appender(n: int) -> list[list[int]]:
            acked = []
            for i in range(20):
                size = 1 + (n + i) % 3  # single and multi-event appends, interleaved
                drafts = [Draft("text.delta", {"n": n, "i": i, "k": k}) for k in range(size)]
                acked.append([e.seq for e in await store.append("s1", drafts)])
            return acked

        results = await asyncio.gather(*(appender(n) for n in range(50)))
        logged = [e.seq for e in await store.read("s1")]
        await store.aclose()
        return logged, [batch for r in results for batch in r]

    logged, batches = asyncio.run(main())
    total = 1 + sum(len(b) for b in batches)
    for batch in batches:  # a multi-event append is never interleaved with another
        assert batch == list(range(batch[0], batch[0] + len(batch)))
    assert sorted(s for b in batches for s in b) == list(range(2, total + 1))
    assert logged == list(range(1, total + 1))
    assert backend.physical_order("s1") == list(range(1, total + 1))


def test_sessions_appended_at_once_each_count_from_one(backend: Backend) -> None:
    async def main() -> dict[str, list[int]]:
        store = await backend.open()
        sids = [f"s{n}" for n in range(5)]
        await asyncio.gather(*(store.create_session(sid, created()) for sid in sids))

        async def appender(sid: str) -> None:
            for i in range(30):
                await store.append(sid, [Draft("text.delta", {"i": i})])

        await asyncio.gather(*(appender(sid) for sid in sids for _ in range(4)))
        seqs = {sid: [e.seq for e in await store.read(sid)] for sid in sids}
        last = {sid: await store.last_seq(sid) for sid in sids}
        await store.aclose()
        assert last == {sid: 121 for sid in sids}
        return seqs

    for sid, seqs in asyncio.run(main()).items():
        assert seqs == list(range(1, 122))
        assert backend.physical_order(sid) == seqs


def test_a_session_created_many_times_at_once_is_created_once(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        outcomes = await asyncio.gather(
            *(store.create_session("s1", created(f"try {n}")) for n in range(10)),
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, list)]
        assert len(winners) == 1
        assert all(isinstance(o, SessionExists) for o in outcomes if o not in winners)
        assert [(e.seq, e.data) for e in await store.read("s1")] == [(1, winners[0][0].data)]
        await store.aclose()

    asyncio.run(main())


def test_an_unknown_or_deleted_session_refuses_appends(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        with pytest.raises(SessionNotFound):
            await store.append("nope", [Draft("x")])
        assert await store.last_seq("nope") is None
        await store.create_session("s1", created())
        await store.delete_session("s1")
        with pytest.raises(SessionNotFound):
            await store.append("s1", [Draft("x")])
        with pytest.raises(SessionNotFound):
            await store.delete_session("s1")
        assert await store.read("s1") == []
        assert await store.last_seq("s1") is None
        assert await store.index_state("s1") is None
        await store.aclose()

    asyncio.run(main())


def test_unstorable_data_fails_only_its_own_append(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", created())
        bad, good, worse = await asyncio.gather(
            store.append("s1", [Draft("a"), Draft("x", {"text": "\ud800"})]),  # lone surrogate
            store.append("s1", [Draft("b")]),
            store.append("s1", [Draft("c"), Draft("y", {"obj": object()})]),  # not JSON
            return_exceptions=True,
        )
        assert isinstance(bad, InvalidEvent) and isinstance(worse, InvalidEvent)
        assert isinstance(good, list) and [e.seq for e in good] == [2]
        assert [(e.seq, e.type) for e in await store.read("s1")] == [
            (1, "session.created"),
            (2, "b"),
        ]
        assert [e.seq for e in await store.append("s1", [Draft("d")])] == [3]
        await store.aclose()

    asyncio.run(main())


def test_an_append_refused_at_its_last_draft_writes_none_of_it(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", created())
        await store.append("s1", [Draft("run.finished", {"state": "completed"}, stream_id="r1")])
        with pytest.raises(StreamClosed):
            await store.append(
                "s1",
                [Draft("text.delta", {"text": "ok"}), Draft("text.delta", {}, stream_id="r1")],
            )
        assert await store.last_seq("s1") == 2
        assert [e.seq for e in await store.read("s1")] == [1, 2]
        assert (await store.index_state("s1"))["seqs"] == [1, 2]
        assert [e.seq for e in await store.append("s1", [Draft("x")])] == [3]
        await store.aclose()

    asyncio.run(main())


def test_sessions_created_together_are_all_written_or_none_with_their_own_times(
    backend: Backend,
) -> None:
    """`create_sessions` (an import, docs/api.md §12): one commit for all of them, each log
    from seq 1; a draft's own `at` is kept; one refusal (an existing session, unstorable
    data, a stream another of them finishes) writes none of them."""

    async def main() -> None:
        store = await backend.open()
        await store.create_session("old", created())
        made = await store.create_sessions(
            [
                ("i1", [Draft("session.created", {}, at=1000.0), Draft("x", {}, at=1001.5)]),
                ("i2", [Draft("session.created", {})]),
            ]
        )
        assert [[(e.session_id, e.seq) for e in events] for events in made] == [
            [("i1", 1), ("i1", 2)],
            [("i2", 1)],
        ]
        assert [e.at for e in await store.read("i1")] == [1000.0, 1001.5]
        assert (await store.read("i2"))[0].at > 1_700_000_000  # no own time: the commit's
        assert (await store.index_state("i1"))["seqs"] == [1, 2]
        finished = Draft("run.finished", {"state": "completed"}, stream_id="r1")
        refused = [
            [("n1", created()), ("old", created())],
            [("n1", created()), ("n2", [Draft("session.created", {"bad": {1, 2}})])],
            [("n1", [*created(), finished]), ("n2", [*created(), Draft("d", stream_id="r1")])],
            [("n1", created()), ("n1", created())],
        ]
        for sessions in refused:
            with pytest.raises((SessionExists, InvalidEvent, StreamClosed)):
                await store.create_sessions(sessions)
            assert await store.last_seq("n1") is None and await store.last_seq("n2") is None
            assert set(await store.index_states()) == {"old", "i1", "i2"}
        assert [e.seq for e in await store.append("i2", [Draft("d")])] == [2]
        await store.aclose()

    asyncio.run(main())


def test_an_append_whose_caller_gives_up_first_writes_nothing_and_the_log_goes_on(
    backend: Backend,
) -> None:
    """A caller cancelled while its append waits for the writer (a client gone, a shutdown)
    writes nothing; the appends queued beside it get their answers and the log goes on
    writing. On SQLite, before the fix, the writer thread died of the cancelled future
    (set_result raised after the commit): every later append failed with 'the log is
    closed'."""

    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", created())
        with backend.hold_writes("s1"):
            first = asyncio.create_task(store.append("s1", [Draft("first")]))
            await asyncio.sleep(0.3)  # the writer has taken it and waits for the lock
            gone = asyncio.create_task(store.append("s1", [Draft("gone"), Draft("gone")]))
            kept = asyncio.create_task(store.append("s1", [Draft("kept")]))
            await asyncio.sleep(0.1)
            gone.cancel()
            await asyncio.sleep(0.05)
        assert [e.seq for e in await asyncio.wait_for(first, 10)] == [2]
        assert [e.seq for e in await asyncio.wait_for(kept, 10)] == [3]
        assert gone.cancelled()
        assert [e.seq for e in await asyncio.wait_for(store.append("s1", [Draft("z")]), 10)] == [4]
        events = await store.read("s1")
        assert [e.type for e in events] == ["session.created", "first", "kept", "z"]
        assert backend.physical_order("s1") == [1, 2, 3, 4]
        await store.aclose()

    asyncio.run(main())


def test_an_append_cancelled_once_its_batch_began_stands_whole(backend: Backend) -> None:
    """Once the writer has begun its batch, a cancel loses only the caller's answer, as a
    dropped connection would: the events are written whole, and the writer goes on."""

    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", created())
        with backend.hold_writes("s1"):
            gone = asyncio.create_task(store.append("s1", [Draft("x"), Draft("x")]))
            await asyncio.sleep(0.3)  # in the writer's batch, waiting for the lock
            gone.cancel()
            await asyncio.sleep(0.05)
        assert [e.seq for e in await asyncio.wait_for(store.append("s1", [Draft("z")]), 10)] == [4]
        assert [e.type for e in await store.read("s1")] == ["session.created", "x", "x", "z"]
        await store.aclose()

    asyncio.run(main())
