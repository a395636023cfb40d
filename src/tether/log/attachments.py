"""Attachments, stored once beside the log and addressed by their SHA-256.

Events refer to an attachment by id (its hash); the bytes are written (and fsynced) before the
event that refers to them is appended, so a logged reference never dangles.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tether.log.private import DIR_MODE, FILE_MODE, private_dir


class AttachmentStore:
    def __init__(self, root: Path):
        self.root = root
        private_dir(root)

    def _path(self, attachment_id: str) -> Path:
        return self.root / attachment_id[:2] / attachment_id

    def path(self, attachment_id: str) -> Path | None:
        path = self._path(attachment_id)
        return path if path.is_file() else None

    def meta(self, attachment_id: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(attachment_id).with_suffix(".json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, data: bytes, *, name: str, mime: str) -> dict[str, Any]:
        """Store `data` (idempotent) and return the reference events carry."""
        attachment_id = hashlib.sha256(data).hexdigest()
        path = self._path(attachment_id)
        ref = {"id": attachment_id, "name": name, "mime": mime, "size": len(data)}
        if not path.exists():
            path.parent.mkdir(exist_ok=True, mode=DIR_MODE)
            _write_durably(path, data)
            _write_durably(
                path.with_suffix(".json"),
                json.dumps({"name": name, "mime": mime, "size": len(data)}).encode(),
            )
        return ref

    def remove(self, attachment_id: str) -> None:
        for path in (self._path(attachment_id), self._path(attachment_id).with_suffix(".json")):
            path.unlink(missing_ok=True)


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
