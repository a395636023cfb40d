"""What the branch tests share: a branch switch and a turn answered by the fake model."""

from __future__ import annotations

import httpx

from fake_openai import FakeOpenAI, reply, text
from helpers import start_turn, wait_idle


def switch(client: httpx.Client, sid: str, row_id: str, index: int) -> httpx.Response:
    return client.post(
        "/api/session/branch", json={"session_id": sid, "row_id": row_id, "index": index}
    )


def answered(client: httpx.Client, fake: FakeOpenAI, sid: str, message: str, answer: str) -> dict:
    fake.script(reply(text(answer)))
    start_turn(client, sid, message)
    return wait_idle(client, sid)
