"""What the PostgreSQL replica tests share: a log store as one replica opens it, with a
probe fold for its sidebar index, and a turn that admits a run."""

from __future__ import annotations

from tether.events import Event
from tether.log import Draft
from tether.log.postgres import PostgresEventStore


def probe(state: dict | None, event: Event) -> dict:
    return {"n": (state or {"n": 0})["n"] + 1}


def open_store(url: str, replica: str) -> PostgresEventStore:
    return PostgresEventStore(
        url, index_fold=probe, index_version="p1", replica_id=replica, poll_seconds=1.0
    )


def turn(n: int) -> Draft:
    data = {"turn_id": f"u{n}", "stream_id": f"r{n}", "text": f"turn {n}", "attachments": []}
    return Draft("turn.submitted", data, f"r{n}", f"u{n}", admits_run=True)
