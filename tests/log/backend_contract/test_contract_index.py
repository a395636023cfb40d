"""Backend contract, layer: the sidebar row (the index fold the backend keeps beside the
log) and the event queries. The index state of a session is the fold over its log, each
event folded once, in order, whatever the concurrency and across reopening; a stale state or
a new fold version is rebuilt from the log. Each event query answers what a scan of every
log answers (invariant 4 depends on the row never drifting from the events)."""

from __future__ import annotations

import asyncio
from typing import Any

from backend_kit import Backend, other_probe_fold, probe_fold

from tether.events import Event
from tether.log import Draft
from tether.log.store import EventStore, IndexFold
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row


def fold_all(fold: IndexFold, events: list[Event]) -> dict[str, Any] | None:
    state = None
    for event in events:
        state = fold(state, event)
    return state


async def logs(store: EventStore) -> dict[str, list[Event]]:
    return {sid: await store.read(sid) for sid in await store.index_states()}


def test_each_event_is_folded_once_in_order_under_concurrency(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        sids = [f"s{n}" for n in range(4)]
        for sid in sids:
            await store.create_session(sid, [Draft("session.created", {"title": sid})])

        async def appender(sid: str, n: int) -> None:
            for i in range(15):
                await store.append(sid, [Draft("a", {"n": n, "i": i})] * (1 + i % 2))

        await asyncio.gather(*(appender(sid, n) for sid in sids for n in range(5)))
        await store.delete_session("s3")
        states = await store.index_states()
        assert sorted(states) == ["s0", "s1", "s2"]
        for sid in sids[:3]:
            last = await store.last_seq(sid)
            assert states[sid]["seqs"] == list(range(1, (last or 0) + 1))
            assert await store.index_state(sid) == fold_all(probe_fold, await store.read(sid))
        assert await store.index_state("s3") is None
        await store.aclose()
        reopened = await backend.open()
        assert await reopened.index_states() == states
        await reopened.aclose()

    asyncio.run(main())


def test_the_sidebar_row_is_the_fold_of_a_real_session(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open(fold_row, SIDEBAR_FOLD_VERSION)
        await store.create_session("s1", [Draft("session.created", {"title": None})])
        turn = {"turn_id": "u1", "stream_id": "r1", "text": "Plan the trip", "attachments": []}
        await store.append("s1", [Draft("turn.submitted", turn, "r1", "u1")])
        await store.append("s1", [Draft("run.started", {}, "r1", "u1")])
        await store.append(
            "s1", [Draft("text.delta", {"item_id": "i1", "text": "Sure."}, "r1", "u1")]
        )
        await store.append("s1", [Draft("run.finished", {"state": "completed"}, "r1", "u1")])
        await store.append("s1", [Draft("session.updated", {"pinned": True, "title": "Trip"})])
        row = await store.index_state("s1")
        assert row == fold_all(fold_row, await store.read("s1"))
        assert row is not None and (row["title"], row["pinned"]) == ("Trip", True)
        await store.aclose()

    asyncio.run(main())


def test_a_stale_index_state_is_rebuilt_from_the_log_on_open(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.create_session("s1", [Draft("session.created", {"title": "kept"})])
        await store.append("s1", [Draft("a")] * 3)
        await store.aclose()
        backend.make_index_stale("s1")
        reopened = await backend.open()
        assert (await reopened.index_state("s1"))["seqs"] == [1, 2, 3, 4]
        await reopened.aclose()

    asyncio.run(main())


def test_a_new_fold_version_rebuilds_every_index_state(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        for sid in ("s1", "s2"):
            await store.create_session(sid, [Draft("session.created", {"title": sid})])
        await store.append("s1", [Draft("a")] * 4)
        await store.aclose()
        newer = await backend.open(other_probe_fold, "probe-2")
        assert await newer.index_states() == {
            "s1": {"session_id": "s1", "count": 5},
            "s2": {"session_id": "s2", "count": 1},
        }
        await newer.append("s2", [Draft("b")])
        assert await newer.index_state("s2") == {"session_id": "s2", "count": 2}
        await newer.aclose()

    asyncio.run(main())


# -- event queries, against their definitions in log/store.py ----------------------------------


def open_streams(logs: dict[str, list[Event]]) -> set[tuple[str, str, str | None]]:
    finished = {e.stream_id for evs in logs.values() for e in evs if e.type == "run.finished"}
    return {
        (e.session_id, e.stream_id, e.turn_id)
        for evs in logs.values()
        for e in evs
        if e.type == "turn.submitted" and e.stream_id and e.stream_id not in finished
    }


def submit(n: int, text: str, attachment: str | None = None, blob: str = "") -> Draft:
    """A turn; with `attachment`, a new upload of it whose bytes are `blob`."""
    refs = [{"id": attachment, "name": f"{attachment}.txt", "mime": "text/plain", "size": 1}]
    data: dict[str, Any] = {"turn_id": f"u{n}", "stream_id": f"r{n}", "text": text}
    data["attachments"] = refs if attachment else []
    blobs = {attachment: blob} if attachment else {}
    return Draft("turn.submitted", data, f"r{n}", f"u{n}", blobs=blobs)


def test_event_queries_answer_what_a_scan_of_the_logs_answers(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        for sid in ("s1", "s2", "s3"):
            await store.create_session(sid, [Draft("session.created", {"title": "Queue"})])
        await store.append("s1", [submit(1, "Find the Invoice", "att-1", "blob-shared")])
        await store.append("s1", [Draft("run.finished", {"state": "completed"}, "r1", "u1")])
        await store.append("s1", [submit(2, "then the receipt")])
        await store.append("s2", [submit(3, "invoices, again", "att-2", "blob-shared")])
        await store.append("s2", [submit(4, "and this", "att-3", "blob-own")])
        await store.append("s2", [Draft("queue.added", {"queue_id": "q1", "text": "later"})])
        await store.append("s3", [Draft("text.delta", {"text": "invoice"})])  # not a turn
        await store.append("s3", [Draft("queue.added", {"queue_id": "q2", "text": "x"})])

        scanned = await logs(store)
        assert set(await store.unfinished_streams()) == open_streams(scanned)
        assert [tuple(s) for s in await store.unfinished_streams()] == [
            ("s1", "r2", "u2"),
            ("s2", "r3", "u3"),
            ("s2", "r4", "u4"),
        ]  # in append order
        # One run looked up (a Stop through a replica that does not run it): by its stream,
        # or the newest of its session; a finished one, or a session without one, is None.
        assert await store.unfinished_stream(stream_id="r3") == ("s2", "r3", "u3")
        assert await store.unfinished_stream(session_id="s2") == ("s2", "r4", "u4")
        assert await store.unfinished_stream(session_id="s1") == ("s1", "r2", "u2")
        assert await store.unfinished_stream(stream_id="r1") is None
        assert await store.unfinished_stream(session_id="s3") is None
        assert await store.unfinished_stream(stream_id="r9") is None
        assert await store.search_text("INVOICE") == {"s1", "s2"}
        assert await store.search_text("receipt") == {"s1"}
        assert await store.search_text("queue") == set()  # titles are the row's, not text
        assert await store.search_text("n t") == {"s1"}  # a piece of text, spaces included
        for literal in ("n_t", "%", "_", "\\"):  # pattern characters are text, not wildcards
            assert await store.search_text(literal) == set(), literal
        assert await store.queue_session("q1") == "s2"
        assert await store.queue_session("q2") == "s3"
        assert await store.queue_session("q3") is None
        # Uploads are per session: the same bytes under two names stay two uploads.
        upload = await store.attachment("att-1", "s1")
        assert upload is not None
        assert (upload["name"], upload["blob"]) == ("att-1.txt", "blob-shared")
        assert await store.attachment("att-1", "s2") is None  # not s2's upload
        assert (await store.attachment("att-2", None) or {}).get("session_id") == "s2"
        assert await store.session_blobs("s2") == {"blob-shared", "blob-own"}
        assert await store.blob_in_use("blob-shared")
        assert await store.blob_in_use("blob-own")
        assert not await store.blob_in_use("blob-none")

        await store.delete_session("s2")
        assert await store.blob_in_use("blob-shared")  # s1 still holds it
        assert not await store.blob_in_use("blob-own")
        assert await store.attachment("att-2", None) is None
        assert await store.session_blobs("s2") == set()
        assert await store.queue_session("q1") is None
        assert await store.search_text("invoice") == {"s1"}
        assert set(await store.unfinished_streams()) == open_streams(await logs(store))
        assert await store.unfinished_stream(stream_id="r4") is None  # its session is gone
        await store.append("s1", [Draft("run.finished", {"state": "interrupted"}, "r2", "u2")])
        assert await store.unfinished_streams() == []
        assert await store.unfinished_stream(session_id="s1") is None
        await store.aclose()

    asyncio.run(main())
