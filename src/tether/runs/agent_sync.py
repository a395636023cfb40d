"""Bring what other clients of the agent did into the log (issue 7, items 3-4).

A runtime whose agent keeps its own history (Hermes: `state.db`) can be driven from
elsewhere too: its CLI adds turns, compacts, or compresses the session into a continuation.
The log is Tether's only source of truth, so those facts enter it as ordinary events:

- `agent.imported` with the turns to show and the messages the model gets (the model sees
  what the user sees, contract invariant 1), and compactions done elsewhere;
- a continuation that the agent's lineage authorizes becomes a Tether continuation:
  `session.rotated` on the session, a child session driving the agent's continuation.
  A stale `POST /api/chat/start` then gets 409 `session_rotated` before any mutation
  (the engine syncs before it admits a turn).

A pass runs only while no run occupies the session (the agent's rows of a running turn are
Tether's own), under the session's lock, before every turn and every `--agent-sync-seconds`
for the sessions whose agent rows moved. A session whose rows moved while a run occupied it
is looked at again at every later interval until a pass runs: the agent's last write of a
turn comes before the run ends, and nothing may move after it. Reads never trigger a pass:
a read never writes. With several replicas, the import carries what the pass checked: the
database refuses it once another replica rotated the session, runs a turn in it or wrote
to it since (a rotated parent's transcript never changes; the rows remain for the next
pass, which imports them into the continuation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from enum import Enum

from tether import events as ev
from tether.events import new_id
from tether.log import Draft, SessionNotFound, StorageError
from tether.log.errors import SessionContinued, SessionOccupied, TranscriptMoved
from tether.projections.sidebar import given_title
from tether.runs.rotation import continue_in
from tether.runtimes.base import AgentHistory
from tether.sessions.folds import SessionFold
from tether.sessions.service import TITLE_MAX_CHARS, SessionService

log = logging.getLogger("tether.runs")

# Before a turn, passes follow one another while the agent has rows left, up to this many
# (each reads a bounded number of rows: 100,000 with Hermes); the interval passes go on.
MAX_PASSES_BEFORE_TURN = 50
# A session whose interval pass fails is tried again after RETRY_FIRST_SECONDS, then after
# twice as long each time, at most RETRY_MAX_SECONDS: a damaged row must not fill the log
# every interval. A turn's own pass (`before_start`) is never held back.
RETRY_FIRST_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0
# How many sessions up a continuation's lineage a pass reads the agent sessions of.
MAX_LINEAGE = 50


class Pass(Enum):
    """How one pass for one session went."""

    DONE = "done"  # read up to what the agent holds
    MORE = "more"  # read a bounded part, or its import was refused: rows remain
    DEFERRED = "deferred"  # a run, or a turn the agent still writes, occupies it: no pass


class AgentSync:
    """Wired only for a runtime that keeps the agent's history (runtimes/base.py,
    `AgentHistory`)."""

    def __init__(
        self,
        sessions: SessionService,
        agent: AgentHistory,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sessions = sessions
        self.agent = agent
        self._clock = clock
        # Sessions whose agent rows moved and that no pass has read since: the runtime says
        # "moved" once, so one a run occupied (or a failed pass left) waits here.
        self.unread: set[str] = set()
        # Sessions whose last interval pass failed: (failures in a row, when to try again).
        self.failing: dict[str, tuple[int, float]] = {}

    async def before_start(self, session_id: str) -> None:
        """The engine calls this under the session's lock, before it admits a turn. When the
        session continues elsewhere (the start will get 409), the passes are the
        continuation's (`sync_locked`): whoever follows the 409 finds its whole history."""
        await sync_through(self.sessions, self.agent, session_id)

    async def forever(self, interval: float) -> None:
        """Every `interval` seconds, a pass for each session whose agent rows moved. The
        runtime answers "nothing moved" cheaply (Hermes: watch.py), so an idle pass costs
        O(1), not O(sessions)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sync_moved()
            except (StorageError, SessionNotFound) as exc:
                log.warning("agent sync skipped a pass: %s", exc)
                await self._look_again()
            except Exception:  # a bug here must not stop later passes
                log.exception("agent sync failed")
                await self._look_again()

    async def sync_moved(self) -> None:
        """One interval's work: adopt what was started elsewhere, then a pass for each session
        whose agent rows moved, this time or earlier without a whole pass since. A session
        whose pass fails does not hold up the others and stays for a later interval, tried
        again after RETRY_FIRST_SECONDS, then after twice as long each time."""
        await adopt_sessions_started_elsewhere(self.sessions, self.agent)
        self.unread.update(await self.agent.agent_changed())
        now = self._clock()
        for session_id in sorted(self.unread):
            failures, retry_at = self.failing.get(session_id, (0, now))
            if now < retry_at:
                continue
            try:
                async with self.sessions.locks(session_id):
                    done = await sync_locked(self.sessions, self.agent, session_id) is Pass.DONE
            except Exception as exc:  # a bug for one session must not stop the others' passes
                delay = min(RETRY_FIRST_SECONDS * 2**failures, RETRY_MAX_SECONDS)
                self.failing[session_id] = (failures + 1, now + delay)
                log.warning(
                    "agent sync skipped session %s: %s (%d failed passes in a row; next in %.0f s)",
                    session_id,
                    exc,
                    failures + 1,
                    delay,
                    exc_info=not isinstance(exc, StorageError | SessionNotFound),  # a bug
                )
                continue
            self.failing.pop(session_id, None)
            if done:
                self.unread.discard(session_id)

    async def _look_again(self) -> None:
        """A runtime that skips passes when nothing moved must not skip the retry of one
        that failed halfway (an adoption bound but not created, a session not synced)."""
        await self.agent.agent_look_again()


async def adopt_sessions_started_elsewhere(sessions: SessionService, agent: AgentHistory) -> None:
    """Sessions a person started in the agent's own CLI show up in Tether too, with their
    history, and continue there. Bound first, created second (a crash in between is
    completed by the next pass), then marked adopted (deleting it later in Tether does not
    bring it back); the row takes the agent session's start as its activity time, so an old
    conversation does not jump to the top of the sidebar. One the agent's client archived
    is created archived (metadata, invariant 4: it moves nothing in the sidebar), as the
    person put it away there."""
    known = await sessions.store.index_states()
    for found in await agent.agent_started_elsewhere(lambda sid: sid in known):
        agent_id = found["agent_session_id"]
        session_id = await agent.agent_owner(agent_id) or new_id("s")
        if await sessions.store.last_seq(session_id) is not None:
            continue  # created since `known` was read: it is driven from Tether after all
        if not await agent.bind(session_id, agent_id):
            continue
        await sessions.create_log(
            session_id,
            [
                Draft(
                    ev.SESSION_CREATED,
                    {
                        "title": given_title((found["title"] or "")[:TITLE_MAX_CHARS]),
                        "agent_session_id": agent_id,
                        "inherited_updated_at": found["started_at"],
                        "inherited_last_message_at": None,
                    },
                ),
                *([Draft(ev.SESSION_UPDATED, {"archived": True})] if found.get("archived") else []),
            ],
        )
        await agent.agent_adopted(agent_id)  # deleted later, it stays deleted
        async with sessions.locks(session_id):
            await sync_through(sessions, agent, session_id)
        log.info(
            "the agent's session %s, started elsewhere, is Tether session %s", agent_id, session_id
        )


async def sync_through(sessions: SessionService, agent: AgentHistory, session_id: str) -> None:
    """Passes while the agent has rows left (at most MAX_PASSES_BEFORE_TURN): before a turn,
    so that the model gets all that was shown; the caller holds the session's lock."""
    for _ in range(MAX_PASSES_BEFORE_TURN):
        if await sync_locked(sessions, agent, session_id) is not Pass.MORE:
            return


async def sync_locked(sessions: SessionService, agent: AgentHistory, session_id: str) -> Pass:
    """One pass for one session; the caller holds the session's lock. A rotated session's
    log is final (its continuation shows it, and was summarized from it), so its pass is its
    newest continuation's: what its agent got after its last import goes there."""
    state = await sessions.store.index_state(session_id)
    if state is None:
        return Pass.DONE
    if state["continuation_session_id"]:
        newest = await sessions.newest_continuation(session_id)
        if newest is None or newest == session_id:
            return Pass.DONE
        async with sessions.locks(newest):  # locks go parent -> child only
            return await sync_locked(sessions, agent, newest)
    if sessions.occupancy(state).busy:
        return Pass.DEFERRED
    fold = await sessions.folds.get(session_id)
    # the live tail advances a cached fold in place: what the pass reads from is read now
    seen, watermark = fold.last_seq, fold.transcript.agent_watermark
    news = await agent.agent_news(session_id, watermark, await _continued(sessions, fold))
    if news is None:
        return Pass.DEFERRED
    if news.entries:  # nothing imported: no event (the runtime keeps how far it looked)
        imported = Draft(
            ev.AGENT_IMPORTED,
            {"source": agent.name, "watermark": news.watermark, "entries": news.entries},
            needs_no_run=True,  # several replicas: not in a session rotated meanwhile,
            after_seq=seen,  # nor after another one imported from the same watermark
        )
        try:
            await sessions.store.append(session_id, [imported])
        except (SessionContinued, SessionOccupied, TranscriptMoved):
            return Pass.MORE  # another replica wrote first: the rows remain, look again
    if news.continuation is not None:
        await _continue(sessions, agent, session_id, news.continuation)
    return Pass.MORE if news.more else Pass.DONE


async def _continued(sessions: SessionService, fold: SessionFold) -> list[tuple[str, int]]:
    """The sessions this one continues, oldest first, each with the agent watermark its log
    ended at: what their agent sessions got after it is this session's to import."""
    chain: dict[str, int] = {}
    parent_id = fold.row["parent_session_id"] if fold.row else None
    while parent_id and parent_id not in chain and len(chain) < MAX_LINEAGE:
        try:
            parent = await sessions.folds.get(parent_id)
        except SessionNotFound:
            break
        chain[parent_id] = parent.transcript.agent_watermark
        parent_id = parent.row["parent_session_id"] if parent.row else None
    return list(chain.items())[::-1]


async def _continue(
    sessions: SessionService, agent: AgentHistory, session_id: str, agent_session_id: str
) -> None:
    """Bound first, created second: a crash in between leaves a binding to a session that
    does not exist yet, which the next pass completes, never a child driving nothing."""
    owner = await agent.agent_owner(agent_session_id)
    if owner == session_id:
        return
    try:
        if owner is not None and await sessions.store.last_seq(owner) is not None:
            await continue_in(sessions, session_id, owner, create=False)  # it exists already
            return
        child_id = owner or new_id("s")
        if owner is None and not await agent.bind(child_id, agent_session_id):
            return  # bound elsewhere meanwhile: the next pass links to that session
        await continue_in(
            sessions, session_id, child_id, create=True, agent_session_id=agent_session_id
        )
    except (TranscriptMoved, SessionOccupied, SessionContinued):
        # another replica wrote to it, runs a turn in it or rotated it: bound, so the next
        # pass completes it (or finds it continued)
        log.info("the continuation of %s waits for a later pass", session_id)
        return
    async with sessions.locks(child_id):  # locks go parent -> child only
        await sync_through(sessions, agent, child_id)  # whoever follows the 409 finds its history
    log.info(
        "the agent continued %s in its session %s: Tether session %s",
        session_id,
        agent_session_id,
        child_id,
    )
