"""Truthful run ends through the whole stack (real server process, real HTTP and SSE, the
fake model's faults). Layers: the log's one `run.finished` and the transcript row it settles
(state, error, partial timeline); the model context keeps the partial text (invariant 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, end, hang, raw, reply, text
from helpers import ServerProcess, new_session, read_events, running_server, start_turn, wait_idle

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        "--runtime",
        "openai",
        "--base-url",
        fake.base_url,
        "--model",
        "fake-model",
        "--stream-idle-timeout",
        "1",
    ) as srv:
        yield srv


@pytest.mark.parametrize(
    ("script", "code"),
    [
        pytest.param(
            reply(text("Half an answer"), raw({"choices": [{"delta": "junk"}]})),
            "bad_response",
            id="wrong-shape",
        ),
        pytest.param(reply(text("Half an answer"), end()), "network", id="no-finish"),
        pytest.param(reply(text("Half an answer"), hang()), "network", id="stall"),
    ],
)
def test_a_stream_that_did_not_finish_ends_the_run_in_error_with_its_text(
    server: ServerProcess, fake: FakeOpenAI, script: object, code: str
) -> None:
    fake.script(script)
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "Tell me")
        body = wait_idle(client, sid, timeout=30)
        row = body["messages"][-1]
        assert row["state"] == "error", row
        assert row["error"]["code"] == code
        assert row["content"] == "Half an answer"
        kinds = [item["type"] for item in row["timeline"]]
        assert kinds == ["text", "notice"]
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        finished = [f.json["data"] for f in events if f.event == "run.finished"]
        assert [f["state"] for f in finished] == ["error"]
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        said = [m for m in context["context_messages"] if m["role"] == "assistant"]
        assert said and said[0]["content"].startswith("Half an answer")
