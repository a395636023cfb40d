"""The PostgreSQL backend with several replicas on one database (layer: the log; contract
"run-journal sequence publication" across processes): seqs stay contiguous whatever the number
of replicas writing, batches that lock several sessions never deadlock, and every replica's
Hub hears every committed event once, in seq order, also after its LISTEN connection was
killed (the log is the only source; the wake-up is only a wake-up)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import psycopg
import pytest
from log.pg_replica_kit import open_store, turn
from pg import private_server

from tether.events import Event
from tether.log import Draft, Hub, StorageError
from tether.log.errors import (
    CancelRequested,
    RunTakenOver,
    StreamClosed,
)
from tether.log.pg_fanout import PAYLOAD_LIMIT, Fanout, payloads
from tether.log.pg_leases import ATTEMPT_SECONDS, LEASE_SECONDS, RENEW_SECONDS
from tether.log.postgres import PostgresEventStore

pytestmark = pytest.mark.slow


async def collect(hub: Hub, sid: str, count: int, timeout: float = 20) -> list[int]:
    """The seqs the hub publishes for `sid` until `count` arrived (then checks for extras)."""
    seqs: list[int] = []
    with hub.subscribe(sid) as sub:
        while len(seqs) < count:
            batch = await sub.next_batch(timeout)
            assert batch, f"publication stalled at {len(seqs)} of {count}"
            seqs.extend(e.seq for e in batch)
        seqs.extend(e.seq for e in await sub.next_batch(0.5))
    return seqs


def test_three_replicas_with_twenty_writers_each_get_seqs_exactly_one_to_n(url: str) -> None:
    async def main() -> None:
        stores = [open_store(url, f"r{n}") for n in range(3)]
        loop = asyncio.get_running_loop()
        hubs = [Hub(loop) for _ in stores]
        for store, hub in zip(stores, hubs, strict=True):
            store.attach_hub(hub)
            await store.wait_listening()

        async def writer(store: PostgresEventStore, n: int) -> list[list[int]]:
            acked = []
            for i in range(10):
                drafts = [Draft("text.delta", {"n": n, "i": i, "k": k}) for k in range(1 + i % 2)]
                acked.append([e.seq for e in await store.append("s1", drafts)])
            return acked

        total = 1 + 3 * 20 * 15
        heard = [asyncio.create_task(collect(hub, "s1", total)) for hub in hubs]
        await asyncio.sleep(0.1)
        await stores[1].create_session("s1", [Draft("session.created", {})])
        results = await asyncio.gather(*(writer(s, n) for s in stores for n in range(20)))
        batches = [b for r in results for b in r]
        for batch in batches:  # a two-event append is never split by another writer
            assert batch == list(range(batch[0], batch[0] + len(batch)))
        assert sorted(s for b in batches for s in b) == list(range(2, total + 1))
        for store in stores:
            assert [e.seq for e in await store.read("s1")] == list(range(1, total + 1))
            assert await store.last_seq("s1") == total
            assert await store.index_state("s1") == {"n": total}
        for task in heard:  # every replica's hub: every event once, in order
            assert await task == list(range(1, total + 1))
        for store in stores:
            await store.aclose()

    asyncio.run(main())


def test_batches_locking_many_sessions_in_any_order_never_deadlock(url: str) -> None:
    async def main() -> None:
        stores = [open_store(url, f"r{n}") for n in range(3)]
        sids = [f"s{n:02}" for n in range(12)]
        for sid in sids:
            await stores[0].create_session(sid, [Draft("session.created", {})])

        async def writer(store: PostgresEventStore, seed: int) -> None:
            order = random.Random(seed).sample(sids * 3, len(sids) * 3)
            await asyncio.gather(*(store.append(sid, [Draft("a")]) for sid in order))

        await asyncio.wait_for(
            asyncio.gather(*(writer(s, n) for n, s in enumerate(stores) for _ in range(4))), 60
        )
        for sid in sids:
            assert [e.seq for e in await stores[1].read(sid)] == list(range(1, 38))
        for store in stores:
            await store.aclose()

    asyncio.run(main())


def test_a_batch_creating_a_session_takes_its_locks_in_one_order_with_other_replicas(
    url: str,
) -> None:
    """Layer: the log (invariant 5 across replicas; issue 17's fixed lock order). This
    replica's batch creates `a` and appends to `m`, which another transaction holds. Another
    replica's batch, taking its locks in session-id order too, inserts `a` and then waits for
    `m`. Had this batch locked `m` before inserting `a` (existing rows first, new ones
    after), the two would wait for each other until PostgreSQL broke the deadlock by failing
    one of them."""

    async def main() -> None:
        store = open_store(url, "r1")
        await store.create_session("m", [Draft("session.created", {})])
        async with (
            await psycopg.AsyncConnection.connect(url) as holder,
            await psycopg.AsyncConnection.connect(url) as other_replica,
        ):
            await holder.execute("SELECT 1 FROM sessions WHERE session_id='m' FOR UPDATE")
            create = asyncio.create_task(store.create_session("a", [Draft("session.created", {})]))
            append = asyncio.create_task(store.append("m", [Draft("note", {})]))
            await asyncio.sleep(0.3)
            assert not create.done()  # one batch with the append, waiting for `m`

            async def other_batch() -> None:
                await other_replica.execute(
                    "INSERT INTO sessions (session_id, last_seq) VALUES ('a', 0) "
                    "ON CONFLICT DO NOTHING"
                )
                await other_replica.execute(
                    "SELECT 1 FROM sessions WHERE session_id = ANY('{a,m}') "
                    "ORDER BY session_id FOR UPDATE"
                )
                await other_replica.commit()

            other = asyncio.create_task(other_batch())
            await asyncio.sleep(0.3)
            await holder.commit()
            await asyncio.wait_for(asyncio.gather(create, append, other), 10)
        assert [e.type for e in await store.read("a")] == ["session.created"]
        assert [e.seq for e in await store.read("m")] == [1, 2]
        await store.aclose()

    asyncio.run(main())


def test_a_replicas_session_list_follows_what_other_replicas_write(url: str) -> None:
    """A replica keeps the sidebar states it decoded and re-reads only those whose
    `state_seq` moved (pg_reads.py): another replica's append, a session it created and one
    it deleted all show in the next list, and the database stays the authority."""

    async def main() -> None:
        a, b = open_store(url, "ra"), open_store(url, "rb")
        for sid in ("s1", "s2", "s3"):
            await a.create_session(sid, [Draft("session.created", {})])
        first = await b.index_states()
        assert first == {sid: {"n": 1} for sid in ("s1", "s2", "s3")}
        await a.append("s2", [Draft("a"), Draft("a")])
        await a.create_session("s4", [Draft("session.created", {})])
        await a.delete_session("s3")
        second = await b.index_states()
        assert second == {"s1": {"n": 1}, "s2": {"n": 3}, "s4": {"n": 1}}
        assert second["s1"] is first["s1"]  # not decoded again: its state_seq did not move
        await b.append("s1", [Draft("a")])
        assert await a.index_states() == await b.index_states()
        assert (await a.index_states())["s1"] == {"n": 2}
        for store in (a, b):
            await store.aclose()

    asyncio.run(main())


def test_a_session_deleted_and_created_again_is_not_listed_from_the_old_state(url: str) -> None:
    """Layer: the sidebar index (invariant 3: every replica lists what the log holds). A
    session created again under the same id (an import of its own export) comes back at
    the same `state_seq`: the replica that decoded the old state must not list it."""

    def titled(state: dict | None, event: Event) -> dict:
        return {**(state or {}), "title": event.data.get("title", (state or {}).get("title"))}

    async def main() -> tuple[dict, dict]:
        a, b = (
            PostgresEventStore(url, index_fold=titled, index_version="t1", replica_id=r)
            for r in ("ra", "rb")
        )
        await a.create_session("s1", [Draft("session.created", {"title": "before"})])
        first = await b.index_states()
        await a.delete_session("s1")
        await a.create_session("s1", [Draft("session.created", {"title": "after"})])
        second = await b.index_states()
        for store in (a, b):
            await store.aclose()
        return first, second

    first, second = asyncio.run(main())
    assert first == {"s1": {"title": "before"}}
    assert second == {"s1": {"title": "after"}}


async def _kill_listener(admin: Any) -> bool:
    """Terminate the follower's LISTEN connection once it is listening (after a first kill,
    its reconnect may still be on its way: wait for it, up to 10 s)."""
    for _ in range(200):
        cur = await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN %%' AND datname = current_database()"
        )
        killed = [row[0] for row in await cur.fetchall()]
        if killed:
            return killed == [True]
        await asyncio.sleep(0.05)
    return False


def test_a_follower_whose_listen_connection_is_killed_catches_up_from_its_cursor(
    url: str,
) -> None:
    async def main() -> None:
        writer, follower = open_store(url, "writer"), open_store(url, "follower")
        hub = Hub(asyncio.get_running_loop())
        follower.attach_hub(hub)
        await follower.wait_listening()
        heard = asyncio.create_task(collect(hub, "s1", 201, timeout=30))
        await asyncio.sleep(0.1)
        await writer.create_session("s1", [Draft("session.created", {})])
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            for i in range(200):
                await writer.append("s1", [Draft("text.delta", {"i": i})])
                if i in (50, 120):  # the follower's LISTEN connection dies mid-stream
                    assert await _kill_listener(admin)
        assert await heard == list(range(1, 202))
        await writer.aclose()
        await follower.aclose()

    asyncio.run(main())


def test_followers_catch_up_after_the_database_restarts_mid_stream(tmp_path: Path) -> None:
    """PostgreSQL restarted (fast shutdown: every connection cut) while a replica appends and
    another follows: appends fail with StorageError while it is away and nothing
    acknowledged is lost; the follower's LISTEN connection comes back and its hub hears every
    event of the log once, in order."""
    with private_server(tmp_path) as server:

        async def main() -> None:
            writer, follower = open_store(server.url, "writer"), open_store(server.url, "f")
            hub = Hub(asyncio.get_running_loop())
            follower.attach_hub(hub)
            await follower.wait_listening()
            heard: list[int] = []
            sub = hub.subscribe("s1")
            await writer.create_session("s1", [Draft("session.created", {})])
            acked: dict[int, int] = {}
            refused = 0
            slowest = 0.0
            restart = None
            i = 0
            loop = asyncio.get_running_loop()
            while i < 300:
                if i == 100 and restart is None:  # once: i stays at 100 while appends fail
                    restart = asyncio.create_task(asyncio.to_thread(server.restart))
                began = loop.time()
                try:
                    (event,) = await writer.append("s1", [Draft("text.delta", {"i": i})])
                    acked[event.seq] = i
                    i += 1
                except StorageError:
                    refused += 1
                    await asyncio.sleep(0.05)
                slowest = max(slowest, loop.time() - began)
                heard.extend(e.seq for e in sub.take())
            assert restart is not None
            await restart
            # the restart did cut the writer off: an append failed, or waited for the database
            # (one that finds its pooled connection cut waits for a new one, at most 10 s)
            assert refused > 0 or slowest > 0.5, (refused, slowest)
            last = await writer.last_seq("s1")
            assert last is not None
            logged = await writer.read("s1")
            assert [e.seq for e in logged] == list(range(1, last + 1))
            by_seq = {e.seq: e.data.get("i") for e in logged}
            assert all(by_seq[seq] == n for seq, n in acked.items())  # nothing acked lost
            while len(heard) < last:
                batch = await sub.next_batch(15)
                assert batch, f"the follower stalled at {len(heard)} of {last}"
                heard.extend(e.seq for e in batch)
            assert heard == list(range(1, last + 1))
            sub.close()
            await writer.aclose()
            await follower.aclose()

        asyncio.run(main())


def test_stop_is_recorded_once_per_run_whichever_replica_records_it(url: str) -> None:
    """Layer: runs Stop (exactly one `cancelled: true`): of twelve run.cancel_requested of
    one run appended at once through three replicas, the log keeps one."""

    async def main() -> None:
        stores = [open_store(url, f"r{n}") for n in range(3)]
        await stores[0].create_session("s1", [Draft("session.created", {})])
        await stores[0].append("s1", [turn(1)])
        stop = Draft("run.cancel_requested", {"stream_id": "r1"}, "r1", "u1")
        outcomes = await asyncio.gather(
            *(stores[n % 3].append("s1", [stop]) for n in range(12)), return_exceptions=True
        )
        assert sum(isinstance(o, list) for o in outcomes) == 1
        assert sum(isinstance(o, CancelRequested) for o in outcomes) == 11
        logged = [e.type for e in await stores[1].read("s1")]
        assert logged.count("run.cancel_requested") == 1
        await stores[2].append("s1", [Draft("run.finished", {"state": "cancelled"}, "r1", "u1")])
        await stores[2].append("s1", [turn(2)])  # the next run may be stopped in its turn
        await stores[1].append("s1", [Draft("run.cancel_requested", {}, "r2", "u2")])
        for store in stores:
            await store.aclose()

    asyncio.run(main())


def test_a_notification_names_sessions_and_seqs_within_notify_limit() -> None:
    seqs = {f"session-{n:05}-{'x' * 40}": n for n in range(600)}
    deleted = [f"gone-{n}" for n in range(300)]
    out = payloads("replica-a", seqs, deleted)
    assert len(out) > 1
    merged: dict[str, int] = {}
    gone: list[str] = []
    for payload in out:
        assert len(payload.encode()) < PAYLOAD_LIMIT < 8000
        body = json.loads(payload)
        assert body["r"] == "replica-a" and set(body) == {"r", "s", "d"}  # never event bodies
        merged.update(body["s"])
        gone.extend(body["d"])
    assert merged == seqs and gone == deleted


def test_a_dead_replicas_run_is_taken_over_once_and_its_late_appends_are_refused(
    url: str,
) -> None:
    """Layer: runs ownership across replicas (log/pg_leases.py; contract: exactly one
    terminal event per stream, a late worker's output never lands). A run admitted by a
    replica with a live lease is nobody else's to settle; once that lease has expired, of two
    survivors claiming at once exactly one takes it over (SKIP LOCKED), the epoch is bumped,
    and the old owner's appends to the run are refused while a Stop and the new owner's
    run.finished are not."""

    async def main() -> None:
        owner, one, two = (open_store(url, f"r{n}") for n in range(3))
        for store in (owner, one, two):
            await store.renew_lease()
        await owner.create_session("s1", [Draft("session.created", {})])
        await owner.append("s1", [turn(1)])
        # the owner's lease is live: nobody claims its run, not even start-up recovery
        assert await one.claim_orphans(strays=True) == []
        assert await two.claim_orphans() == []
        # before a takeover any replica may append to the run (as before leases)
        await one.append("s1", [Draft("text.delta", {"text": "a"}, "r1")])
        async with owner._pool.connection() as conn:  # the owner's lease runs out
            await conn.execute("UPDATE replica_leases SET expires_at = 0 WHERE replica_id='r0'")
        claims = await asyncio.gather(one.claim_orphans(), two.claim_orphans())
        assert sorted(len(c) for c in claims) == [0, 1]
        winner = one if claims[0] else two
        (taken,) = claims[0] or claims[1]
        assert (taken.session_id, taken.stream_id, taken.turn_id) == ("s1", "r1", "u1")
        async with owner._pool.connection() as conn:
            row = await (
                await conn.execute("SELECT open_owner, open_epoch FROM sessions")
            ).fetchone()
        assert row == (winner.replica_id, 1)
        with pytest.raises(RunTakenOver):  # the zombie's late output never lands
            await owner.append("s1", [Draft("text.delta", {"text": "late"}, "r1")])
        with pytest.raises(StreamClosed):  # ... as a finished stream's, which it is a kind of
            await owner.append("s1", [Draft("run.finished", {"state": "completed"}, "r1")])
        await one.append("s1", [Draft("run.cancel_requested", {}, "r1")])  # Stop: anywhere
        await winner.append("s1", [Draft("run.finished", {"state": "interrupted"}, "r1")])
        types = [(e.type, e.data.get("text")) for e in await two.read("s1")]
        assert ("text.delta", "late") not in types
        assert types[-1] == ("run.finished", None)
        # the session admits a new run on any replica, owned by its admitter, epoch 0 again
        await owner.append("s1", [turn(2)])
        await owner.append("s1", [Draft("text.delta", {"text": "b"}, "r2")])
        async with owner._pool.connection() as conn:
            row = await (
                await conn.execute("SELECT open_owner, open_epoch FROM sessions")
            ).fetchone()
        assert row == ("r0", 0)
        for store in (owner, one, two):
            await store.aclose()

    asyncio.run(main())


def test_the_lease_numbers_are_the_documented_ones() -> None:
    """docs/operations.md names the lease's renewal and validity; they are the code's."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert f"renewed every **{RENEW_SECONDS:g} s** and valid for **{LEASE_SECONDS:g} s**" in text
    assert f"within {ATTEMPT_SECONDS:g} s counts as failed" in text
    assert LEASE_SECONDS + RENEW_SECONDS < 30  # a dead replica's runs settled within 30 s


def test_a_fanout_worker_cancelled_as_it_is_woken_stops() -> None:
    """Layer: the log's fan-out (a replica that closes stops publishing). A wake-up that lands
    as the worker is cancelled must not swallow the cancellation (asyncio.wait_for on Python
    3.11 returns the finished wait instead of raising), else `aclose` waits forever for a
    worker that went back to sleep."""

    async def no_events(_: dict[str, int]) -> list[Event]:
        return []

    async def no_sessions() -> dict[str, int]:
        return {}

    async def main() -> None:
        fanout = Fanout("", no_events, no_sessions, {}, poll_seconds=5.0)
        for _ in range(3):
            worker = asyncio.get_running_loop().create_task(fanout._work_forever())
            await asyncio.sleep(0.05)  # asleep, waiting for a wake-up
            fanout._wake({"s": 1}, [])
            worker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(worker, 2)

    asyncio.run(main())


def test_database_pool_size_bounds_the_connections_a_replicas_log_opens(
    url: str, tmp_path: Path
) -> None:
    """`--database-pool-size` (docs/configuration.md): thirty reads held up by a lock on the
    events table take at most that many of the database's connections; released, all end."""
    import psycopg

    from tether.services import open_store as open_served_store
    from tether.settings import Settings

    store = open_served_store(Settings(data_dir=tmp_path, database_url=url, database_pool_size=3))
    waiting_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE 'SELECT session_id, seq%%'"
    )

    async def main() -> None:
        with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as peek:
            holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            reads = [asyncio.create_task(store.read(f"s{n}")) for n in range(30)]
            seen = []
            for _ in range(40):  # the pool grows to its bound in the background
                await asyncio.sleep(0.05)
                seen.append(peek.execute(waiting_sql).fetchone()[0])
            assert max(seen) == 3 and seen[-1] == 3
            holder.rollback()
            assert [await asyncio.wait_for(r, 10) for r in reads] == [[]] * 30
        await store.aclose()

    asyncio.run(main())
