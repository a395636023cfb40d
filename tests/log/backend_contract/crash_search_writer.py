"""Child process of the search crash test: opens a backend (with the real sidebar and search
folds) from the JSON spec in argv[1] and appends whole turns in 8 sessions at once until it
is killed, printing one line per acknowledged append. Turn n of session k asks `qKxNy` and is
answered `aKxNy` over two deltas."""

from __future__ import annotations

import asyncio
import json
import sys

from backend_kit import from_spec

from tether.log import Draft
from tether.projections.sidebar import SIDEBAR_FOLD_VERSION, fold_row
from tether.sessions.search import SEARCH_FOLD_VERSION, search_change

SESSIONS = 8


def ack(events: list) -> None:
    print(json.dumps({"kind": "pair", "seqs": [e.seq for e in events]}), flush=True)


async def main() -> None:
    backend = from_spec(json.loads(sys.argv[1]))
    store = await backend.open(fold_row, SIDEBAR_FOLD_VERSION, (search_change, SEARCH_FOLD_VERSION))

    async def session(k: int) -> None:
        sid = f"c{k}"
        await store.create_session(sid, [Draft("session.created", {})])
        n = 0
        while True:
            st, turn = f"{sid}_s{n}", f"{sid}_t{n}"
            data = {"turn_id": turn, "stream_id": st, "text": f"question q{k}x{n}y"}
            ack(await store.append(sid, [Draft("turn.submitted", data, stream_id=st)]))
            for part in (f"answer a{k}x{n}y", " more"):
                delta = Draft("text.delta", {"item_id": "t", "text": part}, stream_id=st)
                ack(await store.append(sid, [delta]))
            end = Draft("run.finished", {"state": "completed"}, stream_id=st)
            ack(await store.append(sid, [end]))
            n += 1

    await asyncio.gather(*(session(k) for k in range(SESSIONS)))


if __name__ == "__main__":
    asyncio.run(main())
