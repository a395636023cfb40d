"""The early request (runs/invocation.py) when the log contradicts it. Layers: runs (the
worker keeps the request sent while the turn committed only when it asked what the log's
fold asks) over the PostgreSQL log; contract invariant 1 (the model sees what the user
sees) and invariant 2 (nothing of a run is written before its turn). On a log several
replicas share, another replica may write to the session between the early request's fold
and the turn's commit: a system prompt set there is shown above the turn, so the model must
get it, and the early request, asked without it, must leave no trace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from pg import database

from tether.runtimes.base import RuntimeEvent, TextDelta, TurnInput
from tether.settings import Settings

from engine_harness import GatedRuntime, harness, has, hold_append, until


class NotingRuntime(GatedRuntime):
    """Answers at once, saying which request it answers; notes each request's messages."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[dict]] = []

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.asked.append(turn.messages)
        yield TextDelta(f"answer to request {len(self.asked)}")


def test_an_early_request_the_log_contradicts_is_dropped_and_asked_again(
    tmp_path: Path,
) -> None:
    async def main(url: str) -> None:
        runtime = NotingRuntime()
        a_settings = Settings(data_dir=tmp_path / "a", database_url=url)
        b_settings = Settings(data_dir=tmp_path / "b", database_url=url)
        async with (
            harness(tmp_path / "a", runtime, a_settings) as a,
            harness(tmp_path / "b", GatedRuntime(), b_settings) as b,
        ):
            sid = (await a.sessions.create(None))["session_id"]

            async def meanwhile() -> None:  # after the early request, before the turn's write
                await until(lambda: len(runtime.asked) == 1)
                await b.sessions.patch(sid, {"system_prompt": "Answer in French."})

            hold_append(a, has("turn.submitted"), meanwhile)
            await a.engine.start(sid, "hi")
            await a.wait_idle(sid)
            assert runtime.asked == [
                [{"role": "user", "content": "hi"}],
                [
                    {"role": "system", "content": "Answer in French."},
                    {"role": "user", "content": "hi"},
                ],
            ]
            view = await a.sessions.view(sid)
            assert [m["content"] for m in view["messages"]] == ["hi", "answer to request 2"]
            deltas = [e for e in await a.store.read(sid) if e.type == "text.delta"]
            assert "".join(e.data["text"] for e in deltas) == "answer to request 2"

    with database() as url:
        asyncio.run(main(url))
