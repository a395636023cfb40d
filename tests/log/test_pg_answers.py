"""The PostgreSQL backend records one answer per prompt (layer: the log, for runs controls
across replicas, runs/controls.py; contract invariant 8: the log is the only source, and the
counter row, locked in the transaction that appends, decides): of answers to one prompt
appended at once through three replicas the log keeps one, whatever their choice."""

from __future__ import annotations

import asyncio

import pytest

from tether.log import Draft
from tether.log.errors import PromptAnswered
from tether.log.postgres import PostgresEventStore

pytestmark = pytest.mark.slow


def _store(url: str, replica: str) -> PostgresEventStore:
    return PostgresEventStore(
        url, index_fold=lambda state, event: {}, index_version="a1", replica_id=replica
    )


def _turn(n: int) -> Draft:
    data = {"turn_id": f"u{n}", "stream_id": f"r{n}", "text": "t", "attachments": []}
    return Draft("turn.submitted", data, f"r{n}", f"u{n}", admits_run=True)


def _approval(stream: str, prompt: str, choice: str) -> Draft:
    data = {"stream_id": stream, "approval_id": prompt, "choice": choice}
    return Draft("approval.answered", data, stream)


def _clarify(stream: str, prompt: str) -> Draft:
    data = {"stream_id": stream, "question_id": prompt, "text": "blue"}
    return Draft("clarify.answered", data, stream)


def test_an_answer_is_recorded_once_per_prompt_whichever_replica_records_it(url: str) -> None:
    async def main() -> None:
        stores = [_store(url, f"r{n}") for n in range(3)]
        await stores[0].create_session("s1", [Draft("session.created", {})])
        await stores[0].append("s1", [_turn(1)])
        outcomes = await asyncio.gather(
            *(
                stores[n % 3].append("s1", [_approval("r1", "ap1", ("once", "deny")[n % 2])])
                for n in range(12)
            ),
            return_exceptions=True,
        )
        assert sum(isinstance(o, list) for o in outcomes) == 1
        assert sum(isinstance(o, PromptAnswered) for o in outcomes) == 11
        # another prompt of the run, and a question of the same id, each take their answer
        await stores[1].append("s1", [_approval("r1", "ap2", "deny"), _clarify("r1", "ap1")])
        with pytest.raises(PromptAnswered):  # twice in one append: refused whole
            await stores[2].append("s1", [_clarify("r1", "q2"), _clarify("r1", "q2")])
        with pytest.raises(PromptAnswered):
            await stores[2].append("s1", [_clarify("r1", "ap1")])
        types = [
            (e.type, e.data.get("approval_id") or e.data.get("question_id"))
            for e in await stores[0].read("s1")
        ]
        assert types[2:] == [
            ("approval.answered", "ap1"),
            ("approval.answered", "ap2"),
            ("clarify.answered", "ap1"),
        ]
        # the next run's prompts take their answers (the demo's ids repeat from run to run)
        await stores[0].append("s1", [Draft("run.finished", {"state": "completed"}, "r1")])
        await stores[0].append("s1", [_turn(2)])
        await stores[2].append("s1", [_approval("r2", "ap1", "once")])
        for store in stores:
            await store.aclose()

    asyncio.run(main())
