"""Attachment bytes in the PostgreSQL database of the log (table `blobs` of migration m008,
keyed by SHA-256), so an upload made through one replica is read through any other with no
shared directory. The row is committed before `put` returns, so before the event that refers
to it is appended: a logged reference never dangles, whichever replica reads it.

What needs a file (a download, the runtimes reading an image) gets one from this replica's
local cache (an `AttachmentStore` under its data directory), filled from the database at the
first read. Blobs are content-addressed, so a cached file is never stale. The cache keeps at
most `cache_bytes`: filling it past that removes the least recently read copies, never one
read within `RECENT_SECONDS` (a download may be about to open it). Once it holds a copy, the
cache is pruned every `PRUNE_SECONDS`: a copy of bytes that another replica has removed from
the database (their last session deleted) goes too, instead of staying on this replica's
disk until trimmed.

Bytes are stored once per content, so two replicas may hold the same blob for different
sessions: one deleting the last session that held it must not remove it while the other has
just put it for an upload whose event is not appended yet. Each put stamps the row
(`stored_at`), and a removal leaves alone rows put within the last `grace` seconds. What that
leaves behind (and bytes whose event was never appended) goes in a sweep of every blob no
upload row names and no put touched for `grace`: at start, and at a removal at most once a
minute."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
from pathlib import Path

from tether.log.attachments import AttachmentStore, StoredUpload, new_upload
from tether.log.pg_shared import LazyPool

log = logging.getLogger("tether")

BLOB_GRACE_SECONDS = 600.0  # far above the seconds between an upload's put and its event

_NOW = "extract(epoch FROM clock_timestamp())"

RECENT_SECONDS = 60.0  # a cached copy read this recently is never trimmed
SWEEP_SECONDS = 60.0  # the sweep of unnamed blobs runs at most this often
PRUNE_SECONDS = 60.0  # between two looks for copies of bytes the database no longer has
_UNNAMED = "NOT EXISTS (SELECT 1 FROM attachments WHERE attachments.blob = blobs.blob)"


class PostgresBlobStore:
    def __init__(
        self,
        pool: LazyPool,
        cache: Path,
        *,
        cache_bytes: int,
        grace: float = BLOB_GRACE_SECONDS,
        prune_seconds: float = PRUNE_SECONDS,
    ) -> None:
        self.pool = pool
        self.cache = AttachmentStore(cache)
        self.grace = grace
        self.cache_bytes = cache_bytes
        self.prune_seconds = prune_seconds
        self._pruner: asyncio.Task | None = None
        self._adopted = False
        self._swept_at = float("-inf")
        self._reading = threading.Lock()  # a read's touch against the trim's removal

    async def put(self, data: bytes, *, name: str, mime: str) -> StoredUpload:
        new = await asyncio.to_thread(new_upload, data, name=name, mime=mime)
        await self.pool.rows(
            f"INSERT INTO blobs (blob, data, stored_at) VALUES (%s, %s, {_NOW}) "
            "ON CONFLICT (blob) DO UPDATE SET stored_at = EXCLUDED.stored_at",
            (new.blob, data),
            f"the attachment {name!r}",
        )
        return new

    async def path(self, blob: str) -> Path | None:
        with self._reading:
            cached = self.cache.local(blob)
            if cached is not None:
                with contextlib.suppress(OSError):  # else trimmed just now: fetched again
                    os.utime(cached)  # read now: the last to be trimmed
                    return cached
        rows = await self.pool.rows(
            "SELECT data FROM blobs WHERE blob=%s", (blob,), "the attachment bytes"
        )
        if not rows:
            return None
        if self._pruner is None:  # the cache holds a copy from now on
            self._pruner = asyncio.get_running_loop().create_task(self._prune_forever())
        return await asyncio.to_thread(self._fill, blob, bytes(rows[0][0]))

    def _fill(self, blob: str, data: bytes) -> Path:
        path = self.cache.write(blob, data, blob)
        self._trim(keep=path)
        return path

    def _trim(self, keep: Path) -> None:
        """Remove the least recently read copies until the cache fits `cache_bytes`. The
        prefix directories stay: a fill may be writing into one."""
        copies = []
        for path in self.cache.root.glob("??/*"):
            with contextlib.suppress(OSError):  # removed meanwhile
                if len(path.name) == 64:
                    stat = path.stat()
                    copies.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in copies)
        recent = time.time() - RECENT_SECONDS
        for read_at, size, path in sorted(copies):
            if total <= self.cache_bytes or read_at > recent:
                break
            with self._reading, contextlib.suppress(OSError):  # gone already
                if path != keep and path.stat().st_mtime <= recent:  # not read since listed
                    path.unlink()
                    total -= size

    async def prune(self) -> int:
        """Drop this replica's copies of bytes the database no longer has; returns how many.
        A copy filled or read after the listing stays (its bytes may have been put again)."""
        listed_at = time.time()
        names = await asyncio.to_thread(self._cached_names)
        if not names:
            return 0
        rows = await self.pool.rows(
            "SELECT blob FROM blobs WHERE blob = ANY(%s)", (names,), "the attachment bytes"
        )
        known = {row[0] for row in rows}
        return await asyncio.to_thread(self._drop_unless_read, set(names) - known, listed_at)

    def _cached_names(self) -> list[str]:
        return [p.name for p in self.cache.root.glob("??/*") if len(p.name) == 64]

    def _drop_unless_read(self, names: set[str], since: float) -> int:
        dropped = 0
        for name in names:
            with self._reading, contextlib.suppress(OSError):  # gone already
                path = self.cache.local(name)
                if path is not None and path.stat().st_mtime < since:
                    self.cache.drop(name)
                    dropped += 1
        return dropped

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(self.prune_seconds)
            try:
                await self.prune()
            except Exception as exc:  # the database away: the next round tries again
                log.warning("could not prune the attachment cache: %s", exc)

    async def remove(self, blob: str) -> None:
        """Remove `blob` unless an upload row names it (another replica may have just
        recorded one for the same bytes) or a put touched it within `grace`; then, at most
        once a minute, sweep every other such blob."""
        await self.pool.rows(
            f"DELETE FROM blobs WHERE blob = %s AND stored_at < {_NOW} - %s AND {_UNNAMED}",
            (blob, self.grace),
            "the attachment bytes",
        )
        self.cache.drop(blob)
        if time.monotonic() - self._swept_at >= SWEEP_SECONDS:
            await self.sweep()

    async def sweep(self) -> int:
        """Remove every blob no upload row names and no put touched within `grace`, and this
        replica's copies of them; returns how many."""
        self._swept_at = time.monotonic()
        gone = await self.pool.rows(
            f"DELETE FROM blobs WHERE stored_at < {_NOW} - %s AND {_UNNAMED} RETURNING blob",
            (self.grace,),
            "the attachment bytes",
        )
        for (name,) in gone:
            self.cache.drop(name)
        return len(gone)

    async def adopt_local(self) -> int:
        """Copy into the database the blobs the local directory holds and it lacks: bytes
        stored in the data directory before the bytes moved into the database (a deployment
        that shared one directory). Once per process; returns how many were copied."""
        if self._adopted:
            return 0
        self._adopted = True
        await self.sweep()  # what a past removal's grace kept, or an append that never came
        local = [p for p in self.cache.root.glob("??/*") if len(p.name) == 64 and p.is_file()]
        if not local:
            return 0
        names = [p.name for p in local]
        rows = await self.pool.rows(
            "SELECT blob FROM blobs WHERE blob = ANY(%s)", (names,), "the attachment bytes"
        )
        known = {row[0] for row in rows}
        copied = 0
        for path in local:
            if path.name in known:
                continue
            data = await asyncio.to_thread(path.read_bytes)
            if hashlib.sha256(data).hexdigest() != path.name:  # not whole: leave it out
                continue
            await self.pool.rows(
                "INSERT INTO blobs (blob, data) VALUES (%s, %s) ON CONFLICT (blob) DO NOTHING",
                (path.name, data),
                "the attachment bytes",
            )
            copied += 1
        if copied:
            log.info("copied %d attachment(s) from %s into the database", copied, self.cache.root)
        return copied

    async def aclose(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        await self.pool.aclose()
