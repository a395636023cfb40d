"""Commands planned on one replica's fold and written after another replica wrote (several
`tether serve` replicas on one PostgreSQL database, docs/operations.md). Two engines wired as
the app wires them (tests/runs/engine_harness.py), each with its own connection pool, on one
real database: replica A plans its command, and its append is held until replica B's own
command has committed, so the interleaving is the same on every run. A command that names
rows by position (a count, "the last message") is refused by the database then (404
`row_not_found`), never applied to rows the user did not see (contract invariant 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from pg import database

from tether.log import Draft
from tether.log.errors import TranscriptMoved
from tether.settings import Settings

from engine_harness import GatedRuntime, Harness, harness

pytestmark = pytest.mark.slow


class Answering(GatedRuntime):
    """Answers "answer" at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.set()


def _replica(data: Path, url: str) -> AbstractAsyncContextManager[Harness]:
    return harness(data, Answering(), Settings(data_dir=data, database_url=url))


def hold_append(
    h: Harness, when: Callable[[list[Draft]], bool], meanwhile: Callable[[], Awaitable[Any]]
) -> None:
    """Replica `h`'s first append of drafts `when` picks waits for `meanwhile` (another
    replica's command, to its commit) before it goes to the database."""
    real_append = h.store.append
    held = False

    async def append(session_id: str, drafts: list[Draft]) -> list:
        nonlocal held
        if not held and when(drafts):
            held = True
            await meanwhile()
        return await real_append(session_id, drafts)

    h.store.append = append  # type: ignore[method-assign]


def has(event_type: str, **data: Any) -> Callable[[list[Draft]], bool]:
    def picks(drafts: list[Draft]) -> bool:
        return any(
            d.type == event_type and all(d.data.get(k) == v for k, v in data.items())
            for d in drafts
        )

    return picks


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
