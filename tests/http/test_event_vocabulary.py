"""Layer: the services' store and the HTTP/SSE surface, over real SQLite and real HTTP.

Event types are defined once (`tether/events.py`). The page's list of types to listen for is
served from the definitions, every service write is checked against them (a payload that
does not match is refused whole, nothing stored), and a new type needs its definition and
the folds that use it, nothing else: `test_a_new_event_type_takes_its_definition_and_its_fold`
adds one in this file alone and sees it stored, refused when malformed, and streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from pathlib import Path
from typing import Any, NotRequired

import httpx
import pytest
import uvicorn
from typing_extensions import TypedDict

from tether.events import VOCABULARY, EventType, PayloadMismatch
from tether.http.app import create_app
from tether.log import Draft
from tether.services import open_store
from tether.settings import Settings

from helpers import free_port, running_server


def _listed(module_source: str) -> list[str]:
    prefix, suffix = "export const EVENT_TYPES = ", ";\n"
    assert module_source.startswith(prefix) and module_source.endswith(suffix)
    return json.loads(module_source[len(prefix) : -len(suffix)])


def test_the_page_module_lists_the_durable_types_from_their_definitions(tmp_path: Path) -> None:
    with running_server(tmp_path / "data") as server, server.client() as client:
        response = client.get("/static/js/event_types.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert _listed(response.text) == VOCABULARY.durable_names()
    stream_js = (Path(__file__).parents[2] / "src/tether/web/js/stream.js").read_text()
    assert 'import { EVENT_TYPES } from "./event_types.js";' in stream_js


def test_a_payload_that_does_not_match_its_definition_is_refused_whole(tmp_path: Path) -> None:
    """The store the services write through refuses the whole append, and stores nothing."""

    async def main() -> None:
        store = open_store(Settings(data_dir=tmp_path))
        try:
            await store.create_session("s1", [Draft("session.created", {"title": None})])
            good = Draft("queue.updated", {"queue_id": "q1", "text": "fine"})
            for bad in (
                Draft("queue.updated", {"queue_id": "q1"}),  # a required field missing
                Draft("queue.updated", {"queue_id": "q1", "text": "x", "by": "me"}),  # unknown
                Draft("queue.updated", {"queue_id": "q1", "text": 7}),  # a wrong type
                Draft("queue.edited", {"queue_id": "q1", "text": "x"}),  # an undefined type
                Draft("heartbeat", {"server_time": 1.0}),  # a frame, never in the log
            ):
                with pytest.raises(PayloadMismatch):
                    await store.append("s1", [good, bad])
                with pytest.raises(PayloadMismatch):
                    await store.create_session("s2", [bad])
            assert await store.last_seq("s1") == 1
            assert await store.last_seq("s2") is None
            assert [e.seq for e in await store.append("s1", [good])] == [2]
        finally:
            await store.aclose()

    asyncio.run(main())


# -- a new event type, added in a test-only way: this file is all it takes -------------------
class NoteAdded(TypedDict):
    """A note pinned to a conversation."""

    text: str
    author: NotRequired[str]


NOTE_ADDED = EventType("note.added", NoteAdded)


def fold_notes(envelopes: list[dict[str, Any]]) -> list[str]:
    """The fold that uses it."""
    return [e["data"]["text"] for e in envelopes if e["type"] == NOTE_ADDED.name]


@contextlib.asynccontextmanager
async def serving(settings: Settings, vocabulary: Any) -> Any:
    """The real app on a real port, in this event loop (so the test can write through the
    very store the server uses)."""
    app = create_app(settings, vocabulary=vocabulary)
    port = free_port()
    config = uvicorn.Config(app, port=port, log_config=None, lifespan="on")  # logging untouched
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the server did not start"
        await asyncio.sleep(0.02)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield app, client
    finally:
        server.should_exit = True
        await task
        gc.unfreeze()  # the app froze the heap once it was ready: this process goes on


async def _frames(client: httpx.AsyncClient, session_id: str, until_seq: int) -> list[dict]:
    frames: list[dict] = []
    async with client.stream("GET", f"/api/sessions/{session_id}/events?after=0") as response:
        event, data = None, []
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                data.append(line.partition(":")[2].strip())
            elif line == "" and event is not None:
                frames.append({"event": event, **json.loads("".join(data))})
                if frames[-1].get("seq", 0) >= until_seq:
                    return frames
                event, data = None, []
    return frames


def test_a_new_event_type_takes_its_definition_and_its_fold(tmp_path: Path) -> None:
    """Defined (NoteAdded + NOTE_ADDED) and folded (fold_notes) in this file, and nowhere
    else: the server stores it, refuses a malformed one, lists it to the page and streams
    it; its own folds pass it by. Without the definition, the same write is refused."""
    settings = Settings(data_dir=tmp_path / "data")

    async def main() -> None:
        async with serving(settings, VOCABULARY.extended(NOTE_ADDED)) as (app, client):
            listed = _listed((await client.get("/static/js/event_types.js")).text)
            assert listed == [*VOCABULARY.durable_names(), "note.added"]
            sid = (await client.post("/api/sessions", json={})).json()["session"]["session_id"]
            store = app.state.services.store
            await store.append(sid, [Draft("note.added", {"text": "remember the milk"})])
            with pytest.raises(PayloadMismatch):
                await store.append(sid, [Draft("note.added", {"txt": "misspelt"})])
            frames = await _frames(client, sid, until_seq=2)
            assert [f["event"] for f in frames] == ["session.created", "note.added"]
            assert fold_notes(frames) == ["remember the milk"]
            session = (await client.get("/api/session", params={"session_id": sid})).json()
            assert session["session"]["last_seq"] == 2
            assert session["session"]["messages"] == []
        async with serving(settings, VOCABULARY) as (app, client):  # Tether's own vocabulary
            assert "note.added" not in _listed((await client.get("/static/js/event_types.js")).text)
            with pytest.raises(PayloadMismatch, match="not a durable event type"):
                await app.state.services.store.append(sid, [Draft("note.added", {"text": "x"})])

    asyncio.run(main())
