"""The system prompt (issue 16.2): a default (`--system-prompt`) and a session's own (`PATCH
/api/session {system_prompt}`, metadata in the log: invariant 4), the first message of every
model request and of `GET /api/session/context` (invariant 1: what the user sees is what the
model gets), the same after a restart. Real server, real HTTP, the fake OpenAI server at the
model boundary recording what it received."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import ServerProcess, new_session, running_server, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow

DEFAULT = "You are terse. Answer in one line."


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("hello from the workspace")
    with running_server(
        tmp_path / "data",
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
        *("--workspace", str(tmp_path / "ws")),
        env={"TETHER_SYSTEM_PROMPT": DEFAULT},
    ) as srv:
        yield srv


def context(client: httpx.Client, sid: str) -> list[dict]:
    response = client.get("/api/session/context", params={"session_id": sid})
    assert response.status_code == 200, response.text
    return response.json()["context_messages"]


def patch(client: httpx.Client, sid: str, **changes: object) -> httpx.Response:
    return client.patch("/api/session", json={"session_id": sid, **changes})


def test_the_default_opens_every_request_and_the_context(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(tool_call("read_file", {"path": "notes.txt"})),
        reply(text("done")),
    )
    with server.client() as client:
        assert client.get("/api/models").json()["default_system_prompt"] == DEFAULT
        sid = new_session(client)
        assert context(client, sid) == [{"role": "system", "content": DEFAULT}]
        start_turn(client, sid, "read the notes")
        wait_idle(client, sid)
        shown = context(client, sid)
    # every request of the turn (the tool loop's second one too) opens with it
    assert len(fake.requests) == 2
    for request in fake.requests:
        assert request["messages"][0] == {"role": "system", "content": DEFAULT}
        assert [m["role"] for m in request["messages"]].count("system") == 1
    assert shown[0] == {"role": "system", "content": DEFAULT}
    assert shown[1] == {"role": "user", "content": "read the notes"}


def test_a_sessions_own_prompt_replaces_the_default_and_survives_a_restart(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    own = "You are a pirate.\nAlways say arr."
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "hi")
        before = wait_idle(client, sid)
        response = patch(client, sid, system_prompt=own)
        assert response.status_code == 200, response.text
        row = response.json()["session"]
        assert row["system_prompt"] == own
        assert row["updated_at"] == before["updated_at"]  # metadata, not activity
        assert context(client, sid)[0] == {"role": "system", "content": own}
        start_turn(client, sid, "again")
        wait_idle(client, sid)
        assert fake.last_request["messages"][0] == {"role": "system", "content": own}
        assert [m["role"] for m in fake.last_request["messages"]] == [
            "system",
            "user",
            "assistant",
            "user",
        ]
    server.restart()
    with server.client() as client:
        assert session_body(client, sid)["system_prompt"] == own
        assert context(client, sid)[0] == {"role": "system", "content": own}
        # null (or a blank text) goes back to the default
        assert patch(client, sid, system_prompt="  \n").json()["session"]["system_prompt"] is None
        assert context(client, sid)[0] == {"role": "system", "content": DEFAULT}


@pytest.mark.parametrize(
    "prompt",
    [pytest.param("x" * 20_001, id="too-long"), pytest.param(["a"], id="not-text")],
)
def test_a_bad_prompt_is_400_and_changes_nothing(server: ServerProcess, prompt: object) -> None:
    with server.client() as client:
        sid = new_session(client)
        seq = session_body(client, sid)["last_seq"]
        response = patch(client, sid, system_prompt=prompt)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request"
        assert session_body(client, sid)["last_seq"] == seq
        assert context(client, sid) == [{"role": "system", "content": DEFAULT}]


def test_without_any_prompt_the_context_has_no_system_message(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    with (
        running_server(
            tmp_path / "data", "--runtime", "openai", "--base-url", fake.base_url, "--model", "m"
        ) as srv,
        srv.client() as client,
    ):
        sid = new_session(client)
        start_turn(client, sid, "hi")
        wait_idle(client, sid)
        assert [m["role"] for m in context(client, sid)] == ["user", "assistant"]
    assert [m["role"] for m in fake.last_request["messages"]] == ["user"]
