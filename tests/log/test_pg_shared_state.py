"""The state replicas share besides the log, on a real PostgreSQL database (log/pg_shared.py,
log/pg_blobs.py, migration m008), each store opened twice as two replicas would. Layer (named
as contract invariant 8 asks): the log, its shared state. Invariants: concurrent first starts
agree on one cookie secret; login failures through any replica count against one limit,
atomically (parallel guesses are never all admitted); settings saved through one are read
through the other; attachment bytes put through one are read through the other and never
removed while an upload row names them, nor within the grace after any replica put them.
The embedded mode's in-memory limiter is held to the same rules."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pg import database

from tether.log.shared import LoginLimits, MemoryLoginLimits, Rule
from tether.services import open_shared
from tether.settings import Settings

psycopg = pytest.importorskip("psycopg")

from tether.log.pg_blobs import (  # noqa: E402
    BLOB_GRACE_SECONDS,
    PRUNE_SECONDS,
    RECENT_SECONDS,
    SWEEP_SECONDS,
    PostgresBlobStore,
)
from tether.log.pg_schema import apply_migrations  # noqa: E402
from tether.log.pg_shared import (  # noqa: E402
    LazyPool,
    PostgresLoginLimits,
    PostgresSettings,
    shared_secret,
)

RULE = Rule(max_failures=3, window=1.0)


@pytest.fixture
def url() -> Iterator[str]:
    with database() as made:
        with psycopg.connect(made, autocommit=True) as db:
            apply_migrations(db)
        yield made


def test_replicas_starting_at_once_agree_on_one_cookie_secret() -> None:
    with database() as url, ThreadPoolExecutor(6) as pool:
        secrets = list(pool.map(lambda _: shared_secret(url), range(6)))
    assert len(set(secrets)) == 1 and len(secrets[0]) >= 32


async def _limits_agree(a: LoginLimits, b: LoginLimits) -> None:
    checks = [("10.0.0.1", RULE)]
    assert [await limits.attempt(checks) for limits in (a, b, a)] == [0, 0, 0]
    wait = await b.attempt(checks)
    assert wait == 1  # the oldest failure expires within the 1 s window
    assert await a.attempt([("10.0.0.2", RULE)]) == 0  # another key is its own
    # A key at its limit refuses the pair, and counts nothing against the other key.
    assert await a.attempt([("10.0.0.3", RULE), ("10.0.0.1", RULE)]) > 0
    assert await b.attempt([("10.0.0.3", RULE)]) == 0
    await a.forgive("10.0.0.1")  # the latest of its three: one more may try, no more
    assert await b.attempt(checks) == 0
    assert await a.attempt(checks) > 0
    await a.reset(["10.0.0.1"])
    assert await b.attempt(checks) == 0
    await asyncio.sleep(RULE.window + 0.1)
    assert [await b.attempt([("10.0.0.3", RULE)]) for _ in range(3)] == [0, 0, 0]


def test_login_failures_in_memory_follow_the_rules() -> None:
    limits = MemoryLoginLimits()
    asyncio.run(_limits_agree(limits, limits))


def test_login_failures_through_two_replicas_count_against_one_limit(url: str) -> None:
    async def main() -> None:
        a, b = PostgresLoginLimits(LazyPool(url)), PostgresLoginLimits(LazyPool(url))
        try:
            await _limits_agree(a, b)
            # Ten guesses at once through both: exactly the limit's three are let through.
            guesses = [(a, b)[i % 2].attempt([("10.9.9.9", RULE)]) for i in range(10)]
            waits = await asyncio.gather(*guesses)
            assert waits.count(0) == RULE.max_failures
            # A user name may hold a NUL, which a PostgreSQL text cannot: still counted.
            assert await a.attempt([("user:a\x00b", RULE)]) == 0
            await b.reset(["user:a\x00b"])
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_settings_saved_through_one_replica_are_read_through_another(url: str) -> None:
    async def main() -> None:
        a, b = PostgresSettings(LazyPool(url)), PostgresSettings(LazyPool(url))
        try:
            assert await b.load() == {}
            await a.save({"default_model": "big-model", "default_system_prompt": "nul \x00 ok"})
            await b.save({"default_model": None})  # a key at a time: the other one stays
            assert await a.load() == {"default_system_prompt": "nul \x00 ok"}
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


@asynccontextmanager
async def two_blob_stores(
    url: str,
    a_dir: Path,
    b_dir: Path,
    grace: float = BLOB_GRACE_SECONDS,
    prune_seconds: float = PRUNE_SECONDS,
) -> AsyncIterator[tuple[PostgresBlobStore, PostgresBlobStore]]:
    """The blob stores of two replicas: one database, a cache directory each."""
    a, b = (
        PostgresBlobStore(
            LazyPool(url),
            cache,
            cache_bytes=Settings.attachment_cache_bytes,
            grace=grace,
            prune_seconds=prune_seconds,
        )
        for cache in (a_dir, b_dir)
    )
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def test_bytes_put_through_one_replica_are_read_through_another(url: str, tmp_path: Path) -> None:
    data = b"\x00\xffbytes of an upload"

    async def main() -> None:
        async with two_blob_stores(url, tmp_path / "a", tmp_path / "b", grace=0) as (a, b):
            new = await a.put(data, name="x.bin", mime="application/octet-stream")
            assert new.blob == hashlib.sha256(data).hexdigest()
            assert new.ref["size"] == len(data)
            path = await b.path(new.blob)  # B had no copy: fetched into its cache
            assert path is not None and path.is_relative_to(tmp_path / "b")
            assert path.read_bytes() == data
            assert await b.path("0" * 64) is None

            with psycopg.connect(url, autocommit=True) as db:  # an upload row names it
                db.execute(
                    "INSERT INTO attachments VALUES ('s1', %s, %s, 'x.bin', 'x', 1)",
                    (new.ref["id"], new.blob),
                )
                await a.remove(new.blob)  # ... so the bytes stay for every replica
                assert (await b.path(new.blob)) is not None
                db.execute("DELETE FROM attachments")
            await a.remove(new.blob)
            await b.cache.remove(new.blob)
            assert await b.path(new.blob) is None

    asyncio.run(main())


def test_bytes_another_replica_just_put_outlive_a_removal_until_the_grace_ends(
    url: str, tmp_path: Path
) -> None:
    """Replica A deletes the last session holding some bytes while replica B has just put the
    same bytes for an upload whose event is not appended yet: the bytes stay (they were
    removed, and B's logged upload then named nothing). What the grace kept goes in a sweep
    once no put has touched it for the grace: at start, or at a removal a minute after the
    last sweep."""
    data = b"the same bytes, uploaded twice"

    async def main() -> None:
        async with two_blob_stores(url, tmp_path / "a", tmp_path / "b") as (a, b):
            first = await a.put(data, name="a.txt", mime="text/plain")
            assert await a.path(first.blob) is not None
            with psycopg.connect(url, autocommit=True) as db:
                db.execute("UPDATE blobs SET stored_at = stored_at - 3600")  # put long ago
                await b.put(data, name="b.txt", mime="text/plain")  # B, just now
                await a.remove(first.blob)  # A's session, its last holder, is deleted
                await b.cache.remove(first.blob)
                kept = await b.path(first.blob)
                assert kept is not None and kept.read_bytes() == data

                stale = await a.put(b"bytes nobody holds", name="c.txt", mime="text/plain")
                assert await a.path(stale.blob) is not None
                db.execute("UPDATE blobs SET stored_at = stored_at - %s", (a.grace + 1,))
                await a.remove(first.blob)  # past the grace: it goes, and A's copy
                left = db.execute("SELECT blob FROM blobs").fetchall()
                assert left == [(stale.blob,)]  # swept within the last minute: not yet
                assert a.cache.local(first.blob) is None
                a._swept_at -= SWEEP_SECONDS  # a minute later A's next removal sweeps
                await a.remove(first.blob)
                assert db.execute("SELECT blob FROM blobs").fetchall() == []
                assert a.cache.local(stale.blob) is None
                assert await b.sweep() == 0  # at B's start: nothing left to sweep
                # a replica not upgraded yet puts without the column: stamped now all the same
                db.execute("INSERT INTO blobs (blob, data) VALUES ('from-an-old-replica', 'x')")
                a._swept_at -= SWEEP_SECONDS
                await a.remove("from-an-old-replica")
                assert db.execute("SELECT blob FROM blobs").fetchall() == [("from-an-old-replica",)]

    asyncio.run(main())


def test_a_replicas_copies_of_bytes_another_replica_removed_go_at_its_next_prune(
    url: str, tmp_path: Path
) -> None:
    """Replica A deletes the last session holding bytes that replica B has read: B's copy
    goes within a prune interval, instead of staying on B's disk until trimmed (A cannot
    reach it). A copy of bytes still in the database stays, and so does one read after the
    prune listed the cache (its bytes may have been put again)."""

    async def main() -> None:
        async with two_blob_stores(
            url, tmp_path / "a", tmp_path / "b", grace=0, prune_seconds=0.05
        ) as (a, b):
            gone = await a.put(b"a file of a deleted session", name="a.txt", mime="text/plain")
            held = await a.put(b"a file still held", name="b.txt", mime="text/plain")
            with psycopg.connect(url, autocommit=True) as db:  # an upload row names it
                db.execute(
                    "INSERT INTO attachments VALUES ('s1', %s, %s, 'b.txt', 'text/plain', 1)",
                    (held.ref["id"], held.blob),
                )
            assert await b.path(gone.blob) is not None and await b.path(held.blob) is not None
            await a.remove(gone.blob)
            deadline = time.monotonic() + 10
            while b.cache.local(gone.blob) is not None:
                assert time.monotonic() < deadline, "B kept its copy of the removed bytes"
                await asyncio.sleep(0.02)
            assert b.cache.local(held.blob) is not None
            assert await b.prune() == 0

            again = await a.put(b"put again later", name="c.txt", mime="text/plain")
            copy = await b.path(again.blob)
            assert copy is not None
            future = time.time() + 3600  # read after the listing, as far as the prune knows
            os.utime(copy, (future, future))
            await a.remove(again.blob)
            assert await b.prune() == 0 and b.cache.local(again.blob) is not None

    asyncio.run(main())


def test_a_replicas_copies_stay_within_their_budget_least_recently_read_first(
    url: str, tmp_path: Path
) -> None:
    """The local copies are a cache of the database's bytes: past `cache_bytes` the least
    recently read go, one read within RECENT_SECONDS never does, and a removed copy is
    fetched again when it is next needed."""
    blobs = [bytes([n]) * 1000 for n in range(5)]

    async def main() -> None:
        flags = Settings(data_dir=tmp_path / "b", database_url=url, attachment_cache_bytes=3000)
        b = open_shared(flags).blobs  # as `tether serve --attachment-cache-bytes 3000` does
        assert isinstance(b, PostgresBlobStore) and b.cache_bytes == 3000
        async with (
            contextlib.aclosing(b),
            two_blob_stores(url, tmp_path / "a", tmp_path / "unused") as (a, _),
        ):
            names = [
                (await a.put(data, name=f"{n}.bin", mime="x")).blob for n, data in enumerate(blobs)
            ]
            for name in names[:3]:
                assert await b.path(name) is not None
            long_ago = time.time() - RECENT_SECONDS - 100
            for age, name in enumerate(names[:3]):  # read in the order 1, 0, 2 long ago
                path = b.cache.local(name)
                assert path is not None
                os.utime(path, (long_ago + (1, 0, 2)[age],) * 2)
            assert await b.path(names[3]) is not None  # 4,000 bytes: the oldest read goes
            assert [b.cache.local(n) is not None for n in names[:4]] == [True, False, True, True]
            assert await b.path(names[4]) is not None  # recent copies stay, the old go
            assert [b.cache.local(n) is not None for n in names] == [False, False, True, True, True]
            fetched = await b.path(names[1])  # fetched again; the last old copy goes
            assert fetched is not None and fetched.read_bytes() == blobs[1]
            assert [b.cache.local(n) is not None for n in names] == [False, True, False, True, True]
            assert await b.path(names[2]) is not None  # all read recently: over the budget
            assert [b.cache.local(n) is not None for n in names] == [False, True, True, True, True]

    asyncio.run(main())


def test_bytes_left_in_a_data_directory_are_copied_into_the_database(
    url: str, tmp_path: Path
) -> None:
    """An upgrade from a shared directory: the files it holds reach the database at start."""
    kept, torn = b"stored by an earlier version", b"cut short"
    old = tmp_path / "old"
    good = hashlib.sha256(kept).hexdigest()
    (old / good[:2]).mkdir(parents=True)
    (old / good[:2] / good).write_bytes(kept)
    bad = hashlib.sha256(b"the whole of it").hexdigest()
    (old / bad[:2]).mkdir(exist_ok=True)
    (old / bad[:2] / bad).write_bytes(torn)

    async def main() -> None:
        async with two_blob_stores(url, old, tmp_path / "new") as (a, b):
            assert await a.adopt_local() == 1
            assert await a.adopt_local() == 0  # once per process
            path = await b.path(good)
            assert path is not None and path.read_bytes() == kept
            assert await b.path(bad) is None  # a file that is not its hash stays out

    asyncio.run(main())
