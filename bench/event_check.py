"""What checking each payload against its definition costs an append (log/checked.py).

Why these numbers: every service write goes through `CheckedStore`, which checks each draft
against its event type's definition (tether/events.py) before the backend sees it. The
baseline is the same backend without the check, in the same run: the same number of
`text.delta` appends (the most frequent event), one draft per append (the worst case for
the check's share: nothing else to amortise it over), to a fresh database each. The ratio
checked/unchecked is what matters; the check alone is also timed, per draft.

    python bench/event_check.py            # 2000 appends per side, median of 3 runs
    python bench/event_check.py --quick    # 200 appends, 1 run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from benchkit import write_results  # noqa: E402 - puts tests/ on sys.path

from tether.events import SESSION_CREATED, TEXT_DELTA, VOCABULARY
from tether.log import Draft, EventStore
from tether.log.checked import CheckedStore
from tether.log.sqlite import SQLiteEventStore
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "event_check.json"
DATA: dict[str, Any] = {"stream_id": "r_bench", "item_id": "t1", "text": "The quick brown fox " * 3}


async def appends(directory: Path, checked: bool, count: int) -> float:
    backend = SQLiteEventStore(
        directory / "bench.db", index_fold=fold_row, index_version=SIDEBAR_FOLD_VERSION
    )
    store: EventStore = CheckedStore(backend) if checked else backend
    try:
        await store.create_session("s", [Draft(SESSION_CREATED, {"title": None})])
        started = time.perf_counter()
        for _ in range(count):
            await store.append("s", [Draft(TEXT_DELTA, DATA, stream_id="r_bench")])
        return time.perf_counter() - started
    finally:
        await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=None, help="appends per side")
    parser.add_argument("--repeat", type=int, default=None, help="runs; the median is kept")
    parser.add_argument("--quick", action="store_true", help="200 appends, 1 run")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    args = parser.parse_args()
    count = args.appends or (200 if args.quick else 2000)
    repeat = args.repeat or (1 if args.quick else 3)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeat):
        for checked in (False, True):  # alternate, so drift in machine load hits both
            with tempfile.TemporaryDirectory() as tmp:
                times[checked].append(asyncio.run(appends(Path(tmp), checked, count)))
    raw, checked = statistics.median(times[False]), statistics.median(times[True])
    per_check = timeit.timeit(lambda: VOCABULARY.check(TEXT_DELTA, DATA), number=20000) / 20000
    ratio = checked / raw
    print(f"{count} appends of one text.delta, median of {repeat}")
    print(f"  unchecked backend   {raw / count * 1e6:8.1f} us an append")
    print(f"  CheckedStore        {checked / count * 1e6:8.1f} us an append")
    print(f"  the check alone     {per_check * 1e6:8.1f} us a draft")
    print(f"  ratio checked/unchecked: {ratio:.3f}")
    write_results(
        args.out,
        {
            "appends": count,
            "repeat": repeat,
            "unchecked_seconds": raw,
            "checked_seconds": checked,
            "check_seconds_per_draft": per_check,
            "ratio": ratio,
        },
    )


if __name__ == "__main__":
    main()
