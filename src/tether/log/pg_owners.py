"""The PostgreSQL backend's session owners (docs/api.md §15): `session_owners` (migration
m004, log/pg_schema.py) holds a row per owned session, written in the transaction that
creates the session and deleted in the one that deletes it. A claim gives every committed
session without a row to one user, in one statement, so two replicas claiming at once give
each session once (the primary key decides)."""

from __future__ import annotations

import psycopg

OWNER_SQL = "SELECT owner FROM session_owners WHERE session_id=%s"


async def record(conn: psycopg.AsyncConnection, session_id: str, owner: str | None) -> None:
    """The new session's owner, in the transaction that creates it (None: unowned)."""
    if owner is not None:
        await conn.execute(
            "INSERT INTO session_owners (session_id, owner) VALUES (%s, %s) "
            "ON CONFLICT (session_id) DO UPDATE SET owner=excluded.owner",
            (session_id, owner.replace("\x00", "")),
        )


async def forget(conn: psycopg.AsyncConnection, session_id: str) -> None:
    await conn.execute("DELETE FROM session_owners WHERE session_id=%s", (session_id,))


async def claim(conn: psycopg.AsyncConnection, owner: str) -> int:
    """Give every committed, unowned session to `owner`; how many were given. The counter
    rows of the sessions given are locked `FOR SHARE`, in session-id order as every writer
    locks them: a deletion (which holds its row `FOR UPDATE`) then either waits for the
    claim and removes its owner row, or commits first and the claim skips the session.
    Without it, a deletion could miss the claim's uncommitted row and leave it behind."""
    async with conn.transaction():
        cur = await conn.execute(
            "INSERT INTO session_owners (session_id, owner) SELECT s.session_id, %s "
            "FROM sessions s WHERE s.last_seq > 0 AND NOT EXISTS "
            "(SELECT 1 FROM session_owners o WHERE o.session_id = s.session_id) "
            "ORDER BY s.session_id FOR SHARE OF s "
            "ON CONFLICT (session_id) DO NOTHING RETURNING session_id",
            (owner.replace("\x00", ""),),
        )
        return len(await cur.fetchall())
