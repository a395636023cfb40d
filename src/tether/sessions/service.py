"""Session commands and reads (docs/api.md §3). Every command validates first and appends only
when something changes, so a rejected or empty request leaves the log untouched."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple, Protocol

from tether import events as ev
from tether.errors import InvalidRequest, SessionBusy, SessionRotated
from tether.events import Event, new_id
from tether.log import Draft, SessionNotFound, compact_json
from tether.log.attachments import BlobStore
from tether.log.completion import to_completion
from tether.log.store import EventStore
from tether.projections.sidebar import public_row, public_title, sort_key
from tether.sessions.branching import last_run_state, switch_draft
from tether.sessions.defaults import ServerDefaults
from tether.sessions.folds import FoldCache
from tether.sessions.row_texts import RowTexts
from tether.sessions.search import plain_snippet, search_terms
from tether.sessions.titles import TitleRefused, normalise_title

TITLE_MAX_CHARS = 200


class SessionLocks:
    """One asyncio lock per session, taken by every command that checks state then appends
    (truncate, start, patch), so a check can never be invalidated before its append."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def __call__(self, session_id: str) -> asyncio.Lock:
        return self._locks.setdefault(session_id, asyncio.Lock())

    def forget(self, session_id: str) -> None:
        self._locks.pop(session_id, None)


def clean_title(title: str) -> str:
    try:
        title = normalise_title(title)
    except TitleRefused as exc:
        raise InvalidRequest(str(exc)) from None
    if len(title) > TITLE_MAX_CHARS:
        raise InvalidRequest(f"The title is longer than {TITLE_MAX_CHARS} characters.")
    return title


class RunOccupancy(Protocol):
    """The run registry's two predicates (contract invariant 9) and its phase, as the session
    layer reads them; `runs.registry.RunRegistry` provides them. Declared here, so the
    session layer needs nothing from the runs layer above it."""

    def busy(self, session_id: str) -> bool: ...

    def attachable_stream(self, session_id: str) -> str | None: ...

    def phase(self, session_id: str) -> str: ...

    def own_stream(self, session_id: str) -> str | None: ...


class Occupancy(NamedTuple):
    """Whether a run occupies a session, the run a browser may attach to, and its phase
    (`idle`, `starting`, `running`, `cancelling`): the predicates of contract invariant 9."""

    busy: bool
    active_stream_id: str | None
    phase: str


IDLE = Occupancy(False, None, "idle")


class SessionService:
    def __init__(
        self,
        store: EventStore,
        registry: RunOccupancy,
        attachments: BlobStore,
        defaults: ServerDefaults,
    ):
        self.store = store
        self.defaults = defaults  # `--model` / `--system-prompt`, or the settings panel's
        self.registry = registry
        self.attachments = attachments
        self.folds = FoldCache(store)
        self._row_texts = RowTexts()
        self.locks = SessionLocks()
        # Bytes are shared by content across sessions: storing new bytes and recording the
        # event that holds them must never interleave with another session's check that
        # nothing holds those bytes and their removal (a blob would vanish under a logged
        # upload). Taken after a session lock, never before one.
        self._blob_lock = asyncio.Lock()

    # -- reads ------------------------------------------------------------------------------
    async def row(self, session_id: str) -> dict[str, Any] | None:
        state = await self.store.index_state(session_id)
        return None if state is None else await self._public(state)

    def occupancy(self, state: dict[str, Any]) -> Occupancy:
        """The registry's answer for a run this process runs. A run the log shows unfinished
        that no worker here runs is another replica's (a log several replicas share,
        docs/operations.md): it occupies the session until its `run.finished`, and a browser
        may attach to it until a Stop is recorded for it. A worker here still unwinding
        after its run finished (a Stop it ignores) keeps the session busy, but the run the
        log shows open then is another replica's, and that one is the run to attach to."""
        own = self.own_occupancy(state["session_id"])
        stream = state.get("open_stream")  # .get: a state an older fold wrote has neither
        if own.busy:
            mine = self.registry.own_stream(state["session_id"])
            if own.active_stream_id or stream is None or stream == mine:
                return own
        elif stream is None:
            return IDLE
        if state.get("stop_requested"):
            return Occupancy(True, None, "cancelling")
        return Occupancy(True, stream, "running")

    def own_occupancy(self, session_id: str) -> Occupancy:
        """The registry's answer alone: this process's runs, read without the log."""
        if not self.registry.busy(session_id):
            return IDLE
        registry = self.registry
        return Occupancy(True, registry.attachable_stream(session_id), registry.phase(session_id))

    async def occupancy_of(self, session_id: str) -> Occupancy:
        state = await self.store.index_state(session_id)
        if state is None:
            raise SessionNotFound(session_id)
        return self.occupancy(state)

    def refuse_if_busy(self, state: dict[str, Any], message: str) -> None:
        """409 `session_busy` (with the run to attach to) while a run occupies the session."""
        occupied = self.occupancy(state)
        if occupied.busy:
            raise SessionBusy(message, active_stream_id=occupied.active_stream_id)

    async def _public(self, state: dict[str, Any]) -> dict[str, Any]:
        sid = state["session_id"]
        occupied = self.occupancy(state)
        row = public_row(state, busy=occupied.busy, active_stream_id=occupied.active_stream_id)
        if row["continuation_session_id"]:  # several hops: point at the newest
            row["continuation_session_id"] = await self.newest_continuation(sid)
        return row

    async def list_json(self, *, archived: bool, query: str | None) -> bytes:
        """The body of `GET /api/sessions`: `{"sessions": [Row, ...]}` as JSON, each row's
        text kept from the last list while it has not changed (sessions/row_texts.py)."""
        states = await self.store.index_states()
        if archived:
            chosen = [s for s in states.values() if s["archived"]]
        else:
            chosen = [
                s for s in states.values() if not s["archived"] and not s["continuation_session_id"]
            ]
        if query:
            needle = query.casefold()
            by_text = await self.store.search_text(query)
            chosen = [
                s
                for s in chosen
                if s["session_id"] in by_text or needle in public_title(s).casefold()
            ]
        texts = [await self._row_text(state) for state in sorted(chosen, key=sort_key)]
        return ('{"sessions":[' + ",".join(texts) + "]}").encode()

    async def rows_json(self, session_ids: Iterable[str]) -> str:
        """These sessions' rows as a JSON array, in this order (deleted ones left out): the
        list's own texts, so the next list finds them kept (where the store hands out the
        list's own state objects, as SQLite's does). Yields to the loop every 100 rows: an
        import answers with a thousand new ones."""
        texts = []
        for n, sid in enumerate(session_ids, start=1):
            state = await self.store.index_state(sid)
            if state is not None:
                texts.append(await self._row_text(state))
            if n % 100 == 0:
                await asyncio.sleep(0)
        return "[" + ",".join(texts) + "]"

    async def _row_text(self, state: dict[str, Any]) -> str:
        if state["continuation_session_id"]:  # a rotated parent: its newest child, resolved anew
            return compact_json.dumps(await self._public(state))
        occupied = self.occupancy(state)
        return self._row_texts.text(state, occupied.busy, occupied.active_stream_id)

    async def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """`GET /api/search` (docs/api.md §13): rows whose text holds every word typed, best
        first, each with its session's title, its snippet as parts, and whether the row is
        on the branch shown now (read from the session's fold, never stored in the index)."""
        found = await self.store.search(search_terms(query), limit)
        results = []
        shown_rows: dict[str, set[str]] = {}
        for hit in found:
            state = await self.store.index_state(hit.session_id)
            if state is None:  # deleted between the two reads
                continue
            if hit.session_id not in shown_rows:
                try:
                    fold = await self.folds.get(hit.session_id)
                except SessionNotFound:  # deleted since
                    continue
                shown_rows[hit.session_id] = {row["id"] for row in fold.transcript.messages}
            snippet = plain_snippet(hit.snippet) if hit.role == "assistant" else hit.snippet
            results.append(
                {
                    "session_id": hit.session_id,
                    "title": public_title(state),
                    "row_id": hit.row_id,
                    "role": hit.role,
                    "at": hit.at,
                    "snippet": "".join(text for text, _ in snippet),
                    "snippet_parts": [{"text": t, "match": m} for t, m in snippet],
                    "shown": hit.row_id in shown_rows[hit.session_id],
                }
            )
        return results

    async def newest_continuation(self, session_id: str) -> str | None:
        """Follow `continuation_session_id` hops to the newest session of the lineage."""
        seen = {session_id}
        state = await self.store.index_state(session_id)
        newest = None
        while state is not None and state["continuation_session_id"]:
            newest = state["continuation_session_id"]
            if newest in seen:
                break
            seen.add(newest)
            state = await self.store.index_state(newest)
        return newest

    async def refuse_if_rotated(self, state: dict[str, Any]) -> None:
        """A rotated session's transcript is history its continuation builds on (display
        and, through the handoff, model context): a command that would change it answers
        409 `session_rotated` with the newest continuation, before any mutation. Starting a
        turn, queueing one and truncating (the base of edit, retry and undo) all check this."""
        if state["continuation_session_id"]:
            raise SessionRotated(
                "This conversation continues in a newer session.",
                continuation_session_id=await self.newest_continuation(state["session_id"]),
            )

    async def view(self, session_id: str) -> dict[str, Any]:
        """The `session` object of `GET /api/session`: Row + transcript + pending + live."""
        fold = await self.folds.get(session_id)
        assert fold.row is not None
        body = await self._public(fold.row)
        body.update(fold.transcript.view())
        body["last_seq"] = fold.last_seq
        body["inherited_messages"] = await self._inherited(fold.row["parent_session_id"])
        return body

    async def _inherited(self, parent_id: str | None) -> list[dict[str, Any]]:
        """The ancestors' visible rows, oldest first, each marked with its session: display
        only, shown above a rotated continuation's own history (never in its context)."""
        chain: list[tuple[str, list[dict[str, Any]]]] = []
        seen: set[str] = set()
        while parent_id and parent_id not in seen and len(chain) < 50:
            seen.add(parent_id)
            try:
                parent = await self.folds.get(parent_id)
            except SessionNotFound:
                break
            chain.append((parent_id, parent.transcript.view()["messages"]))
            parent_id = parent.row["parent_session_id"] if parent.row else None
        return [{**row, "session_id": sid} for sid, rows in reversed(chain) for row in rows]

    async def context(self, session_id: str, runtime: str) -> dict[str, Any]:
        """The context view (docs/api.md §3) for the server's `runtime` (its name)."""
        fold = await self.folds.get(session_id)
        return fold.context((await self.defaults.current()).system_prompt, runtime)

    # -- commands ---------------------------------------------------------------------------
    async def create(self, title: str | None) -> dict[str, Any]:
        data = {"title": clean_title(title)} if title is not None else {"title": None}
        session_id = new_id("s")
        await self.create_log(session_id, [Draft(ev.SESSION_CREATED, data)])
        row = await self.row(session_id)
        assert row is not None
        return row

    async def create_log(
        self, session_id: str, drafts: list[Draft], owner: str | None = None
    ) -> list[Event]:
        """Create a session's log, its fold cached from the creating events, so that its
        first turn reads nothing from the log before the model is asked (FoldCache.adopt)."""
        created = await self.store.create_session(session_id, drafts, owner)
        self.folds.adopt(session_id, created)
        return created

    async def patch(self, session_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        if not changes:
            raise InvalidRequest(
                "Nothing to change: send title, pinned, archived, model or system_prompt."
            )
        if "title" in changes:
            changes["title"] = clean_title(changes["title"])
        if changes.get("model") is not None:
            changes["model"] = changes["model"].strip()
            if not changes["model"]:
                raise InvalidRequest("A model id is text; send null for the server default.")
        if changes.get("system_prompt") is not None and not changes["system_prompt"].strip():
            changes["system_prompt"] = None  # blank: back to the server default
        async with self.locks(session_id):
            state = await self.store.index_state(session_id)
            if state is None:
                raise SessionNotFound(session_id)
            current = await self._public(state)
            delta = {k: v for k, v in changes.items() if current[k] != v}
            if delta:
                await self.store.append(session_id, [Draft(ev.SESSION_UPDATED, delta)])
        row = await self.row(session_id)
        if row is None:
            raise SessionNotFound(session_id)
        return row

    async def delete(self, session_id: str) -> None:
        async with self.locks(session_id):
            state = await self.store.index_state(session_id)
            if state is None:
                raise SessionNotFound(session_id)
            self.refuse_if_busy(state, "Stop the running turn before deleting this session.")
            blobs = await self.store.session_blobs(session_id)
            await to_completion(self._delete(session_id, blobs))

    async def _delete(self, session_id: str, blobs: set[str]) -> None:
        """The deletion and what its commit calls for, as one step (`to_completion`):
        otherwise a caller cancelled as the deletion committed left its bytes on disk."""
        # its uploads' rows go with its events; refused while another replica runs it
        await self.store.delete_session(session_id, only_idle=True)
        self.forget(session_id)
        self.locks.forget(session_id)
        async with self._blob_lock:
            await self.release_blobs_held(blobs)

    def forget(self, session_id: str) -> None:
        """What is kept of a session that is gone (deleted here or through another replica):
        its fold and its row's text."""
        self.folds.forget(session_id)
        self._row_texts.forget(session_id)

    def blob_guard(self, storing: bool) -> AbstractAsyncContextManager[Any]:
        """Hold it from storing new uploads' bytes until their event is appended."""
        return self._blob_lock if storing else contextlib.nullcontext()

    async def release_blobs_held(self, blobs: Iterable[str]) -> None:
        """Bytes are stored once per content: remove those no upload holds (after a session
        is deleted, or when the event that would have held new bytes was not written). The
        caller holds `blob_guard`."""
        for blob in set(blobs):
            if not await self.store.blob_in_use(blob):
                await self.attachments.remove(blob)

    async def truncate(self, session_id: str, keep_count: int) -> dict[str, Any]:
        """Hide the visible rows from `keep_count` on (docs/api.md §3). `keep_count` counts
        the rows of the transcript checked here: with several replicas, a write another one
        made since is refused by the database (404 `row_not_found`, TranscriptMoved), never
        cut at the same count of a transcript that moved (contract invariant 1)."""
        async with self.locks(session_id):
            state = await self.store.index_state(session_id)
            if state is None:
                raise SessionNotFound(session_id)
            await self.refuse_if_rotated(state)
            self.refuse_if_busy(state, "A run is still using this session; stop it first.")
            fold = await self.folds.get(session_id)
            assert fold.row is not None
            count = len(fold.transcript.messages)
            if keep_count > count:
                raise InvalidRequest(
                    f"keep_count {keep_count} is more than the {count} messages this session has.",
                )
            if keep_count < count:
                generation = fold.row["transcript_generation"] + 1
                await self.store.append(
                    session_id,
                    [
                        Draft(
                            ev.TRANSCRIPT_TRUNCATED,
                            {
                                "keep_count": keep_count,
                                "transcript_generation": generation,
                                "last_run_state": last_run_state(
                                    fold, fold.transcript.messages[:keep_count]
                                ),
                            },
                            needs_no_run=True,
                            # several replicas: `keep_count` counts the rows of this fold;
                            # refused (TranscriptMoved) if another replica wrote since
                            after_seq=fold.last_seq,
                        )
                    ],
                )
        row = await self.row(session_id)
        assert row is not None
        return row

    async def switch_branch(self, session_id: str, row_id: str, index: int) -> dict[str, Any]:
        """Show branch `index` of the fork at the visible row `row_id` (docs/api.md §10):
        what the page shows and what the model gets next follow it (invariant 1). Not
        activity (invariant 4); refused like truncate on a rotated or busy session."""
        async with self.locks(session_id):
            state = await self.store.index_state(session_id)
            if state is None:
                raise SessionNotFound(session_id)
            await self.refuse_if_rotated(state)
            self.refuse_if_busy(state, "A run is still using this session; stop it first.")
            draft = switch_draft(await self.folds.get(session_id), row_id, index)
            if draft is not None:
                await self.store.append(session_id, [draft])
        return await self.view(session_id)
