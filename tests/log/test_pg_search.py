"""PostgreSQL's search, layer: the log's full-text index (log/pg_search.py). Invariant: what
`search` finds is the fold over the committed log, and nothing a user typed is read as query
syntax. These are the PostgreSQL-specific parts the backend contract suite does not reach:
to_tsquery's operators in a query, a NUL the index cannot hold, a snippet that marks an
accented word while showing it as written, and an import's rows found in the transaction
that creates its sessions."""

from __future__ import annotations

import asyncio

from pg import database

from tether.log import Draft
from tether.log.postgres import PostgresEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change


def _store(url: str) -> PostgresEventStore:
    return PostgresEventStore(
        url,
        index_fold=fold_row,
        index_version=SIDEBAR_FOLD_VERSION,
        search_fold=search_change,
        search_version=SEARCH_FOLD_VERSION,
    )


def _asked(turn: str, text: str) -> list[Draft]:
    data = {"turn_id": turn, "stream_id": f"st_{turn}", "text": text, "submitted_at": 1.0}
    return [Draft("turn.submitted", data, stream_id=f"st_{turn}", turn_id=turn)]


def test_query_syntax_is_plain_text_and_accents_are_marked_as_written() -> None:
    async def main(url: str) -> None:
        store = _store(url)
        await store.create_session("s1", [Draft("session.created", {})])
        await store.append("s1", _asked("t1", "Un café à Zürich & co"))
        await store.append("s1", _asked("t2", "nul\x00byte kept out of the index"))
        for odd in (["&|!"], ["'"], ["\\"], ["(x"], ["<->"], ["a:*b"]):
            assert await store.search(odd, 10) == []  # no syntax error, nothing matched
        # a wordless term (search_terms never sends one) adds no condition
        assert [h.row_id for h in await store.search(["café", "!"], 10)] == ["t1"]
        [hit] = await store.search(["cafe"], 10)
        assert ("café", True) in hit.snippet
        assert "".join(text for text, _ in hit.snippet) == "Un café à Zürich & co"
        [nul] = await store.search(["byte"], 10)
        assert nul.row_id == "t2"
        await store.aclose()

    with database() as url:
        asyncio.run(main(url))


def test_an_import_is_searchable_at_once_and_a_refused_one_leaves_nothing() -> None:
    async def main(url: str) -> None:
        store = _store(url)
        await store.create_session("old", [Draft("session.created", {})])
        made = await store.create_sessions(
            [("i1", [Draft("session.created", {}, at=5.0), *_asked("q1", "imported kestrel")])],
            owner="usr_a",
        )
        assert [e.seq for e in made[0]] == [1, 2]
        assert [h.row_id for h in await store.search(["kestrel"], 10)] == ["q1"]
        assert await store.session_owner("i1") == "usr_a"
        try:
            await store.create_sessions(
                [
                    ("i2", [Draft("session.created", {}), *_asked("q2", "refused merlin")]),
                    ("old", [Draft("session.created", {})]),
                ],
                owner="usr_a",
            )
        except Exception as exc:
            assert type(exc).__name__ == "SessionExists"
        else:
            raise AssertionError("an existing session was created again")
        assert await store.search(["merlin"], 10) == []
        assert await store.last_seq("i2") is None
        assert await store.session_owner("i2") is None
        await store.aclose()

    with database() as url:
        asyncio.run(main(url))
