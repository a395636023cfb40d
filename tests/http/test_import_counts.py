"""Counts an imported session shows are derived from what it holds, not taken from the file
(docs/api.md §12). Over real HTTP against a real server and its SQLite file. Layer:
projections (model context); contract invariant 1: the context, and what it says of itself,
follows the branch shown."""

from __future__ import annotations

import json
from typing import Any

import httpx

from helpers import ServerProcess, session_body

AT = 1_700_000_000.0


def _log(*events: tuple[str, dict[str, Any], str | None]) -> bytes:
    """A Tether export of `events` (type, data, stream), each a second after the last."""
    out = []
    for seq, (type_, data, stream) in enumerate(events, start=1):
        event: dict[str, Any] = {"seq": seq, "type": type_, "at": AT + seq, "data": data}
        if stream is not None:
            event.update(stream_id=stream, turn_id=data.get("turn_id"))
        out.append(event)
    return json.dumps({"format": "tether.session", "version": 1, "events": out}).encode()


def _turn(turn: str, stream: str, text: str) -> list[tuple[str, dict[str, Any], str | None]]:
    submitted = {"turn_id": turn, "stream_id": stream, "text": text, "attachments": []}
    submitted["submitted_at"] = AT
    done = {"stream_id": stream, "turn_id": turn, "state": "completed"}
    return [("turn.submitted", submitted, stream), ("run.finished", done, stream)]


def test_a_compression_on_another_branch_is_not_counted(shared_server: ServerProcess) -> None:
    """A compression made while the first branch ran, then that message edited: the branch
    shown was never compressed, so its context counts no compression (it counted the other
    branch's), and showing the first branch again counts it."""
    compressed = {
        "stream_id": "r_1",
        "pass_id": "p_1",
        "tokens_before": 900,
        "tokens_after": 100,
        "summary": "what the first branch said",
        "boundary_turn_id": "u_1",
    }
    first = _turn("u_1", "r_1", "first")
    body = _log(
        ("session.created", {"title": "forked"}, None),
        first[0],
        ("compression.completed", compressed, "r_1"),
        first[1],
        ("transcript.truncated", {"keep_count": 0, "transcript_generation": 1}, None),
        *_turn("u_2", "r_2", "edited"),
    )
    with httpx.Client(base_url=shared_server.base_url, timeout=30) as client:
        response = client.post("/api/sessions/import", content=body)
        assert response.status_code == 201, response.text
        sid = response.json()["sessions"][0]["session_id"]
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        assert "what the first branch said" not in json.dumps(context)
        assert context["compressions"] == 0
        row_id = session_body(client, sid)["messages"][0]["id"]
        switch = {"session_id": sid, "row_id": row_id, "index": 1}
        assert client.post("/api/session/branch", json=switch).status_code == 200
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        assert context["compressions"] == 1
