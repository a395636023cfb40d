"""Layer: the log's checking gate (`log/checked.py`), which every service writes through."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tether.events import VOCABULARY, PayloadMismatch, Vocabulary
from tether.log import Draft
from tether.log.checked import SESSIONS_PER_SLICE, CheckedStore
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row


class CountingVocabulary(Vocabulary):
    """The real vocabulary, counting the drafts it has checked."""

    def __init__(self) -> None:
        super().__init__(list(VOCABULARY))
        self.checked = 0

    def check(self, name: str, data: dict[str, Any]) -> None:
        super().check(name, data)
        self.checked += 1


def test_an_imports_many_sessions_are_checked_in_slices_the_loop_serves_between(
    tmp_path: Path,
) -> None:
    """An import checks a thousand sessions' drafts on the loop (bench/README.md,
    import_load.py: about 20 ms in one stretch); other requests get the loop between slices."""
    count = SESSIONS_PER_SLICE * 4
    vocabulary = CountingVocabulary()

    async def main() -> None:
        backend = SQLiteEventStore(
            tmp_path / "t.db", index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION
        )
        store = CheckedStore(backend, vocabulary)
        seen: list[int] = []
        done = asyncio.Event()

        async def other_request() -> None:
            while not done.is_set():
                seen.append(vocabulary.checked)
                await asyncio.sleep(0)

        other = asyncio.create_task(other_request())
        await asyncio.sleep(0)
        sessions = [(f"s{n}", [Draft("session.created", {"title": f"t{n}"})]) for n in range(count)]
        await store.create_sessions(sessions)
        done.set()
        await other
        between = sorted({n for n in seen if 0 < n < count})
        assert len(between) >= count // SESSIONS_PER_SLICE - 1, seen
        assert len(await store.index_states()) == count
        await store.aclose()

    asyncio.run(main())


def test_a_mismatch_in_the_last_slice_stores_none_of_the_sessions(tmp_path: Path) -> None:
    """Yielding between slices does not let a part of the batch through: the backend sees
    the batch only when every draft of it has passed."""

    async def main() -> None:
        backend = SQLiteEventStore(
            tmp_path / "t.db", index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION
        )
        store = CheckedStore(backend)
        good = [(f"s{n}", [Draft("session.created", {})]) for n in range(SESSIONS_PER_SLICE * 2)]
        bad = ("bad", [Draft("session.created", {"no such field": 1})])
        with pytest.raises(PayloadMismatch):
            await store.create_sessions([*good, bad])
        assert await store.index_states() == {}
        await store.aclose()

    asyncio.run(main())
