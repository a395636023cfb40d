"""Layer: the sidebar projection as `GET /api/sessions` serves it (docs/api.md §3). The list keeps
each row's JSON between lists (sessions/row_texts.py); these tests change a row in every way it
can change (the run registry's predicates without a log event, the persisted state, the
session's existence) and check that each list says exactly what `GET /api/session` says. Real
server, real HTTP, the fake OpenAI server at the model boundary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from tether.events import Event
from tether.projections.sidebar import fold_row
from tether.runs.registry import RunRegistry
from tether.sessions.row_texts import RowTexts
from tether.sessions.service import SessionService

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import ServerProcess, new_session, running_server, start_turn, wait_idle, wait_until


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data", "--runtime", "openai", "--base-url", fake.base_url, "--model", "fake"
    ) as srv:
        yield srv


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as model:
        yield model


def listed(client: httpx.Client, **params: object) -> dict[str, dict]:
    response = client.get("/api/sessions", params=params)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    return {row["session_id"]: row for row in response.json()["sessions"]}


def row_of_the_body(client: httpx.Client, sid: str) -> dict:
    """The `Row` within `GET /api/session`'s body (which adds the transcript to it)."""
    body = client.get("/api/session", params={"session_id": sid}).json()["session"]
    return {k: body[k] for k in ROW_KEYS}


# docs/api.md §3's Row
ROW_KEYS = [
    "session_id",
    "title",
    "created_at",
    "updated_at",
    "last_message_at",
    "pinned",
    "archived",
    "message_count",
    "activity_count",
    "transcript_generation",
    "transcript_generation_baseline",
    "busy",
    "active_stream_id",
    "parent_session_id",
    "continuation_session_id",
    "last_run_state",
    "model",
    "system_prompt",
]


def test_each_list_says_what_the_session_says_through_every_change(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    with server.client() as client:
        alpha, bravo = new_session(client, "Alpha"), new_session(client, "Bravo")
        assert listed(client)[alpha] == row_of_the_body(client, alpha)

        fake.script(reply(text("held "), barrier("hold"), text("done")))
        stream_id = start_turn(client, alpha, "hello")["stream_id"]
        fake.wait_for_requests(1)
        running = listed(client)[alpha]  # the registry changed; the state did too (the turn)
        assert running["busy"] is True and running["active_stream_id"] == stream_id
        assert running == row_of_the_body(client, alpha)
        assert sorted(running) == sorted(ROW_KEYS)
        assert listed(client)[alpha] == running  # asked again while nothing moved

        fake.release("hold")
        wait_idle(client, alpha)
        settled = wait_until(lambda: (r := listed(client)[alpha])["busy"] is False and r)
        assert settled["active_stream_id"] is None and settled["message_count"] == 2
        assert settled == row_of_the_body(client, alpha)

        client.patch("/api/session", json={"session_id": bravo, "title": "Bravo renamed"})
        assert listed(client)[bravo]["title"] == "Bravo renamed"
        client.patch("/api/session", json={"session_id": bravo, "archived": True})
        assert bravo not in listed(client)
        assert listed(client, archived=1)[bravo] == row_of_the_body(client, bravo)
        assert client.delete("/api/session", params={"session_id": bravo}).status_code == 200
        assert bravo not in listed(client, archived=1) and list(listed(client)) == [alpha]


def test_the_list_is_the_same_json_text_as_its_rows_encoded_alone(server: ServerProcess) -> None:
    """Kept texts joined into one body stay one valid JSON document, whatever a title holds."""
    with server.client() as client:
        titles = ['Quotes " and \\ back', "Ünïcode ✓ 日本", "</script><b>x</b>"]
        sids = [new_session(client, title) for title in titles]
        prompt = "line one\n\tline two \u2028 \x7f"
        client.patch("/api/session", json={"session_id": sids[0], "system_prompt": prompt})
        listed(client)  # kept now
        body = client.get("/api/sessions").content
        rows = json.loads(body)["sessions"]
        assert sorted(r["title"] for r in rows) == sorted(titles)
        assert {r["system_prompt"] for r in rows} == {prompt, None}
        assert (
            body
            == json.dumps({"sessions": rows}, separators=(",", ":"), ensure_ascii=False).encode()
        )


def test_a_kept_row_follows_the_registry_and_a_new_state_object() -> None:
    """A row's text is kept while its state is the same object and the registry's
    predicates agree; they change without the state (admission before the turn's commit, a
    Stop's `cancelling`, the worker leaving after `run.finished`): each change is a new text.
    So is a new state object, even one equal to the last (a rebuilt fold)."""
    state = fold_row(None, Event("s_1", 1, "session.created", 1.0, {"title": "One"}))
    texts = RowTexts()
    idle = texts.text(state, False, None)
    assert texts.text(state, False, None) is idle  # kept, not encoded again
    assert json.loads(idle)["busy"] is False
    assert json.loads(texts.text(state, True, "r_1"))["active_stream_id"] == "r_1"
    assert json.loads(texts.text(state, True, None)) == {**json.loads(idle), "busy": True}
    kept = texts.text(state, False, None)
    assert kept == idle and kept is not idle  # encoded again after the busy spell
    rebuilt = texts.text(dict(state), False, None)
    assert rebuilt == kept and rebuilt is not kept
    renamed = {**state, "title": "Two"}
    assert json.loads(texts.text(renamed, False, None))["title"] == "Two"


def test_another_replicas_run_is_busy_and_attachable_until_its_stop() -> None:
    """`SessionService.occupancy`: a run the log shows unfinished that this process does
    not run is another replica's; a recorded Stop makes it `cancelling`, not attachable."""
    sessions = SessionService(cast(Any, None), RunRegistry(), cast(Any, None), cast(Any, None))
    created = Event("s_1", 1, "session.created", 1.0, {})
    turn = Event("s_1", 2, "turn.submitted", 2.0, {"text": "hi"}, stream_id="r_1")
    stop = Event("s_1", 3, "run.cancel_requested", 3.0, {"stream_id": "r_1"}, stream_id="r_1")
    end = Event("s_1", 4, "run.finished", 4.0, {"state": "cancelled"}, stream_id="r_1")
    state = fold_row(None, created)
    assert sessions.occupancy(state) == (False, None, "idle")
    state = fold_row(state, turn)
    assert sessions.occupancy(state) == (True, "r_1", "running")
    state = fold_row(state, stop)
    assert sessions.occupancy(state) == (True, None, "cancelling")
    assert sessions.occupancy(fold_row(state, end)) == (False, None, "idle")
    older = {k: v for k, v in state.items() if k not in ("open_stream", "stop_requested")}
    assert sessions.occupancy(older) == (False, None, "idle")  # a row an older fold wrote


def test_an_import_answers_with_the_lists_own_rows(server: ServerProcess) -> None:
    """The rows an import answers with are the texts the next list sends (kept for it)."""
    with server.client() as client:
        new_session(client, "One")
        new_session(client, "Two ✓")
        exported = client.get("/api/export").content
        for status in (201, 200):  # made, then found imported before
            answer = client.post("/api/sessions/import", content=exported)
            assert answer.status_code == status, answer.text
            rows = {row["session_id"]: row for row in answer.json()["sessions"]}
            assert len(rows) == 2
            every = listed(client)
            assert {sid: every[sid] for sid in rows} == rows
