"""The per-session counter row of the PostgreSQL log (log/pg_schema.py `sessions`), as one
batch of the writer (log/postgres.py) reads and writes it: locked `FOR UPDATE` (or inserted,
for a new session) in session-id order at the start of the transaction (no deadlock with
another replica's batch), written back at its end with the batch's last seqs, index states
and what the database decides (the open run, its Stop, its owner and epoch, its answered
prompts, the session a rotated one continues in)."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

import psycopg

from tether.log.pg_rows import INSERT_EVENTS_SQL, Batch, Op, as_columns, dumps

_LOCK_SQL = (
    "SELECT session_id, last_seq, state, open_stream, cancel_stream, open_owner, open_epoch, "
    "answered, continued_in FROM sessions WHERE session_id = ANY(%b) ORDER BY session_id "
    "FOR UPDATE"
)


async def lock(
    conn: psycopg.AsyncConnection,
    batch: list[Op],
    work: Batch,
    then: Coroutine[Any, Any, None],
) -> None:
    """Lock every counter row the batch touches, all in one session-id order (no deadlock with
    another replica's batch), then run `then`. A batch without creates takes them all in one
    statement, with `then` queued behind it in the same round trip; a batch with creates
    walks the ids in order, inserting the row of a new session where its turn comes."""
    sids = sorted({sid for op in batch for sid in op.sids()})
    creating = {sid for op in batch if op.kind.startswith("create") for sid in op.sids()}
    if not creating:
        cur = await conn.execute(_LOCK_SQL, (sids,))
        await then
        _read(work, await cur.fetchall())
    else:
        await _lock_in_order(conn, sids, creating, work)
        await then
    for sid in sids:
        work.last.setdefault(sid, None)
        work.state.setdefault(sid, None)
        work.open.setdefault(sid, None)
        work.cancel.setdefault(sid, None)
        work.owner.setdefault(sid, (None, 0))
        work.answered.setdefault(sid, [])
        work.continued.setdefault(sid, None)


async def _lock_in_order(
    conn: psycopg.AsyncConnection, sids: list[str], creating: set[str], work: Batch
) -> None:
    """Existing rows locked and new ones inserted strictly in `sids`' order. Locking every
    existing row first and inserting the new ones after could deadlock: another
    replica's batch that had inserted a lower id this batch creates, and then waited for a
    higher row this batch held, waited in a cycle with it."""
    run: list[str] = []  # ids between two creates, locked together in one statement
    for sid in [*sids, None]:
        if sid is not None and sid not in creating:
            run.append(sid)
            continue
        if run:
            _read(work, await (await conn.execute(_LOCK_SQL, (run,))).fetchall())
            run = []
        if sid is None:
            break
        while True:
            cur = await conn.execute(
                "INSERT INTO sessions (session_id, last_seq) VALUES (%s, 0) "
                "ON CONFLICT DO NOTHING RETURNING session_id",
                (sid,),
            )
            if await cur.fetchone() is not None:
                work.placeholders.add(sid)  # the session exists once its create succeeds
                work.last[sid] = None
                work.state[sid] = None
                break
            # it exists: created earlier, or by another replica that has committed by now
            rows = await (await conn.execute(_LOCK_SQL, ([sid],))).fetchall()
            if rows:
                _read(work, rows)
                break
            # deleted by another replica between the insert and the lock: insert again (the
            # batch must hold a counter row for every session it writes)


def _read(work: Batch, rows: list[tuple]) -> None:
    for sid, last, state, open_stream, cancel, owner, epoch, answered, continued in rows:
        work.last[sid] = last
        work.state[sid] = None if state is None else json.loads(state)
        work.open[sid] = open_stream
        work.cancel[sid] = cancel
        work.owner[sid] = (owner, epoch)
        work.answered[sid] = json.loads(answered)
        work.continued[sid] = continued


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
                    work.continued[sid],
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
                "open_epoch=u.epoch, answered=u.answered, continued_in=u.continued "
                "FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[], "
                "%b::text[], %b::bigint[], %b::text[], %b::text[]) "
                "AS u(sid, last, state, open, cancel, owner, epoch, answered, continued) "
                "WHERE sessions.session_id = u.sid",
                params + as_columns(updates),
            )
        if gone:
            await cur.execute("DELETE FROM sessions WHERE session_id = ANY(%s)", (gone,))
    return {u[0]: u[1] for u in updates}
