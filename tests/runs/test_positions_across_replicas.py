"""Commands planned on one replica's fold and written after another replica wrote (several
`tether serve` replicas on one PostgreSQL database, docs/operations.md). Two engines wired as
the app wires them (tests/runs/engine_harness.py), each with its own connection pool, on one
real database: replica A plans its command, and its append is held until replica B's own
command has committed, so the interleaving is the same on every run. A command that names
rows by position (a count, "the last message") is refused by the database then (404
`row_not_found`), never applied to rows the user did not see (contract invariant 1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from pg import database

from tether import events as ev
from tether.errors import QueueItemNotFound
from tether.events import SUMMARY_PREFIX
from tether.log import Draft
from tether.log.errors import SeenTranscriptChanged, SessionContinued, TranscriptMoved
from tether.runtimes.base import RuntimeEvent, TurnInput, Usage
from tether.settings import Settings

from engine_harness import GatedRuntime, Harness, harness, has, hold_append

pytestmark = pytest.mark.slow


class Answering(GatedRuntime):
    """Answers "answer" at once; `turns`: the messages each turn got."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()
        self.turns: list[list[dict[str, Any]]] = []

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.turns.append(turn.messages)
        async for event in super().stream(turn):
            yield event


class Filling(Answering):
    """Answers "answer"; with `full`, reports a context past 80% of the 1,000-token window
    the rotating replicas are given. Its summaries are recorded, and one may wait for
    `meanwhile` (another replica's command) before it is made."""

    def __init__(self, full: bool) -> None:
        super().__init__()
        self.full = full
        self.summarized: list[list[dict[str, Any]]] = []
        self.meanwhile: Callable[[], Awaitable[Any]] | None = None

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        async for event in super().stream(turn):
            yield event
        if self.full:
            yield Usage(prompt_tokens=850, completion_tokens=20)

    async def summarize(self, messages: list[dict[str, Any]], model: str | None) -> str:
        self.summarized.append(messages)
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            await meanwhile()
        return f"handoff #{len(self.summarized)}"


def _replica(data: Path, url: str) -> AbstractAsyncContextManager[Harness]:
    return harness(data, Answering(), Settings(data_dir=data, database_url=url))


def _rotating(data: Path, url: str, full: bool) -> AbstractAsyncContextManager[Harness]:
    settings = Settings(
        data_dir=data, database_url=url, context_window=1000, compression_mode="rotate"
    )
    return harness(data, Filling(full), settings)


def said(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages]


async def answered(h: Harness, sid: str, text: str) -> None:
    await h.engine.start(sid, text)
    await h.wait_idle(sid)


async def shown(h: Harness, sid: str) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in (await h.sessions.view(sid))["messages"]]


def test_a_truncate_checked_before_another_replica_wrote_is_refused_not_cut_elsewhere(
    tmp_path: Path,
) -> None:
    """Layer: sessions/service (`POST /api/session/truncate`), across replicas; contract
    invariant 1 (what is shown is what the model gets, and it is what the user asked for).
    The user sees [one, answer, two, answer] and undoes the last exchange (keep_count 2);
    a turn sent through replica B completes between replica A's check and its write. The
    count was applied to the moved transcript: B's turn, never seen by the user, was cut
    with it (200). Now the database refuses it (404 `row_not_found`) and writes nothing."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            await answered(a, sid, "one")
            await answered(a, sid, "two")
            hold_append(a, has("transcript.truncated"), lambda: answered(b, sid, "three"))
            logged = len(await a.store.read(sid)) + 4  # B's turn: submitted, started, delta, end
            with pytest.raises(TranscriptMoved) as refused:
                await a.sessions.truncate(sid, 2)
            assert (refused.value.code, refused.value.status) == ("row_not_found", 404)
            assert len(await a.store.read(sid)) == logged  # nothing of the truncate written
            assert "transcript.truncated" not in await a.types(sid)
            rows = [("user", "one"), ("assistant", "answer"), ("user", "two")]
            full = [*rows, ("assistant", "answer"), ("user", "three"), ("assistant", "answer")]
            assert await shown(a, sid) == full == await shown(b, sid)
            # the user reloads and asks again on what is there: exactly that is cut
            await a.sessions.truncate(sid, 4)
            assert await shown(b, sid) == full[:4]

    with database() as url:
        asyncio.run(main(url))


def test_a_regenerate_of_the_last_unanswered_message_checked_before_another_replica_wrote(
    tmp_path: Path,
) -> None:
    """Layer: runs/engine (`POST /api/chat/regenerate` without `row_id`, sessions/branching
    `regenerate_fork` when the transcript ends with a message nobody answered); contract
    invariant 1. Replica A finds "one" unanswered at the end and plans a new answer to it;
    a turn sent through replica B completes first. The new answer to "one" was written after
    B's answer, out of place ([one, two, answer, answer to one], 200). Now the database
    refuses it (404 `row_not_found`): no run starts, nothing is written."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            await answered(a, sid, "one")
            await a.sessions.truncate(sid, 1)  # "one" is unanswered at the end
            assert await shown(a, sid) == [("user", "one")]
            hold_append(a, has("turn.submitted", regenerate=True), lambda: answered(b, sid, "two"))
            with pytest.raises(TranscriptMoved) as refused:
                await a.engine.regenerate(sid)
            assert (refused.value.code, refused.value.status) == ("row_not_found", 404)
            assert not a.registry.busy(sid)
            submitted = [e.data for e in await a.store.read(sid) if e.type == "turn.submitted"]
            assert [d.get("regenerate", False) for d in submitted] == [False, False]
            expected = [("user", "one"), ("user", "two"), ("assistant", "answer")]
            assert await shown(a, sid) == expected == await shown(b, sid)

    with database() as url:
        asyncio.run(main(url))


def test_a_start_from_a_view_checked_before_another_replica_hid_its_rows_is_refused(
    tmp_path: Path,
) -> None:
    """Layer: the log (log/pg_batch.py, `Draft.shown_generation` against the locked counter
    row's index state), for `POST /api/chat/start {after_seq}` across replicas; contract
    invariant 1. Replica A checks a start from the user's view [one, answer, two, answer]
    (nothing hidden since), and replica B cuts the last exchange before A's append: A's
    check alone let the message land after rows the user no longer had, under a cut they
    never saw. The database refuses it, 409 `transcript_changed`: nothing written, no run.
    A rename through B in the same place (it hides nothing) does not refuse it."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            assert isinstance(a.engine.runtime, Answering)
            sid = (await a.sessions.create(None))["session_id"]
            await answered(a, sid, "one")
            await answered(a, sid, "two")
            seen = await a.store.last_seq(sid)
            assert seen is not None
            hold_append(a, has("turn.submitted"), lambda: b.sessions.truncate(sid, 2))
            logged = await a.types(sid)
            with pytest.raises(SeenTranscriptChanged) as refused:
                await a.engine.start(sid, "three", after_seq=seen)
            assert (refused.value.code, refused.value.status) == ("transcript_changed", 409)
            assert await a.types(sid) == [*logged, "transcript.truncated"]
            # the model may have been asked while the turn was on its way (the early request,
            # runs/invocation.py): nothing of it was written, and it leaves no run
            assert not a.registry.busy(sid) and not a.engine.handles.owner(sid)

            seen = await a.store.last_seq(sid)
            assert seen is not None
            hold_append(a, has("turn.submitted"), lambda: b.sessions.patch(sid, {"title": "x"}))
            await a.engine.start(sid, "three", after_seq=seen)
            await a.wait_idle(sid)
            assert said(a.engine.runtime.turns[-1]) == ["one", "answer", "three"]

    with database() as url:
        asyncio.run(main(url))


@pytest.mark.parametrize("command", ["regenerate", "edit"])
def test_a_regenerate_or_edit_from_a_view_checked_before_another_replica_hid_its_rows(
    tmp_path: Path, command: str
) -> None:
    """Layer: the log (log/pg_batch.py: `Draft.shown_generation`, checked before the position
    the command's truncate carries), for `POST /api/chat/regenerate {after_seq}` and
    `chat/start {edit_of, after_seq}` across replicas; contract invariant 1. Replica A checks
    a regenerate of the last answer, or an edit of "two", from the user's view [one, answer,
    two, answer] (nothing hidden since), and replica B cuts the last exchange before A's
    append. The database refuses it as the check would have, had the cut come first: 409
    `transcript_changed` (the page then shows what is current), not the 404 `row_not_found`
    of a position merely moved; nothing written, no run."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            assert isinstance(a.engine.runtime, Answering)
            sid = (await a.sessions.create(None))["session_id"]
            await answered(a, sid, "one")
            await answered(a, sid, "two")
            seen = await a.store.last_seq(sid)
            two = (await a.sessions.view(sid))["messages"][2]["id"]
            hold_append(a, has("transcript.truncated"), lambda: b.sessions.truncate(sid, 2))
            logged = await a.types(sid)
            with pytest.raises(SeenTranscriptChanged) as refused:
                if command == "regenerate":
                    await a.engine.regenerate(sid, after_seq=seen)
                else:
                    await a.engine.start(sid, "two, edited", edit_of=two, after_seq=seen)
            assert (refused.value.code, refused.value.status) == ("transcript_changed", 409)
            assert await a.types(sid) == [*logged, "transcript.truncated"]
            assert not a.registry.busy(sid) and len(a.engine.runtime.turns) == 2
            assert await shown(a, sid) == [("user", "one"), ("assistant", "answer")]

    with database() as url:
        asyncio.run(main(url))


async def sessions_listed(h: Harness) -> list[str]:
    return sorted(await h.store.index_states())


def test_a_rotation_summarized_before_another_replicas_turn_is_planned_again_not_written(
    tmp_path: Path,
) -> None:
    """Layer: runs/rotation (`--compression-mode rotate`), across replicas; contract
    invariant 1 (a visible turn enters the model context). Replica A's turn crossed the
    threshold, and A summarizes the parent for the handoff; replica B sees the run finished
    and runs a turn in the parent meanwhile (one that did not cross). A then rotated the
    parent: B's turn stayed in the rotated parent, shown above the child, and no model
    request of the child ever got it (its context is a summary of the turn before). Now A
    looks again under the lock before it writes: the parent's context has moved, so the
    rotation is left to a later turn, and that turn's handoff summarizes B's turn too."""

    async def main(url: str) -> None:
        async with (
            _rotating(tmp_path / "a", url, full=True) as a,
            _rotating(tmp_path / "b", url, full=False) as b,
        ):
            assert isinstance(a.engine.runtime, Filling)
            sid = (await a.sessions.create(None))["session_id"]
            a.engine.runtime.meanwhile = lambda: answered(b, sid, "two")
            await answered(a, sid, "one")
            assert len(a.engine.runtime.summarized) == 1
            assert (await a.sessions.row(sid))["continuation_session_id"] is None
            assert await sessions_listed(a) == [sid]  # no child was made
            context = await a.sessions.context(sid, "gated")
            assert said(context["context_messages"]) == ["one", "answer", "two", "answer"]
            # the next turn that crosses rotates, with a handoff of everything shown
            await answered(a, sid, "three")
            child = (await a.sessions.row(sid))["continuation_session_id"]
            assert child is not None
            handoff = a.engine.runtime.summarized[-1]
            assert said(handoff) == ["one", "answer", "two", "answer", "three", "answer"]
            context = await b.sessions.context(child, "gated")
            assert said(context["context_messages"]) == [SUMMARY_PREFIX + "handoff #2"]

    with database() as url:
        asyncio.run(main(url))


def test_a_rotation_written_after_another_replicas_turn_is_refused_and_its_child_removed(
    tmp_path: Path,
) -> None:
    """Layer: runs/rotation, across replicas; contract invariant 1. As above, but B's turn
    completes between A's last look at the parent and its `session.rotated` (A's child is
    made by then): the rotation was written after B's turn, which the child's context never
    got. Now `session.rotated` carries the seq A looked at (`Draft.after_seq`): the database
    refuses it, A removes the child it made, looks again and leaves the rotation to a later
    turn. The parent goes on with both turns in its context."""

    async def main(url: str) -> None:
        async with (
            _rotating(tmp_path / "a", url, full=True) as a,
            _rotating(tmp_path / "b", url, full=False) as b,
        ):
            sid = (await a.sessions.create(None))["session_id"]
            hold_append(a, has("session.rotated"), lambda: answered(b, sid, "two"))
            await answered(a, sid, "one")
            assert "session.rotated" not in await b.types(sid)
            assert (await b.sessions.row(sid))["continuation_session_id"] is None
            assert await sessions_listed(b) == [sid]  # the child made is gone
            context = await b.sessions.context(sid, "gated")
            assert said(context["context_messages"]) == ["one", "answer", "two", "answer"]
            await answered(b, sid, "three")  # the parent takes turns as before
            assert said((await b.sessions.view(sid))["messages"])[-2:] == ["three", "answer"]

    with database() as url:
        asyncio.run(main(url))


def test_a_rotation_whose_child_is_made_as_another_replica_writes_is_refused(
    tmp_path: Path,
) -> None:
    """Layer: runs/rotation, across replicas; contract invariant 1. As above, with B's turn
    completing while A creates the child, after A's last look at the parent: the fold A
    looked at is the cached one, which the live tail advances in place as B's events arrive,
    so a `session.rotated` whose seq was read from it after that await would name B's last
    event and pass the database's check. What A checked is read before any await."""

    async def main(url: str) -> None:
        async with (
            _rotating(tmp_path / "a", url, full=True) as a,
            _rotating(tmp_path / "b", url, full=False) as b,
        ):
            sid = (await a.sessions.create(None))["session_id"]
            real_create = a.store.create_session
            held = False

            async def create_session(session_id: str, *args: Any, **kwargs: Any) -> list:
                nonlocal held
                if session_id != sid and not held:  # the child, as the parent rotates
                    held = True
                    await answered(b, sid, "two")
                    for _ in range(500):  # until A's live tail has B's turn
                        fold = await a.sessions.folds.get(sid)
                        if len(fold.transcript.messages) == 4:
                            break
                        await asyncio.sleep(0.01)
                return await real_create(session_id, *args, **kwargs)

            a.store.create_session = create_session  # type: ignore[method-assign]
            await answered(a, sid, "one")
            assert held
            assert "session.rotated" not in await b.types(sid)
            assert await sessions_listed(b) == [sid]  # the child made is gone
            context = await b.sessions.context(sid, "gated")
            assert said(context["context_messages"]) == ["one", "answer", "two", "answer"]

    with database() as url:
        asyncio.run(main(url))


def test_a_turn_checked_before_another_replica_rotated_the_session_is_refused_there(
    tmp_path: Path,
) -> None:
    """Layer: the log (log/pg_batch.py, the counter row's `continued_in`), for a start
    across replicas; contract "inactive compression continuation recovery" (409
    `session_rotated` before any mutation) and invariant 1. Replica B checks the session (not
    rotated, no run) and records its turn after replica A rotated it: the turn ran in the
    rotated parent, which nobody shows or continues (the child's context is the summary of
    what came before). The database refuses it now, 409 `session_rotated` with the child;
    nothing of it is written and B runs nothing."""

    async def main(url: str) -> None:
        async with (
            _rotating(tmp_path / "a", url, full=True) as a,
            _rotating(tmp_path / "b", url, full=False) as b,
        ):
            assert isinstance(a.engine.runtime, Filling)
            sid = (await a.sessions.create(None))["session_id"]
            checked = asyncio.Event()
            starts: list[asyncio.Task] = []

            async def after_the_rotation() -> None:
                checked.set()  # B has checked the session: its append waits here
                for _ in range(2000):
                    if "session.rotated" in await b.types(sid):
                        return
                    await asyncio.sleep(0.005)
                raise AssertionError("the session never rotated")

            async def b_starts() -> None:  # while A summarizes
                starts.append(asyncio.create_task(b.engine.start(sid, "two")))
                await checked.wait()

            hold_append(b, has("turn.submitted"), after_the_rotation)
            a.engine.runtime.meanwhile = b_starts
            await answered(a, sid, "one")
            child = (await a.sessions.row(sid))["continuation_session_id"]
            assert child is not None
            with pytest.raises(SessionContinued) as refused:
                await starts[0]
            assert (refused.value.code, refused.value.status) == ("session_rotated", 409)
            assert refused.value.extra["continuation_session_id"] == child
            assert not b.registry.busy(sid)
            assert (await b.types(sid))[-1] == "session.rotated"  # nothing after it
            assert [m["content"] for m in (await b.sessions.view(sid))["messages"]] == [
                "one",
                "answer",
            ]

    with database() as url:
        asyncio.run(main(url))


def test_a_rotation_another_replica_rotated_first_is_dropped_and_its_run_unwinds(
    tmp_path: Path,
) -> None:
    """Layer: runs/rotation, across replicas (contract invariant 9: a finished run frees its
    session; "inactive compression continuation recovery": one continuation per parent).
    Replica A's rotation is held at its write while a turn through replica B crosses the
    threshold too and B rotates the parent first. The database refuses A's `session.rotated`
    (409 `session_rotated`); A must drop its rotation and unwind its run like any refusal:
    the refusal escaped the worker's ending, which left A's run registered, the session
    busy on A for good. The parent continues in B's child alone."""

    async def main(url: str) -> None:
        async with (
            _rotating(tmp_path / "a", url, full=True) as a,
            _rotating(tmp_path / "b", url, full=True) as b,
        ):
            sid = (await a.sessions.create(None))["session_id"]
            hold_append(a, has("session.rotated"), lambda: answered(b, sid, "two"))
            await a.engine.start(sid, "one")
            await a.wait_idle(sid)
            child = (await b.sessions.row(sid))["continuation_session_id"]
            assert isinstance(b.engine.runtime, Filling)
            assert child is not None and len(b.engine.runtime.summarized) == 1
            assert (await b.types(sid)).count("session.rotated") == 1
            assert sorted(await sessions_listed(a)) == sorted([sid, child])  # A's child is gone
            context = await a.sessions.context(child, "gated")
            assert said(context["context_messages"]) == [SUMMARY_PREFIX + "handoff #1"]

    with database() as url:
        asyncio.run(main(url))


async def queued_item(h: Harness, sid: str, text: str) -> str:
    """A message queued in `sid` (the event `POST /api/chat/queue` writes while a run is
    busy), left waiting: its id."""
    queue_id = f"q_{text.replace(' ', '_')}_{sid}"
    data = {"queue_id": queue_id, "text": text, "attachments": []}
    await h.store.append(sid, [Draft(ev.QUEUE_ADDED, data)])
    return queue_id


def test_an_edit_of_a_queued_message_that_lands_before_another_replicas_start_is_sent(
    tmp_path: Path,
) -> None:
    """Layer: runs/engine and runs/queue (docs/api.md §4 `PATCH /api/chat/queue` against the
    automatic start of the next queued message), across replicas; contract invariant 1: the
    text the user is shown for the turn (their accepted edit) is what the model gets.
    Replica B reads the queued message and starts it; replica A's edit of it commits before
    B's append. B sent the old text while A answered the edit 200. Now the database refuses
    B's start (the message was edited since B read it) and B reads it again: the edited text
    is the turn, the one the model gets."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            queue_id = await queued_item(a, sid, "old text")
            edited: list[dict[str, Any]] = []

            async def edit() -> None:
                edited.append(await a.queue.update(queue_id, "new text"))

            hold_append(b, has("queue.removed", reason="started"), edit)
            stream_id = await b.engine.start_next(sid)
            assert stream_id is not None and edited == [{"ok": True, "queue_id": queue_id}]
            await b.wait_idle(sid)
            assert await shown(a, sid) == [("user", "new text"), ("assistant", "answer")]
            assert isinstance(b.engine.runtime, Answering)
            assert said(b.engine.runtime.turns[-1]) == ["new text"]
            types = await a.types(sid)
            assert types.count("turn.submitted") == 1 and types.count("queue.removed") == 1
            assert (await a.sessions.view(sid))["queued"] == []

    with database() as url:
        asyncio.run(main(url))


def test_an_edit_of_a_queued_message_another_replica_started_first_is_refused(
    tmp_path: Path,
) -> None:
    """Layer: runs/queue (docs/api.md §4 `PATCH /api/chat/queue` and `DELETE`, against
    `POST /api/chat/queue/start`), across replicas; contract invariant 1. Replica A reads the
    queued message to edit it; replica B starts it (old text) before A's append. A's edit was
    accepted, 200, for a message already sent with the old text. Now the database refuses it,
    404 `queue_item_not_found` (the documented refusal: it left the queue), and writes
    nothing; so is a removal."""

    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            queue_id = await queued_item(a, sid, "old text")
            await a.sessions.folds.get(sid)  # A has read the message (and B too)
            started: list[dict[str, Any]] = []

            async def start() -> None:
                started.append(await b.queue.start(queue_id))
                await b.wait_idle(sid)

            hold_append(a, has("queue.updated"), start)
            with pytest.raises(QueueItemNotFound) as refused:
                await a.queue.update(queue_id, "new text")
            assert (refused.value.code, refused.value.status) == ("queue_item_not_found", 404)
            assert len(started) == 1
            assert "queue.updated" not in await a.types(sid)
            assert await shown(b, sid) == [("user", "old text"), ("assistant", "answer")]

            queue_id = await queued_item(a, sid, "another")
            await a.sessions.folds.get(sid)
            hold_append(a, has("queue.removed", reason="removed"), start)
            with pytest.raises(QueueItemNotFound):
                await a.queue.remove(queue_id)
            removed = [e.data for e in await a.store.read(sid) if e.type == "queue.removed"]
            assert [d["reason"] for d in removed] == ["started", "started"]

    with database() as url:
        asyncio.run(main(url))
