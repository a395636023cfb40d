"""Races and failures between replicas and their database (layer: the log, several replicas
on one PostgreSQL database; contract invariants 3 and 5 as invariant 8 asks: every committed
event published once per replica, in seq order, after a deletion of its session it follows;
contiguous seqs with a counter row per session; lock orders without cycles; a run taken over
settled; a refusal failing only its own operation). Each test is deterministic where it can
be: another connection holds the row locks, or a trigger stalls a statement, that decide
the interleaving, as tests/log/test_pg_writer_batches.py does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from pg import private_server

from tether.events import Event
from tether.log import Draft, Hub, StorageError
from tether.log.errors import InvalidEvent
from tether.log.postgres import PostgresEventStore
from tether.runs import leases

pytestmark = pytest.mark.slow


def probe(state: dict | None, event: Event) -> dict:
    return {"n": (state or {"n": 0})["n"] + 1}


def open_store(
    url: str, replica: str, version: str = "p1", poll: float = 1.0
) -> PostgresEventStore:
    return PostgresEventStore(
        url, index_fold=probe, index_version=version, replica_id=replica, poll_seconds=poll
    )


async def _lock_waiters(admin: psycopg.AsyncConnection, count: int) -> None:
    """Until `count` backends of this database wait for a lock (10 s at most)."""
    for _ in range(200):
        cur = await admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        row = await cur.fetchone()
        if row is not None and row[0] >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} backends waiting for a lock")


def test_a_replica_rebuilding_index_states_at_start_never_deadlocks_with_a_writer(
    url: str,
) -> None:
    """A rolling upgrade with a new index version: the starting replica rebuilds every
    session's index state, locking their counter rows. A running replica's batch locks its
    sessions in session-id order; the rebuild must take them in the same order, or the two
    wait for each other (PostgreSQL then aborts one of them: an append, or the start)."""

    async def main() -> None:
        running = open_store(url, "running")
        for sid in ("s1", "s2", "s3"):
            await running.create_session(sid, [Draft("session.created", {})])
        await running.append("s1", [Draft("note", {})])  # s1's row version moves to the end
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            cur = await admin.execute("SELECT session_id FROM sessions")
            assert [r[0] for r in await cur.fetchall()] == ["s2", "s3", "s1"]  # heap order
            async with await psycopg.AsyncConnection.connect(url) as other:
                await other.execute("SELECT 1 FROM sessions WHERE session_id='s3' FOR UPDATE")
                # the new replica starts: it rebuilds the states (another index version)
                starting = asyncio.create_task(asyncio.to_thread(open_store, url, "starting", "p2"))
                await _lock_waiters(admin, 1)  # it holds s2, waits for s3
                batch = asyncio.gather(
                    running.append("s1", [Draft("note", {"n": 1})]),
                    running.append("s2", [Draft("note", {"n": 2})]),
                    return_exceptions=True,
                )  # one batch: it locks s1, then waits for s2
                await _lock_waiters(admin, 2)
                await other.commit()  # the rebuild takes s3, then waits for s1
            outcomes = await asyncio.wait_for(batch, 15)
            try:
                started = await asyncio.wait_for(starting, 15)
            except StorageError as exc:
                started = exc
        assert not isinstance(started, Exception), started
        assert not any(isinstance(o, Exception) for o in outcomes), outcomes
        assert [[e.seq for e in o] for o in outcomes] == [[3], [2]]
        await started.aclose()
        await running.aclose()

    asyncio.run(main())


def _record(hub: Hub) -> list[tuple]:
    """What `hub` publishes of session "s", in order: ("event", seq) and ("deleted", "s")."""
    heard: list = []
    hub.on_batch(
        lambda events: heard.extend(("event", e.seq) for e in events if e.session_id == "s")
    )
    hub.on_deleted(lambda sid: heard.append(("deleted", sid)))
    return heard


async def _heard_until(heard: list, wanted: tuple, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if wanted in heard:
            return
        await asyncio.sleep(0.05)


def _notes(count: int) -> list[Draft]:
    return [Draft("note", {"n": n}) for n in range(count)]


def test_a_session_deleted_and_created_again_in_one_batch_reaches_another_replica_whole(
    url: str,
) -> None:
    """One batch deletes a session and creates it again with the same id (the store allows
    it): every replica's hub, the writer's own too, must hear the deletion, then the new
    session from seq 1, each event once."""

    async def main() -> None:
        writer = open_store(url, "writer", poll=60)
        follower = open_store(url, "follower", poll=60)
        hub, own = Hub(asyncio.get_running_loop()), Hub(asyncio.get_running_loop())
        heard, heard_own = _record(hub), _record(own)
        follower.attach_hub(hub)
        writer.attach_hub(own)
        await follower.wait_listening()
        await writer.wait_listening()
        await writer.create_session("s", [Draft("session.created", {}), *_notes(4)])
        await _heard_until(heard, ("event", 5))
        heard.clear()
        heard_own.clear()
        await asyncio.gather(  # queued together: one batch
            writer.delete_session("s"),
            writer.create_session("s", [Draft("session.created", {}), *_notes(2)]),
        )
        await writer.append("s", _notes(4))  # the new session: seqs 1..7
        await _heard_until(heard, ("event", 7))
        assert [e.seq for e in await follower.read("s")] == list(range(1, 8))
        await asyncio.sleep(0.5)
        assert heard == [("deleted", "s"), *(("event", n) for n in range(1, 8))]
        assert heard_own == heard
        await writer.aclose()
        await follower.aclose()

    asyncio.run(main())


def test_a_deletion_and_a_creation_again_in_one_wake_up_reach_another_replica_whole(
    url: str,
) -> None:
    """The follower's worker is busy while another replica deletes a session and creates it
    again (two commits, two notifications): both come to it in one wake-up. Its hub must
    hear the deletion and the new session from seq 1, each event once."""

    async def main() -> None:
        writer, follower = open_store(url, "writer"), open_store(url, "follower", poll=60)
        hub = Hub(asyncio.get_running_loop())
        heard = _record(hub)
        follower.attach_hub(hub)
        await follower.wait_listening()
        await writer.create_session("busy", [Draft("session.created", {})])
        await writer.create_session("s", [Draft("session.created", {}), *_notes(4)])
        await _heard_until(heard, ("event", 5))
        heard.clear()
        async with follower._fanout._lock:  # its worker is held in a catch-up ...
            await writer.append("busy", _notes(1))
            await asyncio.sleep(0.5)  # ... of `busy`'s notification
            await writer.delete_session("s")
            await writer.create_session("s", [Draft("session.created", {}), *_notes(6)])
            await asyncio.sleep(0.5)  # both notifications are in, waiting for the worker
        await _heard_until(heard, ("event", 7))
        await asyncio.sleep(0.5)
        assert heard == [("deleted", "s"), *(("event", n) for n in range(1, 8))]
        await writer.aclose()
        await follower.aclose()

    asyncio.run(main())


def _turn(n: int) -> Draft:
    data = {"turn_id": f"u{n}", "stream_id": f"r{n}", "text": f"turn {n}", "attachments": []}
    return Draft("turn.submitted", data, f"r{n}", f"u{n}", admits_run=True)


def test_a_run_taken_over_whose_settling_failed_once_is_settled_on_a_later_round(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer: runs ownership across replicas (runs/leases.py, log/pg_leases.py). A survivor
    takes a dead replica's run over, and the database refuses its `run.finished` once (a
    transient failure). The lease loop goes on: the run must still be settled, not left open
    (its session refusing every new turn as busy) for as long as the survivor lives."""
    monkeypatch.setattr(leases, "RENEW_SECONDS", 0.1)

    async def main() -> None:
        dead, survivor = open_store(url, "dead"), open_store(url, "survivor")
        await dead.renew_lease()
        await dead.create_session("s1", [Draft("session.created", {})])
        await dead.append("s1", [_turn(1)])
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute("UPDATE replica_leases SET expires_at = 0")  # it died
            await admin.execute("CREATE SEQUENCE refused")
            await admin.execute(
                "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
                "PERFORM nextval('refused'); RAISE EXCEPTION 'the disk is full'; END $$ "
                "LANGUAGE plpgsql"
            )
            await admin.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON events FOR EACH ROW "
                "WHEN (NEW.type = 'run.finished') EXECUTE FUNCTION refuse()"
            )
            registry = SimpleNamespace(get=lambda stream_id: None, runs=lambda: [])
            engine = SimpleNamespace(shared=survivor, store=survivor, registry=registry)
            loop = asyncio.create_task(leases.lease_forever(engine))  # type: ignore[arg-type]
            for _ in range(100):  # until the takeover's run.finished was refused once
                cur = await admin.execute("SELECT is_called FROM refused")
                if (await cur.fetchone()) == (True,):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the run was never taken over")
            await admin.execute("DROP TRIGGER refuse ON events")  # the failure is over
            await asyncio.sleep(2.0)  # twenty rounds of the lease loop
            loop.cancel()
            cur = await admin.execute("SELECT open_stream, open_owner, open_epoch FROM sessions")
            row = await cur.fetchone()
        assert row is not None and row[0] is None, f"the run is still open: {row}"
        assert [e.type for e in await survivor.read("s1")][-1] == "run.finished"
        await dead.aclose()
        await survivor.aclose()

    asyncio.run(main())


def test_appends_and_reads_made_once_the_database_is_back_after_a_restart_succeed(
    tmp_path: Path,
) -> None:
    """PostgreSQL restarted while the replica was idle (fast shutdown: every connection cut):
    what the replica does once the database is back up must not fail on a connection the
    restart cut (the pool kept them; nothing of the operation was sent)."""
    with private_server(tmp_path) as server:

        async def main() -> None:
            store = open_store(server.url, "r0")
            await store.create_session("s1", [Draft("session.created", {})])
            await asyncio.gather(*(store.read("s1") for _ in range(4)))  # pooled connections
            await asyncio.to_thread(server.restart)  # back up when it returns
            failed = []
            for n in range(4):
                try:
                    await store.append("s1", [Draft("note", {"n": n})])
                except StorageError as exc:
                    failed.append(f"append: {exc}")
                try:
                    await store.read("s1")
                except StorageError as exc:
                    failed.append(f"read: {exc}")
            assert failed == []
            await store.aclose()

        asyncio.run(main())


def test_a_create_racing_another_replicas_deletion_of_the_same_id_leaves_no_orphan_events(
    url: str,
) -> None:
    """Replica B deletes session s (its batch holds s's counter row) while replica A creates s
    again: A's insert finds the row still there, then waits for its lock, which B releases
    with the row deleted. A must either create s whole (counter row and events) or refuse;
    never commit events for a session without a counter row."""

    async def main() -> None:
        a, b = open_store(url, "a"), open_store(url, "b")
        await b.create_session("s", [Draft("session.created", {})])
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(  # B's deletion is slow, as under a slow disk
                "CREATE FUNCTION stall() RETURNS trigger AS $$ BEGIN "
                "PERFORM pg_sleep(1.5); RETURN NULL; END $$ LANGUAGE plpgsql"
            )
            await admin.execute(
                "CREATE TRIGGER stall BEFORE DELETE ON events "
                "FOR EACH STATEMENT EXECUTE FUNCTION stall()"
            )
            deleting = asyncio.create_task(b.delete_session("s"))
            await asyncio.sleep(0.5)  # B holds s's row, stalled in its deletion
            try:
                created = [e.seq for e in await a.create_session("s", _notes(2))]
            except Exception as exc:  # a refusal would do too
                created = [repr(exc)]
            await deleting
            cur = await admin.execute("SELECT last_seq FROM sessions WHERE session_id='s'")
            counter = await cur.fetchone()
            cur = await admin.execute("SELECT seq FROM events WHERE session_id='s' ORDER BY seq")
            events = [r[0] for r in await cur.fetchall()]
        whole = created == [1, 2] and counter == (2,) and events == [1, 2]
        refused = isinstance(created[0], str) and counter is None and events == []
        assert whole or refused, (created, counter, events)
        await a.aclose()
        await b.aclose()

    asyncio.run(main())


def test_an_id_a_postgresql_text_cannot_hold_fails_only_its_own_append(url: str) -> None:
    """Unstorable data fails only its own append (backend contract), and says so: a stream
    id or a session id with a NUL (which the writer checks for, log/pg_rows.py `encode`) is
    refused as InvalidEvent, and the appends batched with it are written."""

    async def main() -> None:
        store = open_store(url, "r0")
        await store.create_session("s1", [Draft("session.created", {})])
        good, bad_stream, bad_session = await asyncio.gather(  # one batch
            store.append("s1", [Draft("note", {})]),
            store.append("s1", [Draft("note", {}, stream_id="r\x00")]),
            store.append("s\x00", [Draft("note", {})]),
            return_exceptions=True,
        )
        assert isinstance(good, list) and [e.seq for e in good] == [2], good
        assert isinstance(bad_stream, InvalidEvent), bad_stream
        assert isinstance(bad_session, InvalidEvent), bad_session
        await store.aclose()

    asyncio.run(main())


def test_a_claim_of_unowned_sessions_racing_a_deletion_leaves_no_owner_row_behind(
    url: str,
) -> None:
    """A replica starting in accounts mode gives every unowned session to the first admin
    while another replica deletes one of them. The deletion removed the session's owner row
    before the claim's insert was committed, so the claim then left an owner row for a
    session that no longer exists (ownership the next session of that id would inherit)."""

    async def main() -> None:
        store = open_store(url, "deleting")
        await store.create_session("s", [Draft("session.created", {})])
        with psycopg.connect(url, autocommit=True) as db:  # a claim slow to insert its rows
            db.execute(
                "CREATE FUNCTION slow_owner() RETURNS trigger AS $$ BEGIN "
                "PERFORM pg_sleep(1); RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            db.execute(
                "CREATE TRIGGER slow_owner BEFORE INSERT ON session_owners "
                "FOR EACH ROW EXECUTE FUNCTION slow_owner()"
            )
        claimer = open_store(url, "claiming")
        claim = asyncio.create_task(claimer.claim_unowned("alice"))
        await asyncio.sleep(0.3)  # the claim has read the sessions and is inserting
        await store.delete_session("s")
        assert await claim in (0, 1)
        with psycopg.connect(url) as db:
            assert db.execute("SELECT session_id, owner FROM session_owners").fetchall() == []
        for replica in (store, claimer):
            await replica.aclose()

    asyncio.run(main())
