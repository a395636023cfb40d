"""Attachment bytes, stored once beside the log and addressed by their SHA-256 (the blob).

Everything else about an upload (its id, name, type and session) is per upload and lives in
the database (log/owners.py), so sharing the bytes stays invisible. The bytes are written (and
fsynced) before the event that refers to them is appended, so a logged reference never
dangles.

`BlobStore` is the seam: `AttachmentStore` keeps the bytes under the data directory (the
embedded mode, or replicas sharing one directory); log/pg_blobs.py keeps them in the
PostgreSQL database, with this store as each replica's local cache of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether.events import new_id
from tether.log.errors import StorageError
from tether.log.private import DIR_MODE, private_dir, write_whole


@dataclass(frozen=True, slots=True)
class StoredUpload:
    """`ref` is what the event carries (`{id, name, mime, size}`); `blob` goes beside it."""

    ref: dict[str, Any]
    blob: str


def new_upload(data: bytes, *, name: str, mime: str) -> StoredUpload:
    """A new upload of `data`: a fresh id, and its bytes' SHA-256 as the blob."""
    ref = {"id": new_id("a"), "name": name, "mime": mime, "size": len(data)}
    return StoredUpload(ref, hashlib.sha256(data).hexdigest())


class BlobStore(Protocol):
    async def put(self, data: bytes, *, name: str, mime: str) -> StoredUpload:
        """Store `data` durably (once per content) and return a new upload of it."""

    async def path(self, blob: str) -> Path | None:
        """A local file holding the blob's bytes (what the runtimes and downloads read), or
        None when no such bytes are stored."""

    async def remove(self, blob: str) -> None:
        """Drop the bytes (the caller checked that no upload holds them). A store shared by
        replicas may keep them a while: another replica may be about to record an upload of
        the same bytes (log/pg_blobs.py)."""

    async def aclose(self) -> None: ...


class AttachmentStore:
    def __init__(self, root: Path):
        self.root = root
        private_dir(root)
        # Before migration m003 every blob had a file of the first uploader's name and type
        # beside it, shared by every session: the names now live per upload in the database.
        for legacy in root.glob("??/*.json"):
            legacy.unlink(missing_ok=True)
        for unfinished in root.glob("??/*.tmp"):  # a write cut short by a crash
            unfinished.unlink(missing_ok=True)

    def _path(self, blob: str) -> Path:
        return self.root / blob[:2] / blob

    def local(self, blob: str) -> Path | None:
        path = self._path(blob)
        return path if path.is_file() else None

    async def path(self, blob: str) -> Path | None:
        return self.local(blob)

    async def put(self, data: bytes, *, name: str, mime: str) -> StoredUpload:
        return await asyncio.to_thread(self._put, data, name, mime)  # hashing, fsync: off the loop

    def _put(self, data: bytes, name: str, mime: str) -> StoredUpload:
        new = new_upload(data, name=name, mime=mime)
        self.write(new.blob, data, name)
        return new

    def write(self, blob: str, data: bytes, name: str) -> Path:
        """The blob's file, written (and fsynced) unless it is there already."""
        path = self._path(blob)
        if not path.exists():
            try:
                _write_durably(path, data)
            except OSError as exc:  # disk full, quota, read-only: 503, and no file left
                raise StorageError(
                    f"could not store the attachment {name!r} in {self.root}: {exc.strerror or exc}"
                ) from exc
        return path

    async def remove(self, blob: str) -> None:
        self.drop(blob)

    def drop(self, blob: str) -> None:
        path = self._path(blob)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # still holds other blobs
            path.parent.rmdir()

    async def aclose(self) -> None:
        return None


def _write_durably(path: Path, data: bytes) -> None:
    """Write to a temporary file, fsync, rename. Fault found by
    tests/faults/test_storage_faults.py: on a full disk the temporary file (and a new
    directory) stayed behind, empty, after the failure; now a failed write leaves nothing."""
    made_dir = not path.parent.exists()
    path.parent.mkdir(exist_ok=True, mode=DIR_MODE)
    try:  # two replicas' caches (or two reads here) may write one blob at once
        write_whole(path, data)
    except BaseException:
        if made_dir:
            with contextlib.suppress(OSError):  # another upload may have put a file there
                path.parent.rmdir()
        raise
