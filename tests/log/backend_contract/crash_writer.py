"""Child process of the crash test: opens a backend from the JSON spec in argv[1] and appends
until it is killed, printing one line per acknowledged append (after `append` returned)."""

from __future__ import annotations

import asyncio
import json
import sys

from backend_kit import from_spec

from tether.log import Draft

APPENDERS = 8


def ack(kind: str, events: list) -> None:
    line = {"kind": kind, "seqs": [e.seq for e in events], "tokens": [e.data for e in events]}
    print(json.dumps(line), flush=True)


async def main() -> None:
    store = await from_spec(json.loads(sys.argv[1])).open()
    ack("created", await store.create_session("crash", [Draft("session.created", {"t": 0})]))
    closed = Draft("run.finished", {"state": "completed"}, stream_id="closed")
    ack("closed", await store.append("crash", [closed]))

    async def appender(n: int) -> None:
        i = 0
        while True:
            pair = [Draft("probe", {"token": f"{n}-{i}-{k}"}) for k in "ab"]
            ack("pair", await store.append("crash", pair))
            i += 1

    await asyncio.gather(*(appender(n) for n in range(APPENDERS)))


if __name__ == "__main__":
    asyncio.run(main())
