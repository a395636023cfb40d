"""Backend contract, layer: the log as the run journal and the live stream. A read from a
cursor returns exactly what follows it; a reader never learns of a seq it cannot read; the
hub hears of an event only after it is committed, in seq order, each once (the SSE hand-off
of invariant 3 relies on all three)."""

from __future__ import annotations

import asyncio

import pytest
from backend_kit import Backend

from tether.events import Event
from tether.log import Draft, Hub, SessionDeleted, StreamClosed
from tether.log.errors import InvalidEvent


def test_a_read_returns_exactly_what_follows_its_cursor(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        for i in range(29):
            await store.append("s1", [Draft("text.delta", {"i": i})])
        await store.create_session("s2", [Draft("session.created", {"title": "other"})])
        everything = await store.read("s1")
        assert [e.seq for e in everything] == list(range(1, 31))
        assert all(e.session_id == "s1" for e in everything)
        for cursor in range(0, 32):
            assert await store.read("s1", after=cursor) == everything[cursor:]
        paged: list[Event] = []
        while page := await store.read("s1", after=paged[-1].seq if paged else 0, limit=7):
            assert len(page) <= 7
            paged.extend(page)
        assert paged == everything
        assert await store.read("s1", after=5, limit=3) == everything[5:8]
        assert await store.read("unknown") == []
        await store.aclose()

    asyncio.run(main())


def test_an_acknowledged_append_is_read_back_as_it_was_returned(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        made = await store.create_session("s1", [Draft("session.created", {"title": "ü"})])
        data = {"text": "héllo \u2028 <b>", "nested": {"list": [1, 2.5, None, True]}}
        appended = await store.append("s1", [Draft("text.delta", data, "r1", "u1")])
        assert await store.read("s1") == made + appended
        assert appended[0].data == data
        assert (appended[0].stream_id, appended[0].turn_id) == ("r1", "u1")
        assert await store.last_seq("s1") == 2
        await store.aclose()

    asyncio.run(main())


def test_last_seq_never_runs_ahead_of_what_a_read_returns(backend: Backend) -> None:
    async def main() -> list[tuple[int, int]]:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        done = asyncio.Event()
        ahead: list[tuple[int, int]] = []

        async def appender() -> None:
            for i in range(40):
                acked = await store.append("s1", [Draft("text.delta", {"i": i})])
                # read-your-writes: what was acknowledged is readable at once
                assert [e.seq for e in await store.read("s1", after=acked[0].seq - 1)][:1] == [
                    acked[0].seq
                ]

        async def reader() -> None:
            while not done.is_set():
                reported = await store.last_seq("s1") or 0
                readable = len(await store.read("s1"))
                if readable < reported:
                    ahead.append((reported, readable))
                await asyncio.sleep(0)

        readers = [asyncio.create_task(reader()) for _ in range(3)]
        await asyncio.gather(*(appender() for _ in range(5)))
        done.set()
        await asyncio.gather(*readers)
        await store.aclose()
        return ahead

    assert asyncio.run(main()) == []


def test_the_hub_hears_of_events_after_commit_in_seq_order_each_once(backend: Backend) -> None:
    async def main() -> tuple[list[int], list[tuple[int, int | None]]]:
        store = await backend.open()
        hub = Hub(asyncio.get_running_loop())
        store.attach_hub(hub)
        early: list[tuple[int, int | None]] = []

        def check_committed(events: list[Event]) -> None:
            # on the loop, at publication: another connection must already see the batch
            newest = max(e.seq for e in events if e.session_id == "s1")
            committed = backend.committed_last_seq("s1")
            if committed is None or committed < newest:
                early.append((newest, committed))

        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        hub.on_batch(check_committed)
        sub = hub.subscribe("s1")

        async def appender(n: int) -> None:
            for i in range(20):
                await store.append("s1", [Draft("text.delta", {"n": n, "i": i})])

        await asyncio.gather(*(appender(n) for n in range(10)))
        await store.append("s1", [Draft("run.finished", {"state": "completed"}, stream_id="r")])
        refused = await asyncio.gather(  # refused appends are never published
            store.append("s1", [Draft("text.delta", {}, stream_id="r")]),
            store.append("s1", [Draft("x", {"text": "\ud800"})]),
            return_exceptions=True,
        )
        assert [type(e) for e in refused] == [StreamClosed, InvalidEvent]
        await store.append("s1", [Draft("text.delta", {"last": True})])
        published: list[int] = []
        while len(published) < 202:
            batch = await sub.next_batch(timeout=5)
            assert batch, "publication stalled"
            published.extend(e.seq for e in batch)
        assert await sub.next_batch(timeout=0.2) == []  # nothing more, nothing twice
        await store.delete_session("s1")
        with pytest.raises(SessionDeleted):
            await sub.next_batch(timeout=5)
        store.attach_hub(None)
        await store.aclose()
        return published, early

    published, early = asyncio.run(main())
    assert published == list(range(2, 204))
    assert early == []
