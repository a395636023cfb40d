"""One batch's transaction in the PostgreSQL log, as the writer (log/postgres.py) sends it in
its pipeline: BEGIN, the sessions' counter rows locked (log/pg_counters.py), each operation
checked against what the database decides (one unfinished run per session, a Stop once per
run, an answer once per prompt, the fence of a run taken over, a position checked before
another replica wrote, a new turn from a view whose rows another replica hid, nothing new in
a rotated session) and turned into rows, then everything written with the counter rows and
COMMIT. A refused operation fails alone; what the batch holds in memory (log/pg_rows.py
`Batch`) is what it will write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tether.events import (
    APPROVAL_ANSWERED,
    CLARIFY_ANSWERED,
    QUEUE_ADDED,
    QUEUE_REMOVED,
    QUEUE_UPDATED,
    RUN_CANCEL_REQUESTED,
    RUN_FINISHED,
    SESSION_ROTATED,
    TURN_SUBMITTED,
    Event,
)
from tether.log import owners, pg_counters, pg_owners, pg_search
from tether.log.errors import (
    CancelRequested,
    LogError,
    PromptAnswered,
    QueueItemEdited,
    QueueItemGone,
    RunTakenOver,
    SeenTranscriptChanged,
    SessionContinued,
    SessionExists,
    SessionNotFound,
    SessionOccupied,
    StreamClosed,
    TranscriptMoved,
)
from tether.log.pg_rows import INSERT_EVENTS_SQL, Batch, Op, as_columns, encode, restore, snapshot
from tether.log.store import Draft, IndexFold, SearchFold

_ANSWERS = {APPROVAL_ANSWERED: "approval_id", CLARIFY_ANSWERED: "question_id"}
# Events of one queued message: their rows carry its `queue_id` (the column), so the writer
# finds what became of the message since a replica read it (`Draft.queued_since`).
_QUEUE = (QUEUE_ADDED, QUEUE_UPDATED, QUEUE_REMOVED)


class BatchTransaction:
    """What one replica's batches write; `finished_streams` is the replica's cache of streams
    known to be finished, shared with the writer (which bounds it)."""

    def __init__(
        self,
        replica_id: str,
        clock: Callable[[], float],
        index_fold: IndexFold,
        search_fold: SearchFold | None,
        finished_streams: set[str],
    ):
        self.replica_id = replica_id
        self._clock = clock
        self._fold = index_fold
        self._search_fold = search_fold
        self._closed_streams = finished_streams

    async def run(
        self,
        conn: psycopg.AsyncConnection,
        batch: list[Op],
        work: Batch,
        outcomes: list[tuple[Op, list[Any] | LogError]],
    ) -> tuple[psycopg.AsyncCursor, dict[str, int], list[str]]:
        """The batch's transaction, sent in the open pipeline: its COMMIT's cursor, the new
        last seqs and the deleted sessions to announce."""
        await conn.execute("BEGIN")
        xact = await conn.execute("SELECT txid_current(), pg_backend_pid()")  # same round trip
        await pg_counters.lock(conn, batch, work, self._load_closed(conn, batch, work))
        work.xact = await xact.fetchone()  # arrived with the locks: no round trip of its own
        for op in batch:
            try:
                if op.kind in ("delete", "delete_idle"):
                    await self._delete(
                        conn, op.session_id, work, only_idle=op.kind == "delete_idle"
                    )
                    outcomes.append((op, []))
                elif op.kind == "create_many":
                    outcomes.append((op, await self._insert_many(conn, op, work)))
                else:
                    outcomes.append((op, await self._insert(conn, op, work)))
            except LogError as exc:
                outcomes.append((op, exc))
        events, work.rows = work.rows, []  # the last events go in with the
        await self._flush(conn, work)  # counter rows, in one statement
        announced = await pg_counters.write(conn, work, events)
        commit = await conn.execute("COMMIT")
        # every deletion, also of a session created again in the batch (then in `announced`
        # too): another replica's cursor of the deleted session means nothing for the new one
        return commit, announced, list(dict.fromkeys(work.deleted))

    async def _load_closed(
        self, conn: psycopg.AsyncConnection, batch: list[Op], work: Batch
    ) -> None:
        """Which of the batch's streams are finished, read after the sessions were locked (a
        stream is finished in its session's transaction, so this cannot change under us):
        sent behind the locking SELECT in the pipeline, so PostgreSQL runs it once the locks
        are held, and both come back in one round trip. The answer is the batch's own
        (`work.finished_before`): another batch in flight may clear the shared cache meanwhile."""
        streams = {d.stream_id for op in batch for d in op.drafts if d.stream_id is not None}
        work.finished_before = streams & self._closed_streams
        wanted = streams - work.finished_before
        if wanted:
            cur = await conn.execute(
                "SELECT stream_id FROM closed_streams WHERE stream_id = ANY(%b)", (list(wanted),)
            )
            for (stream_id,) in await cur.fetchall():
                work.finished_before.add(stream_id)
                self._closed_streams.add(stream_id)

    async def _insert(self, conn: psycopg.AsyncConnection, op: Op, work: Batch) -> list[Event]:
        sid = op.session_id
        last = work.last[sid]
        if op.kind == "create":
            if last is not None:
                raise SessionExists(sid)
            last = 0
        elif last is None:
            raise SessionNotFound(sid)
        finishing: set[str] = set()
        open_stream = work.open.get(sid)
        cancel_stream = work.cancel.get(sid)
        owner, epoch = work.owner.get(sid, (None, 0))
        answered = work.answered.get(sid, [])
        continued = work.continued.get(sid)
        generation = (work.state.get(sid) or {}).get("transcript_generation", 0)
        for n, draft in enumerate(op.drafts):
            if (  # rotated: checked by a replica before it was (an import keeps its history)
                continued is not None
                and op.kind == "append"
                and (draft.admits_run or draft.needs_no_run or draft.type == QUEUE_ADDED)
            ):
                raise SessionContinued(sid, continued)
            if draft.needs_no_run and open_stream is not None:  # a run of another replica
                raise SessionOccupied(sid, open_stream)
            # rows hidden first: a write that also moved the position is the stale view's 409
            if draft.shown_generation is not None and draft.shown_generation != generation:
                raise SeenTranscriptChanged(sid)  # another replica hid rows since the check
            if draft.after_seq is not None and draft.after_seq != last + n:
                raise TranscriptMoved(sid)  # another replica wrote since it was checked
            if draft.queued_since is not None:  # an edit, a removal or a start of it
                await self._check_queued(conn, sid, draft, work)
            if draft.type == SESSION_ROTATED:
                continued = draft.data["continuation_session_id"]
            if draft.stream_id is not None:
                stream = draft.stream_id
                if stream in finishing or stream in work.closed or stream in work.finished_before:
                    raise StreamClosed(stream)
                if (  # the fence: once taken over, only the new owner writes the run (a Stop
                    # comes from anywhere): the old owner's late appends are refused
                    stream == open_stream
                    and epoch > 0
                    and owner != self.replica_id
                    and draft.type != RUN_CANCEL_REQUESTED
                ):
                    raise RunTakenOver(stream)
                if draft.type == RUN_FINISHED:
                    finishing.add(stream)
                    if stream == open_stream:
                        open_stream, owner, epoch, answered = None, None, 0, []
                elif draft.type == TURN_SUBMITTED and open_stream != stream:
                    if draft.admits_run and open_stream is not None:  # one run per session
                        raise SessionOccupied(sid, open_stream)
                    open_stream, answered = stream, []
                    owner, epoch = (self.replica_id if draft.admits_run else None), 0
                elif draft.type == RUN_CANCEL_REQUESTED:
                    if stream == cancel_stream:  # Stop, once per run, from any replica
                        raise CancelRequested(stream)
                    cancel_stream = stream
                elif draft.type in _ANSWERS:  # an answer, once per prompt, from any replica
                    prompt = f"{stream}/{draft.type}/{draft.data[_ANSWERS[draft.type]]}"
                    if prompt in answered:
                        raise PromptAnswered(stream, prompt)
                    answered = [*answered, prompt]
        payloads_ = [encode(draft) for draft in op.drafts]  # refuse before writing
        uploads = [await self._uploads(conn, sid, d, work) for d in op.drafts]
        now = self._clock()
        state = work.state[sid]
        events = []
        for draft, payload in zip(op.drafts, payloads_, strict=True):
            last += 1
            at = now if draft.at is None else draft.at
            event = Event(sid, last, draft.type, at, draft.data, draft.stream_id, draft.turn_id)
            queue_id = draft.data.get("queue_id") if draft.type in _QUEUE else None
            text = draft.data.get("text") if draft.type == TURN_SUBMITTED else None
            work.rows.append(
                (
                    sid,
                    last,
                    draft.type,
                    float(at),
                    draft.stream_id,
                    draft.turn_id,
                    payload,
                    queue_id if isinstance(queue_id, str) else None,
                    text.replace("\x00", "") if isinstance(text, str) else None,
                )
            )
            if self._search_fold is not None:
                change = await pg_search.fold_change(
                    conn, self._search_fold, state, event, lambda: self._flush(conn, work)
                )
                await pg_search.apply_change(conn, sid, change)
            state = self._fold(state, event)
            events.append(event)
        if op.kind == "create":
            await pg_owners.record(conn, sid, op.owner)
        for rows in uploads:
            work.uploads.update(rows)
        for stream_id in finishing:
            work.closing.append((stream_id, sid))
            work.closed.add(stream_id)
        work.last[sid] = last
        work.state[sid] = state
        work.open[sid] = open_stream
        work.cancel[sid] = cancel_stream
        work.owner[sid] = (owner, epoch)
        work.answered[sid] = answered
        work.continued[sid] = continued
        work.touched.add(sid)
        return events

    async def _check_queued(
        self, conn: psycopg.AsyncConnection, sid: str, draft: Draft, work: Batch
    ) -> None:
        """Refuse an edit, a removal or a start of a queued message that left the queue after
        the replica read it at `draft.queued_since` (QueueItemGone), and a start of one
        edited since (QueueItemEdited): the session's counter row is locked, so what
        this finds (the batch's own rows first, then the table's) stays true to the commit.
        Rows written before these events carried the queue id (queue.added only) are not
        found: only what is written after a replica read the message can race it."""
        queue_id, since = draft.data["queue_id"], draft.queued_since
        types = [r[2] for r in work.rows if r[0] == sid and r[7] == queue_id and r[1] > since]
        cur = await conn.execute(
            "SELECT type FROM events WHERE queue_id=%s AND session_id=%s AND seq>%s",
            (queue_id, sid, since),
        )
        types += [t for (t,) in await cur.fetchall()]
        if QUEUE_REMOVED in types:
            raise QueueItemGone(sid, queue_id)
        starting = draft.type == QUEUE_REMOVED and draft.data.get("reason") == "started"
        if starting and QUEUE_UPDATED in types:
            raise QueueItemEdited(sid, queue_id)

    async def _insert_many(
        self, conn: psycopg.AsyncConnection, op: Op, work: Batch
    ) -> list[list[Event]]:
        """Every session of an import in a savepoint: a refusal of any rolls back what the
        others wrote (and the batch's memory of it), so it writes none of them."""
        if len(set(op.sids())) != len(op.many):
            raise SessionExists("the same session twice in one creation")
        await self._flush(conn, work)  # what came before stays out of the savepoint
        saved = snapshot(work)
        await conn.execute("SAVEPOINT create_many")
        try:
            created = [
                await self._insert(conn, Op("create", sid, drafts, op.future, op.owner), work)
                for sid, drafts in op.many
            ]
        except LogError:
            await conn.execute("ROLLBACK TO SAVEPOINT create_many")
            await conn.execute("RELEASE SAVEPOINT create_many")
            restore(work, saved)
            raise
        await conn.execute("RELEASE SAVEPOINT create_many")
        return created

    async def _uploads(
        self, conn: psycopg.AsyncConnection, sid: str, draft: Draft, work: Batch
    ) -> dict[tuple[str, str], tuple]:
        """The attachment rows (log/owners.py) the draft brings: a new upload with its blob; a
        reference moved from elsewhere takes the blob of the upload it names."""
        if draft.type not in owners.CARRIERS:
            return {}
        out: dict[tuple[str, str], tuple] = {}
        for ref in draft.data.get("attachments") or []:
            blob = draft.blobs.get(ref["id"])
            if blob is None:
                blob = next((r[2] for k, r in work.uploads.items() if k[1] == ref["id"]), None)
            if blob is None:
                cur = await conn.execute(
                    "SELECT blob FROM attachments WHERE id=%s LIMIT 1", (ref["id"],)
                )
                found = await cur.fetchone()
                blob = found[0] if found else ref["id"]
            key = (sid, ref["id"])
            if key not in work.uploads:
                out[key] = (sid, ref["id"], blob, ref["name"], ref["mime"], ref["size"])
        return out

    async def _flush(self, conn: psycopg.AsyncConnection, work: Batch) -> None:
        """Write what the batch gathered so far: before a delete, a savepoint or a stream
        read, everything; at the end, all but the events, which go in with the counter rows
        (`pg_counters.write`)."""
        async with conn.cursor() as cur:
            if work.rows:
                await cur.execute(INSERT_EVENTS_SQL, as_columns(work.rows))
            if work.uploads:
                await cur.executemany(
                    "INSERT INTO attachments (session_id, id, blob, name, mime, size) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    list(work.uploads.values()),
                )
            if work.closing:
                await cur.executemany(
                    "INSERT INTO closed_streams (stream_id, session_id) VALUES (%s, %s)",
                    work.closing,
                )
        work.rows, work.uploads = [], {}
        work.closing_written.extend(work.closing)
        work.closing = []

    async def _delete(
        self, conn: psycopg.AsyncConnection, sid: str, work: Batch, *, only_idle: bool
    ) -> None:
        if work.last[sid] is None:
            raise SessionNotFound(sid)
        running = work.open[sid]
        if only_idle and running is not None:  # another replica's run needs its log
            raise SessionOccupied(sid, running)
        await self._flush(conn, work)
        for table in ("events", "attachments", "closed_streams", "session_owners", "search_rows"):
            await conn.execute(f"DELETE FROM {table} WHERE session_id=%s", (sid,))
        work.closed -= {stream for stream, owner in work.closing_written if owner == sid}
        work.closing_written = [(s, owner) for s, owner in work.closing_written if owner != sid]
        work.last[sid] = None
        work.state[sid] = None
        work.open[sid] = None
        work.cancel[sid] = None
        work.owner[sid] = (None, 0)
        work.answered[sid] = []
        work.continued[sid] = None
        work.touched.add(sid)
        work.deleted.append(sid)
