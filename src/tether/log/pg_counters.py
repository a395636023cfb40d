"""The per-session counter row of the PostgreSQL log (log/pg_schema.py `sessions`), as one
batch of the writer (log/postgres.py) reads and writes it: locked `FOR UPDATE` in session-id
order at the start of the transaction (no deadlock with another replica's batch), written back
at its end with the batch's last seqs, index states and what the database decides (the open
run, its Stop, its owner and epoch, its answered prompts)."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

import psycopg

from tether.log.pg_rows import INSERT_EVENTS_SQL, Batch, Op, as_columns, dumps


async def lock(
    conn: psycopg.AsyncConnection,
    batch: list[Op],
    work: Batch,
    then: Coroutine[Any, Any, None],
) -> None:
    """Lock every counter row the batch touches, in session-id order (no deadlock with
    another replica's batch), run `then` (queued behind the lock in the same round trip),
    then insert the rows of new sessions, in the same order."""
    sids = sorted({sid for op in batch for sid in op.sids()})
    cur = await conn.execute(
        "SELECT session_id, last_seq, state, open_stream, cancel_stream, open_owner, "
        "open_epoch, answered FROM sessions WHERE session_id = ANY(%b) "
        "ORDER BY session_id FOR UPDATE",
        (sids,),
    )
    await then
    for sid, last, state, open_stream, cancel, owner, epoch, answered in await cur.fetchall():
        work.last[sid] = last
        work.state[sid] = None if state is None else json.loads(state)
        work.open[sid] = open_stream
        work.cancel[sid] = cancel
        work.owner[sid] = (owner, epoch)
        work.answered[sid] = json.loads(answered)
    creating = sorted(
        {sid for op in batch if op.kind.startswith("create") for sid in op.sids()} - set(work.last)
    )
    for sid in creating:
        cur = await conn.execute(
            "INSERT INTO sessions (session_id, last_seq) VALUES (%s, 0) "
            "ON CONFLICT DO NOTHING RETURNING session_id",
            (sid,),
        )
        if await cur.fetchone() is not None:
            work.placeholders.add(sid)  # the session exists once its create succeeds
            work.last[sid] = None
            work.state[sid] = None
        else:  # another replica created it meanwhile (and has committed by now)
            cur = await conn.execute(
                "SELECT last_seq, state, open_stream, cancel_stream, open_owner, "
                "open_epoch, answered FROM sessions WHERE session_id=%s FOR UPDATE",
                (sid,),
            )
            row = await cur.fetchone()
            work.last[sid] = None if row is None else row[0]
            work.state[sid] = None if row is None or row[1] is None else json.loads(row[1])
            work.open[sid] = None if row is None else row[2]
            work.cancel[sid] = None if row is None else row[3]
            work.owner[sid] = (None, 0) if row is None else (row[4], row[5])
            work.answered[sid] = [] if row is None else json.loads(row[6])
    for sid in sids:
        work.last.setdefault(sid, None)
        work.state.setdefault(sid, None)
        work.open.setdefault(sid, None)
        work.cancel.setdefault(sid, None)
        work.owner.setdefault(sid, (None, 0))
        work.answered.setdefault(sid, [])


async def write(conn: psycopg.AsyncConnection, work: Batch, events: list[tuple]) -> dict[str, int]:
    """Insert the batch's last `events` and write each touched session's counter row and
    index state in one statement (a data-modifying WITH: one statement less per batch, whose
    cost in the replica is mostly its own send), free the rows of creates that failed; return
    the new last seqs to announce."""
    updates = []
    gone = []
    for sid in sorted(work.touched | work.placeholders):
        last = work.last[sid]
        if last is None:
            gone.append(sid)
        else:
            state = work.state[sid]
            encoded = None if state is None else dumps(state)
            updates.append(
                (
                    sid,
                    last,
                    encoded,
                    work.open[sid],
                    work.cancel[sid],
                    *work.owner[sid],
                    dumps(work.answered[sid]),
                )
            )
    unwritten = {row[0] for row in events} - {update[0] for update in updates}
    if unwritten:  # each event's session is touched: a bug, which rolls the batch back
        raise RuntimeError(f"events for sessions whose counter row is not written: {unwritten}")
    insert = f"WITH new_events AS ({INSERT_EVENTS_SQL}) " if events else ""
    params = as_columns(events) if events else []
    async with conn.cursor() as cur:
        if updates:
            await cur.execute(
                insert + "UPDATE sessions SET last_seq=u.last, state=u.state, state_seq=u.last, "
                "open_stream=u.open, cancel_stream=u.cancel, open_owner=u.owner, "
                "open_epoch=u.epoch, answered=u.answered FROM unnest(%b::text[], "
                "%b::bigint[], %b::text[], %b::text[], %b::text[], %b::text[], "
                "%b::bigint[], %b::text[]) "
                "AS u(sid, last, state, open, cancel, owner, epoch, answered) "
                "WHERE sessions.session_id = u.sid",
                params + as_columns(updates),
            )
        if gone:
            await cur.execute("DELETE FROM sessions WHERE session_id = ANY(%s)", (gone,))
    return {u[0]: u[1] for u in updates}
