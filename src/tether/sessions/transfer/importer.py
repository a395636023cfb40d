"""`POST /api/sessions/import` behind the route (docs/api.md §12): the file is checked and
planned in a child process (`transfer/worker.py`), then written in one step.

- All or nothing: nothing is written until every session of the file is planned, and then
  all of them are created in one transaction (`EventStore.create_sessions`); attachment
  bytes stored for them are released again if that fails.
- Idempotent: each plan has a key (`session.created` `imported.key`, kept in the sidebar
  fold's state); a session whose key is already here is not created again, its row is
  answered instead. Imports run one at a time, so two uploads of one file cannot both miss:
  in this process, and with several replicas on one database across them too (the look for
  what is here and the write hold `SharedLog.exclusive("import")`, an advisory lock the
  database grants one replica at a time).
- Not activity (invariant 4): events keep their own times, so rows sort where their history
  puts them, and each session appears whole, in one commit, so the page first sees it
  complete (first sight is read: no unread dot).
- Progress: a job the page may poll (`GET /api/imports/{id}`): checking n of total sessions,
  then writing. Jobs are memory only (the import itself is in the log or not at all).
- Per person (accounts, docs/api.md §15): a job is kept under the viewer and the id they
  chose, so another person's job of the same id is neither found nor replaced; "imported
  before" looks only at the viewer's sessions (the store is `OwnedStore`), so the same file
  imported by two people makes a copy for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import time
from collections import Counter
from collections.abc import AsyncIterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from tether.errors import ImportInvalid, ImportNotFound, InternalError
from tether.log import compact_json
from tether.log.completion import to_completion
from tether.log.errors import InvalidEvent
from tether.log.ownership import VIEWER
from tether.log.store import SharedLog
from tether.sessions.service import SessionService
from tether.sessions.transfer import worker
from tether.sessions.transfer.plan import Refusal, SessionPlan, linked_only_to, refusal_error

log = logging.getLogger("tether.import")

JOBS_KEPT = 100
JOB_SECONDS = 600.0


@dataclass
class ImportJob:
    id: str
    phase: str = "reading"  # reading, checking, writing, done, failed
    done: int = 0
    total: int | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: dict[str, Any] | None = None
    created: int = 0
    existing: int = 0

    def view(self) -> dict[str, Any]:
        return {
            "import_id": self.id,
            "phase": self.phase,
            "done": self.done,
            "total": self.total,
            "created": self.created,
            "existing": self.existing,
            "error": self.error,
        }


class ImportJobs:
    """The progress of recent imports, by the viewer and the id they chose."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str | None, str], ImportJob] = {}

    def open(self, job_id: str | None) -> ImportJob:
        now = time.time()
        for key, job in list(self._jobs.items()):
            if job.finished_at is not None and now - job.finished_at > JOB_SECONDS:
                del self._jobs[key]
        while len(self._jobs) >= JOBS_KEPT:
            del self._jobs[next(iter(self._jobs))]
        job = ImportJob(job_id or "")
        if job_id:
            self._jobs[(VIEWER.get(), job_id)] = job
        return job

    def get(self, job_id: str) -> ImportJob:
        job = self._jobs.get((VIEWER.get(), job_id))
        if job is None:
            raise ImportNotFound("There is no import with this id (or it ended long ago).")
        return job


class Importer:
    def __init__(self, sessions: SessionService, shared: SharedLog | None = None) -> None:
        self.sessions = sessions
        self.jobs = ImportJobs()
        self._one_at_a_time = asyncio.Lock()
        self._shared = shared  # a log several replicas share: one import at a time of all

    def _exclusive(self) -> AbstractAsyncContextManager[None]:
        if self._shared is None:
            return contextlib.nullcontext()
        return self._shared.exclusive("import")

    async def run(self, upload: AsyncIterable[bytes], job: ImportJob) -> tuple[int, bytes]:
        """(status, body as JSON): 201 when something was created, 200 when all was here already.
        `upload` brings the file's bytes; an upload that fails fails the job too.

        The cyclic garbage collector pauses meanwhile: the plans are tens of thousands of new
        objects, and each full collection they set off would walk every object alive,
        stopping the loop for ~100 ms each time (bench/README.md); reference counting frees
        them all the same when the import is done. What a finished import leaves alive (the
        new sessions' states, their events in the caches) joins the heap frozen at startup
        (`http/app.py`): the collector would otherwise walk all of it at once when it resumes,
        15-18 ms on the loop, and find nothing to collect. A failed import is not frozen: its
        traceback's frames hold the plans, and only a collection frees them."""
        collecting = gc.isenabled()
        gc.disable()
        imported = False
        try:
            result = await self._run(upload, job)
            imported = True
            return result
        finally:
            if collecting:
                if imported:
                    gc.freeze()
                gc.enable()

    async def _run(self, upload: AsyncIterable[bytes], job: ImportJob) -> tuple[int, bytes]:
        try:
            # The chunks as they came: joining 15 MiB here held the loop for up to 20 ms
            # (bench/README.md, import_load.py); the import's child joins them.
            chunks = [chunk async for chunk in upload]
            job.phase = "checking"
            plans = await _plan_in_child(chunks, job)
            del chunks  # the file's bytes (tens of MiB) are not kept through the write
            async with self._one_at_a_time, self._exclusive():
                job.phase = "writing"
                status, body = await self._write(plans, job)
        except BaseException as exc:
            job.phase, job.finished_at = "failed", time.time()
            error = getattr(exc, "body", None)
            job.error = error() if callable(error) else {"code": "internal"}
            raise
        job.phase, job.finished_at = "done", time.time()
        return status, body

    async def _write(self, plans: list[SessionPlan], job: ImportJob) -> tuple[int, bytes]:
        store = self.sessions.store
        here = {
            state["import_key"]: sid
            for sid, state in (await store.index_states()).items()
            if state.get("import_key")
        }
        order: dict[str, None] = {}  # the file's sessions, in order, once each
        new: dict[str, SessionPlan] = {}
        for plan in plans:
            if plan.key in here:
                sid = here[plan.key]
            elif plan.key in new:
                sid = new[plan.key].session_id
            else:
                new[plan.key] = plan
                sid = plan.session_id
            order[sid] = None
        job.existing = len(order) - len(new)
        if new:
            made = {plan.session_id for plan in new.values()}
            creating = list(new.values())
            if any(plan.session_id not in made for plan in plans):  # some were here before
                creating = [linked_only_to(plan, made) for plan in creating]
            await self._create(creating)
        job.created = len(new)
        skipped: Counter[str] = Counter()
        for plan in new.values():
            skipped.update(plan.skipped)
        counts = {"created": len(new), "existing": job.existing, "skipped": dict(skipped)}
        rows = await self.sessions.rows_json(order)  # the list's texts: kept for the next list
        body = '{"sessions":' + rows + "," + compact_json.dumps(counts)[1:]
        return (201 if new else 200), body.encode()

    async def _create(self, plans: list[SessionPlan]) -> None:
        sessions = self.sessions
        uploads = [upload for plan in plans for upload in plan.uploads]
        async with sessions.blob_guard(bool(uploads)):
            blobs: dict[str, str] = {}
            try:
                for upload in uploads:
                    stored = await sessions.attachments.put(
                        upload.data, name=upload.name, mime=upload.mime
                    )
                    blobs[upload.id] = stored.blob
                batch = [(plan.session_id, _with_blobs(plan, blobs)) for plan in plans]
                await to_completion(sessions.store.create_sessions(batch))  # see queue.add
            except BaseException as exc:
                await sessions.release_blobs_held(blobs.values())
                if isinstance(exc, InvalidEvent):  # e.g. half a UTF-16 pair, which JSON can say
                    raise ImportInvalid(
                        f"The file holds data the log cannot store: {exc}"
                    ) from None
                raise


def _with_blobs(plan: SessionPlan, blobs: dict[str, str]) -> list:
    if not plan.uploads:  # most plans: looking through their drafts held the loop ~9 ms
        return plan.drafts
    out = []
    for draft in plan.drafts:
        refs = draft.data.get("attachments") or []
        mine = {ref["id"]: blobs[ref["id"]] for ref in refs if ref.get("id") in blobs}
        out.append(replace(draft, blobs=mine) if mine else draft)
    return out


async def _plan_in_child(chunks: list[bytes], job: ImportJob) -> list[SessionPlan]:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=worker.child_main, args=(theirs,), daemon=True)
    try:
        await asyncio.to_thread(child.start)
        worker.lowest_priority(child.pid)
        theirs.close()
        await asyncio.to_thread(worker.send_file, ours, chunks)
        plans: list[SessionPlan] = []
        while True:
            try:
                message = await asyncio.to_thread(ours.recv)
            except EOFError:
                raise InternalError("The import worker ended before it answered.") from None
            kind = message[0]
            if kind == "progress":
                job.done, job.total = message[1], message[2]
            elif kind == "plans":
                plans.extend(message[1])
            elif kind == "done":
                return plans
            elif kind == "refused":
                raise refusal_error(Refusal(message[1], message[2], **message[3]))
            else:
                log.error("the import worker failed:\n%s", message[1])
                raise InternalError("The import failed inside the server; see its log.")
    finally:
        ours.close()
        if child.pid is not None:
            if child.is_alive():
                child.kill()
            await asyncio.to_thread(child.join, 5)
