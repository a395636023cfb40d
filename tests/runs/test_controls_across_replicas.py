"""Clarify answers through a replica that does not run the stream (layer: runs controls,
runs/controls.py, over the PostgreSQL log; contract invariant 8: the answer is a durable
`clarify.answered` the owner hears through the log's wake-up, and the runtime's own
`clarify.resolved` is the truth). Two engines wired as the app wires them, on one real
database, with a runtime that asks one question per turn and waits for the answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from pg import database

from tether.runtimes.base import (
    ClarifyRequested,
    ClarifyResolved,
    Runtime,
    RuntimeEvent,
    TextDelta,
    TurnInput,
)
from tether.settings import Settings

from engine_harness import Harness, harness

pytestmark = pytest.mark.slow


class AskingRuntime(Runtime):
    name = "asking"
    model = "asking-1"
    demo = False

    def __init__(self) -> None:
        """No settings: its one question is scripted."""

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        assert turn.questions is not None
        yield ClarifyRequested("q1", "Which colour?", ("red", "blue"))
        text = await asyncio.wait_for(turn.questions.open("q1"), 30)
        yield ClarifyResolved("q1", text or "", "user" if text else "stopped")
        yield TextDelta(f"You said {text}.")


async def _asked(h: Harness, sid: str) -> str:
    """The stream of the session's run, once the log shows its question."""
    for _ in range(1000):
        fold = await h.sessions.folds.get(sid)
        for stream_id, scene in fold.transcript.active.items():
            if f"{stream_id}.clarify.q1" in scene.by_id:
                return stream_id
        await asyncio.sleep(0.01)
    raise AssertionError("the question never reached the log")


async def _resolved(h: Harness, sid: str, stream_id: str) -> list[dict]:
    for _ in range(1000):
        events = await h.store.read(sid)
        if any(e.type == "run.finished" and e.stream_id == stream_id for e in events):
            return [e.data for e in events if e.type == "clarify.resolved"]
        await asyncio.sleep(0.01)
    raise AssertionError("the run never finished")


def _replica(data: Path, url: str) -> AbstractAsyncContextManager[Harness]:
    return harness(data, AskingRuntime(), Settings(data_dir=data, database_url=url))


def test_a_question_answered_through_another_replica_reaches_the_agent_once(
    tmp_path: Path,
) -> None:
    async def main(url: str) -> None:
        async with _replica(tmp_path / "a", url) as a, _replica(tmp_path / "b", url) as b:
            sid = (await a.sessions.create(None))["session_id"]
            run = await a.engine.start(sid, "ask me")
            assert await _asked(b, sid) == run["stream_id"]
            missing = await b.controls.answer(run["stream_id"], "q9", "blue")
            assert missing["accepted"] is False  # never asked: nothing written
            answered = await b.controls.answer(run["stream_id"], "q1", "blue")
            assert answered["accepted"] is True
            assert (await b.controls.answer(run["stream_id"], "q1", "red"))["accepted"] is False
            resolved = await _resolved(a, sid, run["stream_id"])
            assert [(r["text"], r["reason"]) for r in resolved] == [("blue", "user")]

            await a.wait_idle(sid)
            again = await a.engine.start(sid, "ask me again")
            await _asked(b, sid)
            answers = await asyncio.gather(
                a.controls.answer(again["stream_id"], "q1", "red"),
                b.controls.answer(again["stream_id"], "q1", "blue"),
                b.controls.answer(again["stream_id"], "q1", "green"),
            )
            won = [x for x in answers if x["accepted"]]
            assert len(won) == 1, answers
            resolved = await _resolved(b, sid, again["stream_id"])
            texts = {0: "red", 1: "blue", 2: "green"}
            winner = texts[answers.index(won[0])]
            assert [(r["text"], r["reason"]) for r in resolved[1:]] == [(winner, "user")]
            types = [e.type for e in await a.store.read(sid)]
            assert types.count("clarify.answered") == 2

    with database() as url:
        asyncio.run(main(url))
