"""Backend contract, layer: the full-text search index (docs/api.md §13) a backend keeps from
the `SearchFold` in the transaction of its events. Invariant: what `search` finds is the
fold over the committed logs, never behind and never ahead (a refused or failed batch
indexes nothing, a deleted session's rows are gone, a truncated row is kept as a branch, a
reopen or a new fold version rebuilds from the log). Every backend runs these with the real
fold."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from backend_kit import Backend
from test_contract_durability import read_acks_then_kill

from tether.log import Draft
from tether.log.errors import StreamClosed
from tether.log.store import EventStore, SearchHit
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change

SEARCH = (search_change, SEARCH_FOLD_VERSION)
SEARCH_WRITER = Path(__file__).with_name("crash_search_writer.py")


async def open_store(backend: Backend, version: str = SEARCH_FOLD_VERSION) -> EventStore:
    return await backend.open(fold_row, SIDEBAR_FOLD_VERSION, (search_change, version))


def submitted(turn: str, stream: str, text: str) -> Draft:
    data = {"turn_id": turn, "stream_id": stream, "text": text, "submitted_at": 10.0}
    return Draft("turn.submitted", data, stream_id=stream, turn_id=turn)


def delta(stream: str, item: str, text: str) -> Draft:
    return Draft("text.delta", {"item_id": item, "text": text}, stream_id=stream)


def finished(stream: str, state: str = "completed") -> Draft:
    return Draft("run.finished", {"state": state}, stream_id=stream)


async def a_turn(store: EventStore, sid: str, n: int, question: str, *answer: str) -> None:
    stream = f"{sid}_st{n}"
    await store.append(sid, [submitted(f"{sid}_t{n}", stream, question)])
    for i, part in enumerate(answer):
        await store.append(sid, [delta(stream, "t1" if i < 2 else "t2", part)])
    await store.append(sid, [finished(stream)])


def found(hits: list[SearchHit]) -> list[tuple[str, str, str]]:
    return sorted((h.session_id, h.row_id, h.role) for h in hits)


def text_of(hit: SearchHit) -> str:
    return "".join(text for text, _ in hit.snippet)


def test_settled_rows_are_found_with_marked_snippets(backend: Backend) -> None:
    async def main() -> None:
        store = await open_store(backend)
        await store.create_session("s1", [Draft("session.created", {})])
        await a_turn(store, "s1", 1, "Where do puffins nest?", "Puffins ", "nest in ", "burrows.")
        # an answer still streaming is not a row yet
        await store.append("s1", [submitted("s1_t2", "s1_st2", "and gannets?")])
        await store.append("s1", [delta("s1_st2", "t1", "Gannets nest on cliffs")])
        assert found(await store.search(["puffins"], 10)) == [
            ("s1", "s1_st1", "assistant"),
            ("s1", "s1_t1", "user"),
        ]
        assert found(await store.search(["cliffs"], 10)) == []
        assert found(await store.search(["gannets"], 10)) == [("s1", "s1_t2", "user")]
        answer = next(h for h in await store.search(["nest"], 10) if h.role == "assistant")
        assert text_of(answer) == "Puffins nest in \n\nburrows."
        assert ("nest", True) in answer.snippet
        # every term; the last one as a prefix; case ignored
        assert found(await store.search(["PUFFINS", "bur"], 10)) == [("s1", "s1_st1", "assistant")]
        assert found(await store.search(["puffins", "gannets"], 10)) == []
        await store.append("s1", [finished("s1_st2", "cancelled")])
        assert found(await store.search(["cliffs"], 10)) == [("s1", "s1_st2", "assistant")]
        assert len(await store.search(["nest"], 1)) == 1
        # accents are ignored both ways
        await store.append("s1", [submitted("s1_t3", "s1_st3", "Un café à Zürich")])
        assert found(await store.search(["cafe", "zurich"], 10)) == [("s1", "s1_t3", "user")]
        assert found(await store.search(["CAFÉ"], 10)) == [("s1", "s1_t3", "user")]
        # a last word under 3 characters matches whole, never as a prefix
        assert found(await store.search(["pu"], 10)) == []
        assert found(await store.search(["puf"], 10)) != []
        await store.aclose()

    asyncio.run(main())


def test_a_session_created_whole_is_indexed_as_if_appended_event_by_event(
    backend: Backend,
) -> None:
    """An import writes a session's whole log in one call, and the writer then reads its
    finished streams from what it wrote instead of back from the database: the rows must be
    the ones the same events appended one by one give (interleaved items, a stream with no
    text, a cancelled answer)."""

    def log(sid: str) -> list[Draft]:
        return [
            Draft("session.created", {}),
            submitted(f"{sid}_t1", f"{sid}_st1", "Where do puffins nest?"),
            delta(f"{sid}_st1", "t1", "Puffins "),
            delta(f"{sid}_st1", "t2", "(aside) "),
            delta(f"{sid}_st1", "t1", "nest in burrows."),
            finished(f"{sid}_st1"),
            submitted(f"{sid}_t2", f"{sid}_st2", "and gannets?"),
            finished(f"{sid}_st2", "error"),
            submitted(f"{sid}_t3", f"{sid}_st3", "and terns?"),
            delta(f"{sid}_st3", "t1", "Terns nest on beaches"),
            finished(f"{sid}_st3", "cancelled"),
        ]

    def rows(hits: list[SearchHit], sid: str) -> list[tuple[str, str, str]]:
        return sorted(
            (h.row_id.removeprefix(sid), h.role, text_of(h)) for h in hits if h.session_id == sid
        )

    async def main() -> None:
        store = await open_store(backend)
        await store.create_sessions([("whole", log("whole"))])
        appended = log("parts")
        await store.create_session("parts", appended[:1])
        for draft in appended[1:]:
            await store.append("parts", [draft])
        for words in (["nest"], ["puffins"], ["aside"], ["gannets"], ["terns"], ["beaches"]):
            hits = await store.search(words, 20)
            assert rows(hits, "whole") == rows(hits, "parts"), words
            assert rows(hits, "whole"), words
        await store.aclose()

    asyncio.run(main())


def test_a_refused_append_indexes_nothing(backend: Backend) -> None:
    async def main() -> None:
        store = await open_store(backend)
        await store.create_session("s1", [Draft("session.created", {})])
        await a_turn(store, "s1", 1, "ptarmigan", "one ptarmigan answer")
        refused: Any = None
        try:
            # the stream is closed: the new user row in the same append must not be indexed
            await store.append(
                "s1", [submitted("s1_t9", "s1_st9", "ptarmigan again"), delta("s1_st1", "t", "x")]
            )
        except StreamClosed as exc:
            refused = exc
        assert refused is not None
        assert len(await store.search(["ptarmigan"], 10)) == 2
        await store.aclose()

    asyncio.run(main())


def test_deletion_removes_rows_and_a_truncation_keeps_them(backend: Backend) -> None:
    """A truncation hides rows as a branch (docs/api.md §10): nothing of it leaves the index;
    only deleting the session does."""

    async def main() -> None:
        store = await open_store(backend)
        for sid in ("s1", "s2"):
            await store.create_session(sid, [Draft("session.created", {})])
            await a_turn(store, sid, 1, "heron one", "heron answer one")
            await a_turn(store, sid, 2, "heron two", "heron answer two")
        await store.delete_session("s2")
        assert {h.session_id for h in await store.search(["heron"], 10)} == {"s1"}
        data = {"keep_count": 2, "transcript_generation": 1}
        await store.append("s1", [Draft("transcript.truncated", data)])
        every_row = [
            ("s1", "s1_st1", "assistant"),
            ("s1", "s1_st2", "assistant"),
            ("s1", "s1_t1", "user"),
            ("s1", "s1_t2", "user"),
        ]
        assert found(await store.search(["heron"], 10)) == every_row
        # a regenerate writes no user row; its new answer is found at its run.finished
        regenerate = {"turn_id": "s1_t1", "stream_id": "s1_st3", "text": "", "regenerate": True}
        await store.append(
            "s1", [Draft("transcript.truncated", {"keep_count": 1, "transcript_generation": 2})]
        )
        await store.append(
            "s1", [Draft("turn.submitted", regenerate, stream_id="s1_st3", turn_id="s1_t1")]
        )
        await store.append("s1", [delta("s1_st3", "t1", "heron answer three"), finished("s1_st3")])
        every_row.insert(2, ("s1", "s1_st3", "assistant"))
        assert found(await store.search(["heron"], 10)) == every_row
        await store.aclose()
        reopened = await open_store(backend, version="search-rebuilt")
        assert found(await reopened.search(["heron"], 10)) == every_row
        await reopened.aclose()

    asyncio.run(main())


def test_imported_agent_turns_are_found(backend: Backend) -> None:
    async def main() -> None:
        store = await open_store(backend)
        await store.create_session("s1", [Draft("session.created", {})])
        entry = {
            "kind": "turn",
            "turn_id": "a_1",
            "rows": [
                {"row_id": 1, "role": "user", "content": "from the cli", "timestamp": 5.0},
                {"row_id": 2, "role": "assistant", "content": "cli answer", "timestamp": 6.0},
            ],
            "context": [],
        }
        await store.append("s1", [Draft("agent.imported", {"watermark": 2, "entries": [entry]})])
        assert found(await store.search(["cli"], 10)) == [
            ("s1", "a_1", "user"),
            ("s1", "a_1.reply", "assistant"),
        ]
        await store.aclose()

    asyncio.run(main())


def test_a_new_fold_version_rebuilds_the_index_from_the_log(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open(fold_row, SIDEBAR_FOLD_VERSION)  # no search fold at all
        await store.create_session("s1", [Draft("session.created", {})])
        await a_turn(store, "s1", 1, "egret", "egret answer")
        assert await store.search(["egret"], 10) == []
        await store.aclose()
        store = await open_store(backend)
        assert len(await store.search(["egret"], 10)) == 2
        await store.aclose()
        store = await open_store(backend, "search-test-2")
        assert len(await store.search(["egret"], 10)) == 2
        await store.aclose()

    asyncio.run(main())


def test_a_word_in_very_many_rows_ranks_the_newest_matches(backend: Backend) -> None:
    """BM25 over every match of a word in most rows would cost hundreds of ms at a million
    events: the backend ranks a bounded set of the newest matches (SQLite: 2,000)."""

    async def main() -> None:
        store = await open_store(backend)
        await store.create_session("s1", [Draft("session.created", {})])
        # the oldest rows match best (the word three times in a short row), then 2,500 newer
        # rows that match once among other words
        old = [submitted(f"old{n}", f"os{n}", "gull gull gull") for n in range(20)]
        await store.append("s1", old + [finished(f"os{n}") for n in range(20)])
        for batch in range(5):
            new = [
                submitted(
                    f"new{batch}_{n}", f"ns{batch}_{n}", "a gull flew over the long harbour wall"
                )
                for n in range(500)
            ]
            await store.append("s1", new + [finished(f"ns{batch}_{n}") for n in range(500)])
        hits = await store.search(["gull"], 10)
        assert len(hits) == 10
        assert all(h.row_id.startswith("new") for h in hits)
        # a rarer word is ranked over all its rows: the best match comes first, however old
        await store.append("s1", [submitted("rare", "rs", "tern"), finished("rs")])
        await store.append("s1", [submitted("rare2", "rs2", "tern tern tern"), finished("rs2")])
        assert [h.row_id for h in await store.search(["tern"], 10)] == ["rare2", "rare"]
        await store.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_after_sigkill_the_index_holds_exactly_the_committed_rows(backend: Backend) -> None:
    """Killed mid-batch, the writer leaves an index that matches its log without any rebuild
    (the stored fold version is current): each question in the log is found, each answer is
    found exactly when its `run.finished` is in the log."""
    child = subprocess.Popen(
        [sys.executable, str(SEARCH_WRITER), json.dumps(backend.spec())],
        stdout=subprocess.PIPE,
        cwd=SEARCH_WRITER.parent,
    )
    try:
        read_acks_then_kill(child, 400, timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL

    async def main() -> None:
        store = await open_store(backend)
        for k in range(8):
            events = await store.read(f"c{k}")
            asked = [e.data["turn_id"] for e in events if e.type == "turn.submitted"]
            answered = {e.stream_id for e in events if e.type == "run.finished"}
            assert asked, "the writer was killed before this session asked anything"
            for n in range(len(asked)):
                question = await store.search([f"q{k}x{n}y"], 5)
                assert [(h.row_id, h.role) for h in question] == [(f"c{k}_t{n}", "user")]
                answer = await store.search([f"a{k}x{n}y"], 5)
                expected = [(f"c{k}_s{n}", "assistant")] if f"c{k}_s{n}" in answered else []
                assert [(h.row_id, h.role) for h in answer] == expected
        await store.aclose()

    asyncio.run(main())


def test_an_owners_search_ranks_the_newest_of_their_own_rows(backend: Backend) -> None:
    """With an owner, the bounded window of newest matches that is ranked (RANKED_MAX) is
    that person's: another person's newer matches, however many, do not push theirs out,
    and are never found for them."""

    async def main() -> None:
        store = await open_store(backend)
        await store.create_session("hers", [Draft("session.created", {})], owner="usr_a")
        await store.append("hers", [submitted("h_t1", "h_st1", "a kestrel over the dunes")])
        await store.create_session("his", [Draft("session.created", {})], owner="usr_b")
        many = []
        for n in range(2005):  # more than either backend ranks
            many += [submitted(f"t{n}", f"st{n}", f"kestrel {n}"), finished(f"st{n}")]
        await store.append("his", many)
        assert found(await store.search(["kestrel"], 10, "usr_a")) == [("hers", "h_t1", "user")]
        assert {h.session_id for h in await store.search(["kestrel"], 10, "usr_b")} == {"his"}
        assert await store.search(["kestrel"], 10, "usr_c") == []
        assert len(await store.search(["kestrel"], 10)) == 10  # everyone's, as before
        await store.aclose()

    asyncio.run(main())
