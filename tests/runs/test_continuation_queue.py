"""Queued messages when an agent's continuation is completed by a later pass
(runs/rotation.py `continue_in(create=False)`, called by agent sync). Layers: the log
(`queue.added` / `queue.removed` in parent and child) and the queue the page shows
(contract: nothing a user typed is lost, nothing shown twice). A pass cut short after
creating the child left copies of the parent's queue in it; the parent stayed the live
session, so its queue may have changed before the next pass completes the rotation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pg import database

from tether import events as ev
from tether.log import Draft
from tether.log.errors import TranscriptMoved
from tether.runs.rotation import continue_in
from tether.settings import Settings

from engine_harness import GatedRuntime, Harness, harness, has, hold_append


def queued(queue_id: str, text: str) -> Draft:
    return Draft(ev.QUEUE_ADDED, {"queue_id": queue_id, "text": text, "attachments": []})


async def parent_and_cut_short_child(h: Harness, texts: dict[str, str]) -> tuple[str, str]:
    """A parent queueing `texts`, and the child a pass made for it (copies of that queue in
    its creating append) before it was cut short: the parent not yet rotated."""
    parent = (await h.sessions.create("Research"))["session_id"]
    await h.store.append(parent, [queued(q, t) for q, t in texts.items()])
    child = "s_child"
    created = {"title": "Research", "parent_session_id": parent, "agent_session_id": "a_2"}
    await h.store.create_session(
        child,
        [Draft(ev.SESSION_CREATED, created)] + [queued(q, t) for q, t in texts.items()],
    )
    return parent, child


async def queue_of(h: Harness, session_id: str) -> dict[str, str]:
    fold = await h.sessions.folds.get(session_id)
    return {q: item["text"] for q, item in fold.transcript.queued.items()}


async def added(h: Harness, session_id: str) -> list[str]:
    return [e.data["queue_id"] for e in await h.store.read(session_id) if e.type == "queue.added"]


def test_the_child_ends_with_the_parent_s_queue_as_it_is_when_the_pass_completes(
    tmp_path: Path,
) -> None:
    """The user removed one queued message from the parent after the cut-short pass: the
    child's copy of it goes, the other is carried once, and the parent queues nothing."""

    async def main() -> None:
        async with harness(tmp_path, GatedRuntime()) as h:
            parent, child = await parent_and_cut_short_child(h, {"q_1": "one", "q_2": "two"})
            await h.queue.remove("q_1")
            async with h.sessions.locks(parent):
                assert await continue_in(h.sessions, parent, child, create=False) == child
            assert await queue_of(h, parent) == {}
            assert (await h.types(parent))[-2:] == ["session.rotated", "queue.removed"]
            assert await queue_of(h, child) == {"q_2": "two"}
            assert await added(h, child) == ["q_1", "q_2"]  # the creating append's, no more

    asyncio.run(main())


def test_a_queue_added_after_the_cut_short_pass_arrives_before_the_parent_lets_go(
    tmp_path: Path,
) -> None:
    """A message queued in the parent after the cut-short pass reaches the child in an
    append of its own, before the parent's `queue.removed` ("moved") is written."""

    async def main() -> None:
        async with harness(tmp_path, GatedRuntime()) as h:
            parent, child = await parent_and_cut_short_child(h, {"q_1": "one"})
            await h.store.append(parent, [queued("q_3", "three")])
            order: list[tuple[str, str]] = []
            real_append = h.store.append

            async def noting_append(session_id: str, drafts: list[Draft]) -> list:
                order.extend((session_id, d.type) for d in drafts)
                return await real_append(session_id, drafts)

            h.store.append = noting_append  # type: ignore[method-assign]
            async with h.sessions.locks(parent):
                await continue_in(h.sessions, parent, child, create=False)
            assert order == [
                (child, "queue.added"),
                (parent, "session.rotated"),
                (parent, "queue.removed"),
                (parent, "queue.removed"),
            ]
            assert await queue_of(h, child) == {"q_1": "one", "q_3": "three"}

    asyncio.run(main())


def test_a_refused_rotation_takes_its_copies_back_out_of_the_child(tmp_path: Path) -> None:
    """On a log several replicas share, another replica writes to the parent between the
    child's copies and `session.rotated`: the rotation is refused (TranscriptMoved), the
    parent keeps its queue and the child shows none of it; the next pass copies what the
    parent queues then."""

    async def main(url: str) -> None:
        settings = Settings(data_dir=tmp_path, database_url=url)
        async with harness(tmp_path, GatedRuntime(), settings) as h:
            parent, child = await parent_and_cut_short_child(h, {})
            await h.store.append(parent, [queued("q_1", "one")])
            elsewhere = h.store.append(parent, [queued("q_2", "two")])
            hold_append(h, has(ev.QUEUE_ADDED, queue_id="q_1"), lambda: elsewhere)
            with pytest.raises(TranscriptMoved):
                async with h.sessions.locks(parent):
                    await continue_in(h.sessions, parent, child, create=False)
            assert await queue_of(h, parent) == {"q_1": "one", "q_2": "two"}
            assert await queue_of(h, child) == {}
            async with h.sessions.locks(parent):
                await continue_in(h.sessions, parent, child, create=False)
            assert await queue_of(h, child) == {"q_1": "one", "q_2": "two"}
            assert await queue_of(h, parent) == {}

    with database() as url:
        asyncio.run(main(url))
