"""The PostgreSQL log's hot reads cost what they read, not the size of the log, on a real
server (log/pg_reads.py READ_AFTER_SQL, log/pg_search.py, migration m010). Layer (named as
contract invariant 8 asks): the log, its reads. Invariants: the fan-out's catch-up, run by
every replica for every commit of another, returns exactly the events after each cursor,
in seq order per session, through the primary key; the search fold's read of a finished
run's text goes through `events_by_stream`. Before, both scanned the whole events table,
the first once per commit per replica and the second inside the writer's transaction."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pg import database

psycopg = pytest.importorskip("psycopg")

from tether.log import pg_reads  # noqa: E402
from tether.log.pg_reads import READ_AFTER_SQL  # noqa: E402
from tether.log.pg_schema import apply_migrations  # noqa: E402
from tether.log.pg_search import STREAM_SQL  # noqa: E402
from tether.log.postgres import PostgresEventStore  # noqa: E402
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row  # noqa: E402

SESSIONS = 50
PER_SESSION = 400  # 20,000 events: a seq scan costs several times the index ranges


@contextmanager
def analysed_log(*statements: tuple[str, tuple]) -> Iterator[str]:
    """A throwaway database with the log's schema, filled by `statements`, then analysed."""
    with database() as made:
        with psycopg.connect(made, autocommit=True) as db:
            apply_migrations(db)
            for sql, params in statements:
                db.execute(sql, params)  # type: ignore[arg-type]
            db.execute("ANALYZE")
        yield made


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A log of SESSIONS sessions, each PER_SESSION deltas in runs of 40, analysed."""
    with analysed_log(
        (
            "INSERT INTO sessions (session_id, last_seq) "
            "SELECT 's' || n, %s FROM generate_series(0, %s) n",
            (PER_SESSION, SESSIONS - 1),
        ),
        (
            "INSERT INTO events (session_id, seq, type, at, stream_id, data) "
            "SELECT 's' || n, g, 'text.delta', g, 's' || n || '-' || (g / 40), "
            "json_build_object('text', 'd' || g)::text "
            "FROM generate_series(0, %s) n, generate_series(1, %s) g ORDER BY n, g",
            (SESSIONS - 1, PER_SESSION),
        ),
    ) as made:
        yield made


def scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(node type, relation) of every node of an EXPLAIN (FORMAT JSON) plan."""
    found = [(plan["Node Type"], plan.get("Relation Name", ""))]
    for child in plan.get("Plans", []):
        found.extend(scans(child))
    return found


def plan_of(url: str, sql: str, params: tuple) -> list[tuple[str, str]]:
    with psycopg.connect(url, autocommit=True) as db:
        (rows,) = db.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()  # type: ignore[misc]
    return scans((rows if isinstance(rows, list) else json.loads(rows))[0]["Plan"])


def test_the_fan_out_read_takes_each_session_from_its_cursor_not_the_whole_log(
    url: str,
) -> None:
    cursors = {f"s{n}": PER_SESSION - 10 for n in range(0, SESSIONS, 3)}
    plan = plan_of(url, READ_AFTER_SQL, (list(cursors), list(cursors.values())))
    assert ("Seq Scan", "events") not in plan, plan
    assert any(relation == "events" for _, relation in plan), plan

    async def read() -> list[tuple[str, int, str]]:
        store = PostgresEventStore(url, index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION)
        try:
            cursors["s1"] = 0  # a session read whole beside ones read from their cursors
            return [(e.session_id, e.seq, e.data["text"]) for e in await store._read_after(cursors)]
        finally:
            await store.aclose()

    got = asyncio.run(read())
    want = [
        (sid, seq, f"d{seq}")
        for sid in sorted(cursors)
        for seq in range(cursors[sid] + 1, PER_SESSION + 1)
    ]
    assert got == want


def test_a_finished_runs_text_is_read_through_its_stream_index(url: str) -> None:
    plan = plan_of(url, STREAM_SQL, ("s7-3", ["text.delta"]))
    assert ("Seq Scan", "events") not in plan, plan
    with psycopg.connect(url, autocommit=True) as db:
        rows = db.execute(STREAM_SQL, ("s7-3", ["text.delta"])).fetchall()
    assert [row[1] for row in rows] == list(range(120, 160))


TURN_SESSIONS = 2000
TURNS = 20  # each a turn.submitted and 9 deltas; every turn finished but each session's last


@pytest.fixture(scope="module")
def turns_url() -> Iterator[str]:
    """TURN_SESSIONS sessions of TURNS turns each, every run finished but the last one's."""
    with analysed_log(
        (
            "INSERT INTO events (session_id, seq, type, at, stream_id, turn_id, data, "
            "search_text) "
            "SELECT 's' || n, g, CASE WHEN g %% 10 = 1 THEN 'turn.submitted' "
            "ELSE 'text.delta' END, g, 's' || n || '-r' || (g / 10), "
            "'s' || n || '-u' || (g / 10), '{}', "
            "CASE WHEN g %% 10 = 1 THEN 'Question ' || n || '.' || g || ' of the day' END "
            "FROM generate_series(0, %s) n, generate_series(1, %s) g ORDER BY n, g",
            (TURN_SESSIONS - 1, TURNS * 10),
        ),
        (
            "INSERT INTO closed_streams (stream_id, session_id) "
            "SELECT 's' || n || '-r' || t, 's' || n "
            "FROM generate_series(0, %s) n, generate_series(0, %s) t",
            (TURN_SESSIONS - 1, TURNS - 2),
        ),
        (
            "INSERT INTO sessions (session_id, last_seq, open_stream) "
            "SELECT 's' || n, %s, 's' || n || '-r' || %s FROM generate_series(0, %s) n",
            (TURNS * 10, TURNS - 1, TURN_SESSIONS - 1),
        ),
    ) as made:
        yield made


def indexes(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(node type, relation, index) of every node of a plan."""
    found = [(plan["Node Type"], plan.get("Relation Name", ""), plan.get("Index Name", ""))]
    for child in plan.get("Plans", []):
        found.extend(indexes(child))
    return found


def test_the_run_a_stop_elsewhere_acts_on_is_found_without_scanning_every_turn(
    turns_url: str,
) -> None:
    """A Stop, a steer or an answer through a replica that does not run the run looks it up
    (runs/controls.py): by its stream, or as its session's newest unfinished turn. Scanning
    every turn of the log cost about 100 ms at 200,000 turns."""
    last = TURNS - 1
    by_stream = pg_reads._UNFINISHED_SQL + "AND t.stream_id=%s ORDER BY t.id DESC LIMIT 1"
    for sql, params in (
        (by_stream, ("turn.submitted", f"s7-r{last}")),
        (pg_reads._OPEN_RUN_SQL, ("s7", "turn.submitted")),
    ):
        with psycopg.connect(turns_url, autocommit=True) as db:
            (rows,) = db.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()  # type: ignore[misc]
        plan = indexes((rows if isinstance(rows, list) else json.loads(rows))[0]["Plan"])
        assert not any(n == "Seq Scan" and r in ("events", "closed_streams") for n, r, _ in plan)
        assert not any(i == "events_turns" for _, _, i in plan), plan

    async def lookups() -> list[Any]:
        store = PostgresEventStore(
            turns_url, index_fold=lambda state, event: {}, index_version="plans-1"
        )
        try:
            return [
                await store.unfinished_stream(stream_id=f"s7-r{last}"),
                await store.unfinished_stream(session_id="s7"),
                await store.unfinished_stream(stream_id="s7-r3"),  # finished
            ]
        finally:
            await store.aclose()

    open_run = ("s7", f"s7-r{last}", f"s7-u{last}")
    assert [None if s is None else tuple(s) for s in asyncio.run(lookups())] == [
        open_run,
        open_run,
        None,
    ]


def test_the_session_lists_q_reads_the_trigram_index(turns_url: str) -> None:
    """`q` (docs/api.md §3) through migration m011's trigram index, not a read of every
    turn's text (at 200,000 turns a rare piece of text took 12.7 ms where that read took
    290; with fewer turns than here the planner rightly prefers the turns' own index). The
    server of this suite offers `pg_trgm`; one without it keeps the scan."""
    with psycopg.connect(turns_url, autocommit=True) as db:
        made = db.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'events_turn_text'")
        if made.fetchone() is None:
            offered = db.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
            assert offered.fetchone() is None, "pg_trgm is offered but m011 made no index"
            pytest.skip("this PostgreSQL server does not offer pg_trgm: q scans, as designed")
        sql = pg_reads.SEARCH_TEXT_SQL
        (rows,) = db.execute(  # type: ignore[misc]
            f"EXPLAIN (FORMAT JSON) {sql}", ("%question 7.151 of%",)
        ).fetchone()
    plan = indexes((rows if isinstance(rows, list) else json.loads(rows))[0]["Plan"])
    assert any(i == "events_turn_text" for _, _, i in plan), plan

    async def found() -> list[set[str]]:
        store = PostgresEventStore(
            turns_url, index_fold=lambda state, event: {}, index_version="plans-1"
        )
        try:
            return [await store.search_text(q) for q in ("QUESTION 7.151 OF", "7.15_", "day")]
        finally:
            await store.aclose()

    first, escaped, everywhere = asyncio.run(found())
    assert first == {"s7"}
    assert escaped == set()  # `_` is text: no turn has "7.15_"
    assert len(everywhere) == TURN_SESSIONS
