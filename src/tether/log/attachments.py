"""Attachment bytes, stored once beside the log and addressed by their SHA-256 (the blob).

Everything else about an upload (its id, name, type and session) is per upload and lives in
the database (log/owners.py), so sharing the bytes stays invisible. The bytes are written (and
fsynced) before the event that refers to them is appended, so a logged reference never
dangles.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.events import new_id


@dataclass(frozen=True, slots=True)
class StoredUpload:
    """`ref` is what the event carries (`{id, name, mime, size}`); `blob` goes beside it."""

    ref: dict[str, Any]
    blob: str


class AttachmentStore:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # Before migration m003 every blob had a file of the first uploader's name and type
        # beside it, shared by every session: the names now live per upload in the database.
        for legacy in root.glob("??/*.json"):
            legacy.unlink(missing_ok=True)

    def _path(self, blob: str) -> Path:
        return self.root / blob[:2] / blob

    def path(self, blob: str) -> Path | None:
        path = self._path(blob)
        return path if path.is_file() else None

    def put(self, data: bytes, *, name: str, mime: str) -> StoredUpload:
        """Store `data` (once per content) and return a new upload of it."""
        blob = hashlib.sha256(data).hexdigest()
        path = self._path(blob)
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            _write_durably(path, data)
        ref = {"id": new_id("a"), "name": name, "mime": mime, "size": len(data)}
        return StoredUpload(ref, blob)

    def remove(self, blob: str) -> None:
        self._path(blob).unlink(missing_ok=True)


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
