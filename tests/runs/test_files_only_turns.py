"""A message of files alone (an image to describe, a log to read) is a turn, as in the chat
apps people come from: the page offered Send with files and no text, and the server refused
it as empty. Layers: the HTTP intake (an empty text is refused only without files) and the
OpenAI runtime (no empty text part goes to the model); the model context is the projection
of the transcript as shown, the files without text (contract invariant 1)."""

from __future__ import annotations

import base64

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, start_turn, wait_idle

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
IMAGE = {"name": "cat.png", "mime": "image/png", "data_base64": base64.b64encode(PNG).decode()}


def test_files_without_text_are_a_turn_and_reach_the_model_without_an_empty_text_part(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("A small square.")))
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "", attachments=[IMAGE])
        body = wait_idle(client, sid)
        user, answer = body["messages"]
        assert (user["role"], user["content"]) == ("user", "")
        assert [a["name"] for a in user["attachments"]] == ["cat.png"]
        assert answer["content"] == "A small square."
        sent = fake.last_request["messages"][-1]
        assert sent["role"] == "user"
        assert [part["type"] for part in sent["content"]] == ["image_url"]
        # still refused: no text and no files, or only blanks; nothing recorded
        for refused in ({"message": ""}, {"message": " \n", "attachments": []}):
            response = client.post("/api/chat/start", json={"session_id": sid, **refused})
            assert response.status_code == 400, response.text
            assert response.json()["code"] == "invalid_request"
        shown = client.get("/api/session", params={"session_id": sid}).json()["session"]
        assert shown["last_seq"] == body["last_seq"]


def test_files_without_text_can_be_queued(openai_server: ServerProcess, fake: FakeOpenAI) -> None:
    fake.script(reply(text("first")), reply(text("second")))
    with openai_server.client() as client:
        sid = new_session(client)
        response = client.post(
            "/api/chat/queue", json={"session_id": sid, "message": "", "attachments": [IMAGE]}
        )
        assert response.status_code == 200, response.text
        body = wait_idle(client, sid)
        assert [m["content"] for m in body["messages"]] == ["", "first"]
