"""The server's defaults (issue 16.7, docs/api.md): `GET/PATCH /api/settings` saves a default
model and system prompt over the command line's, durably (a restart keeps them), and every
run of a session without its own uses them from then on: what the model gets is what the
session shows (`GET /api/session/context`, invariant 1). Bad input is a 400 that saves
nothing. Real server, real HTTP, the fake OpenAI server at the model boundary."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, start_turn, wait_idle

pytestmark = pytest.mark.slow

FLAG_PROMPT = "You are the command line's assistant."


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.other_models = ["big-model"]
        yield server


def serve(data: Path, fake: FakeOpenAI) -> ServerProcess:
    return ServerProcess(
        data,
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
        env={"TETHER_SYSTEM_PROMPT": FLAG_PROMPT},
    )


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    srv = serve(tmp_path / "data", fake).start()
    try:
        yield srv
    finally:
        srv.stop()


def settings(client: httpx.Client) -> dict:
    response = client.get("/api/settings")
    assert response.status_code == 200, response.text
    return response.json()


def patch(client: httpx.Client, **changes: object) -> httpx.Response:
    return client.patch("/api/settings", json=changes)


def first_message(client: httpx.Client, sid: str) -> dict:
    response = client.get("/api/session/context", params={"session_id": sid})
    return response.json()["context_messages"][0]


def test_the_command_line_defaults_until_the_panel_saves_its_own(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(*(reply(text("ok")) for _ in range(4)))
    with server.client() as client:
        assert settings(client) == {
            "default_model": "fake-model",
            "default_system_prompt": FLAG_PROMPT,
            "saved": {},
            "command_line": {"model": "fake-model", "system_prompt": FLAG_PROMPT},
        }
        own = new_session(client)
        client.patch("/api/session", json={"session_id": own, "model": "own-model"})
        plain = new_session(client)
        start_turn(client, plain, "before")
        wait_idle(client, plain)
        assert fake.last_request["model"] == "fake-model"

        response = patch(client, default_model="big-model", default_system_prompt="Be brief.")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["default_model"] == "big-model"
        assert body["default_system_prompt"] == "Be brief."
        assert body["saved"] == {"default_model": "big-model", "default_system_prompt": "Be brief."}
        models = client.get("/api/models").json()
        assert (models["default"], models["default_system_prompt"]) == ("big-model", "Be brief.")
        # the session without its own gets the new defaults, in the request and the context
        assert first_message(client, plain) == {"role": "system", "content": "Be brief."}
        start_turn(client, plain, "after")
        wait_idle(client, plain)
        assert fake.last_request["model"] == "big-model"
        assert fake.last_request["messages"][0] == {"role": "system", "content": "Be brief."}
        rows = client.get("/api/session", params={"session_id": plain}).json()["session"]
        assert [m.get("model") for m in rows["messages"] if m["role"] == "assistant"] == [
            "fake-model",
            "big-model",
        ]
        # a session with its own model keeps it
        start_turn(client, own, "mine")
        wait_idle(client, own)
        assert fake.last_request["model"] == "own-model"

        # a blank prompt is "none"; null gives the command line's back
        assert patch(client, default_system_prompt="").json()["default_system_prompt"] is None
        assert first_message(client, plain)["role"] == "user"
        body = patch(client, default_model=None, default_system_prompt=None).json()
        assert body["saved"] == {}
        assert (body["default_model"], body["default_system_prompt"]) == ("fake-model", FLAG_PROMPT)


def test_saved_defaults_survive_a_restart_in_a_private_file(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("ok")))
    srv = serve(tmp_path / "data", fake).start()
    try:
        with srv.client() as client:
            assert patch(client, default_model="big-model").status_code == 200
    finally:
        srv.stop()
    path = tmp_path / "data" / "settings.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    srv = serve(tmp_path / "data", fake).start()
    try:
        with srv.client() as client:
            body = settings(client)
            assert body["saved"] == {"default_model": "big-model"}
            assert body["default_system_prompt"] == FLAG_PROMPT  # not saved: the flag's
            sid = new_session(client)
            start_turn(client, sid, "hello")
            wait_idle(client, sid)
            assert fake.last_request["model"] == "big-model"
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"unknown": 1},
        {"default_model": ""},
        {"default_model": 5},
        {"default_model": "m" * 201},
        {"default_system_prompt": 3},
        {"default_system_prompt": "p" * 20_001},
        {"default_model": "ok-model", "default_system_prompt": ["not text"]},
    ],
)
def test_bad_changes_are_400_and_save_nothing(
    server: ServerProcess, tmp_path: Path, body: dict
) -> None:
    with server.client() as client:
        before = settings(client)
        response = client.patch("/api/settings", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request"
        assert response.json()["message"]
        assert settings(client) == before
    assert not (tmp_path / "data" / "settings.json").exists()


def test_a_damaged_settings_file_falls_back_to_the_command_line(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "settings.json").write_text("{not json")
    srv = serve(tmp_path / "data", fake).start()
    try:
        with srv.client() as client:
            assert settings(client)["default_model"] == "fake-model"
            assert patch(client, default_model="big-model").status_code == 200
            assert settings(client)["saved"] == {"default_model": "big-model"}
    finally:
        srv.stop()
