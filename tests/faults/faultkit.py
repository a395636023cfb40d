"""Shared checks for the fault-injection tests: what must hold of the log and the projections
after a fault, whichever fault it was."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pg import database

from fake_openai import FakeOpenAI
from helpers import SSEFrame, live_timeline, read_events, session_body, wait_until


@dataclass(frozen=True)
class Backend:
    """A log the fault tests run a server on. `takeover_seconds`: how long after a restart
    the killed server's runs may stay open. SQLite's start-up recovery settles them before
    the server answers; on PostgreSQL the restarted server is a new replica, which takes
    them over once the dead one's lease expires (about 12 s, never more than 30 s,
    docs/operations.md "Several replicas")."""

    name: str
    takeover_seconds: float

    @contextmanager
    def flags(self) -> Iterator[list[str]]:
        """`tether serve` flags for a log of its own (PostgreSQL: a throwaway database)."""
        if self.name == "sqlite":
            yield []
            return
        with database() as url:
            yield ["--database-url", url]


BACKENDS = [Backend("sqlite", 0.0), Backend("postgresql", 30.0)]


def openai_flags(fake: FakeOpenAI, workspace: Path | None = None) -> list[str]:
    """`tether serve` flags for the `openai` runtime talking to the fake model."""
    flags = ["--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"]
    if workspace is not None:
        flags += ["--workspace", str(workspace)]
    return flags


def durable(frames: list[SSEFrame]) -> list[dict[str, Any]]:
    """The frames that carry a log event (heartbeats and snapshots have no id), parsed."""
    return [
        {"seq": int(f["id"]), "type": f.event, "envelope": json.loads(f["data"])}
        for f in frames
        if f.get("id")
    ]


def whole_log(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    """Every event of the session, replayed from `?after=0` until the stream goes idle."""
    return durable(read_events(client, session_id, after="0", stop_on="heartbeat"))


def wait_run_ended(
    client: httpx.Client, session_id: str, stream_id: str, backend: Backend
) -> list[dict[str, Any]]:
    """The session's whole log once `stream_id` has its `run.finished` (polled up to the
    backend's takeover time; on SQLite it must be there at once). Returns the log."""
    log: list[dict[str, Any]] = []

    def ended() -> bool:
        log[:] = whole_log(client, session_id)
        return any(
            e["type"] == "run.finished" and e["envelope"]["data"]["stream_id"] == stream_id
            for e in log
        )

    wait_until(ended, timeout=backend.takeover_seconds, what=f"the ending of {stream_id}")
    return log


def assert_log_intact(log: list[dict[str, Any]]) -> None:
    """Seqs 1..N, contiguous, each exactly once, in order."""
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    assert all(e["envelope"]["seq"] == e["seq"] for e in log)


def finished_by_stream(log: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """`run.finished` data of every submitted turn's stream (a list: it must hold one)."""
    streams = [e["envelope"]["data"]["stream_id"] for e in log if e["type"] == "turn.submitted"]
    return {
        sid: [
            e["envelope"]["data"]
            for e in log
            if e["type"] == "run.finished" and e["envelope"]["data"]["stream_id"] == sid
        ]
        for sid in streams
    }


def assert_each_run_ends_once(log: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every submitted turn has exactly one `run.finished`, and nothing of a stream follows it.
    Returns each stream's one ending."""
    endings = finished_by_stream(log)
    assert all(len(found) == 1 for found in endings.values()), endings
    for stream_id in endings:
        types = [
            e["type"]
            for e in log
            if e["envelope"].get("stream_id") == stream_id
            or e["envelope"]["data"].get("stream_id") == stream_id
        ]
        assert types[-1] == "run.finished", (stream_id, types)
    return {sid: found[0] for sid, found in endings.items()}


def assert_visible_turns_in_context(client: httpx.Client, session_id: str) -> dict:
    """Contract invariant 1: every visible user turn is in `GET /api/session/context`, in
    order, unless `excluded` names it with a reason."""
    body = session_body(client, session_id)
    context = client.get("/api/session/context", params={"session_id": session_id}).json()
    excluded = {e["turn_id"]: e["reason"] for e in context["excluded"]}
    assert all(excluded.values())
    sent = [m["content"] for m in context["context_messages"] if m["role"] == "user"]
    assert sent == [
        m["content"]
        for m in body["messages"]
        if m["role"] == "user" and m["turn_id"] not in excluded
    ]
    return context


def live_text(client: httpx.Client, session_id: str) -> str:
    return "".join(i["text"] for i in live_timeline(client, session_id) if i["type"] == "text")
