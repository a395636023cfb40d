"""Truthful run ends through the whole stack (real server process, real HTTP and SSE, the
fake model's faults). Layers: the log's one `run.finished` and the transcript row it settles
(state, error, partial timeline); the model context keeps the partial text (invariant 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, end, hang, raw, reply, text, verbatim
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
        pytest.param(  # llama.cpp's server: an `error:` line, then [DONE]
            reply(
                text("Half an answer"),
                verbatim('error: {"code":500,"message":"slot crashed"}\n\ndata: [DONE]\n\n'),
            ),
            "bad_response",
            id="llama-cpp-error-line",
        ),
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


def test_an_answer_cut_off_at_the_token_limit_says_so(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("A long answer that stops"), finish_reason="length"), reply(text("ok")))
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "Tell me everything")
        row = wait_idle(client, sid)["messages"][-1]
        assert row["state"] == "completed"
        assert row["finish_reason"] == "length"
        assert row["content"] == "A long answer that stops"
        notice = row["timeline"][-1]
        assert notice["type"] == "notice" and notice["kind"] == "length"
        assert notice["text"].startswith("Cut off at the token limit")
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        finished = [f.json["data"] for f in events if f.event == "run.finished"]
        assert [(f["state"], f["finish_reason"]) for f in finished] == [("completed", "length")]
        # a plain answer has no notice and no finish_reason
        start_turn(client, sid, "Thanks")
        row = wait_idle(client, sid)["messages"][-1]
        assert "finish_reason" not in row
        assert [i["type"] for i in row["timeline"]] == ["text"]


def test_an_answer_stopped_by_the_content_filter_says_so(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    # Before: the row was `completed` with no notice, the text so far passing for the whole
    # answer (or an empty answer, when the filter stopped it at once).
    fake.script(reply(text("Here is how to"), finish_reason="content_filter"))
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "Tell me")
        row = wait_idle(client, sid)["messages"][-1]
        assert row["state"] == "completed" and row["finish_reason"] == "content_filter"
        notice = row["timeline"][-1]
        assert notice["type"] == "notice" and notice["kind"] == "content_filter"
        assert notice["text"].startswith("Stopped by the provider's content filter")
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        said = [m["content"] for m in context["context_messages"] if m["role"] == "assistant"]
        assert said == [f"Here is how to\n\n[{notice['text']}]"]
