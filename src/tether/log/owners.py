"""Who uploaded which attachment: one row per upload and session, kept by the log writer in
the same transaction as the event that refers to the upload.

The bytes are stored once per content (log/attachments.py, addressed by their SHA-256, the
`blob`), but nothing else is shared: an upload's id, name, type and session live here, so a
download always answers with the name and type given in its own session, and deleting a
session deletes its rows in the transaction that deletes its events. The blob key never
appears in an event, so two sessions cannot tell that they hold the same bytes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from tether.events import QUEUE_ADDED, TURN_SUBMITTED

# The events that bring attachment references into a session.
CARRIERS = frozenset({TURN_SUBMITTED, QUEUE_ADDED})


def record(
    db: sqlite3.Connection, session_id: str, data: dict[str, Any], blobs: Mapping[str, str]
) -> None:
    """Own every attachment `data` refers to in `session_id`. A new upload brings its blob in
    `blobs`; a reference moved from elsewhere (a queued message that starts, or follows a
    rotation) takes the blob of the upload it names."""
    for ref in data.get("attachments") or []:
        blob = blobs.get(ref["id"])
        if blob is None:
            row = db.execute("SELECT blob FROM attachments WHERE id=? LIMIT 1", (ref["id"],))
            found = row.fetchone()
            blob = found[0] if found else ref["id"]  # before m003 the id was the blob
        db.execute(
            "INSERT OR IGNORE INTO attachments (session_id, id, blob, name, mime, size) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, ref["id"], blob, ref["name"], ref["mime"], ref["size"]),
        )


def forget(db: sqlite3.Connection, session_id: str) -> None:
    db.execute("DELETE FROM attachments WHERE session_id=?", (session_id,))
