"""Backend contract, layer: the log (the run journal). A stream's events end at its
`run.finished`: the backend refuses any later event of that stream (StreamClosed), which is
what makes the terminal append idempotent ("exactly one run.finished, whoever gets there
first") and fences a wedged worker's late output away from its successor (invariant 2)."""

from __future__ import annotations

import asyncio

import pytest
from backend_kit import Backend

from tether.log import Draft, StreamClosed


def finished(stream_id: str, state: str) -> Draft:
    return Draft("run.finished", {"state": state}, stream_id=stream_id)


def test_a_finished_stream_refuses_every_later_event_even_after_reopening(
    backend: Backend,
) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        await store.append("s1", [Draft("text.delta", {"text": "a"}, stream_id="r1")])
        await store.append("s1", [finished("r1", "cancelled")])
        with pytest.raises(StreamClosed):
            await store.append("s1", [Draft("text.delta", {"text": "late"}, stream_id="r1")])
        with pytest.raises(StreamClosed):
            await store.append("s1", [finished("r1", "completed")])
        # the fence is the stream's only: its session and other streams go on
        await store.append("s1", [Draft("text.delta", {"text": "b"}, stream_id="r2")])
        await store.append("s1", [Draft("session.updated", {"pinned": True})])
        await store.aclose()
        reopened = await backend.open()
        with pytest.raises(StreamClosed):
            await reopened.append("s1", [Draft("text.delta", {}, stream_id="r1")])
        assert [e.seq for e in await reopened.append("s1", [finished("r2", "completed")])] == [6]
        await reopened.aclose()

    asyncio.run(main())


def test_two_terminals_of_one_stream_in_one_append_are_refused_whole(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        with pytest.raises(StreamClosed):
            await store.append("s1", [finished("r1", "completed"), finished("r1", "error")])
        assert await store.last_seq("s1") == 1
        await store.append("s1", [finished("r1", "completed")])  # the stream was still open
        await store.aclose()

    asyncio.run(main())


def test_concurrent_terminal_appends_record_exactly_one(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        states = ["completed", "cancelled", "interrupted", "error"] * 5
        outcomes = await asyncio.gather(
            *(store.append("s1", [finished("r1", state)]) for state in states),
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, list)]
        assert len(winners) == 1
        assert sum(isinstance(o, StreamClosed) for o in outcomes) == len(states) - 1
        terminals = [e for e in await store.read("s1") if e.type == "run.finished"]
        assert [(e.seq, e.data) for e in terminals] == [(2, winners[0][0].data)]
        await store.aclose()

    asyncio.run(main())


def test_late_output_racing_the_terminal_never_lands_after_it(backend: Backend) -> None:
    """A worker that keeps appending while Stop (or the reclaimer) writes the terminal: what
    the log holds of the stream ends at its run.finished, and the worker is told so."""

    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "t"})])
        refused = asyncio.Event()

        async def wedged_worker(n: int) -> None:
            i = 0
            while True:
                try:
                    await store.append(
                        "s1", [Draft("text.delta", {"n": n, "i": i}, stream_id="r1")]
                    )
                except StreamClosed:
                    refused.set()
                    return
                i += 1

        workers = [asyncio.create_task(wedged_worker(n)) for n in range(8)]
        while (await store.last_seq("s1") or 0) < 10:  # the workers are writing
            await asyncio.sleep(0.001)
        await store.append("s1", [finished("r1", "cancelled")])
        await asyncio.wait_for(asyncio.gather(*workers), timeout=30)
        assert refused.is_set()
        stream = [e for e in await store.read("s1") if e.stream_id == "r1"]
        assert stream[-1].type == "run.finished"
        assert [e.type for e in stream].count("run.finished") == 1
        await store.aclose()

    asyncio.run(main())
