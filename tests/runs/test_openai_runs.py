"""The `openai` runtime through the whole stack: real server process, real HTTP and SSE, and
the fake OpenAI-compatible server at the model boundary. Layers: run registry (Stop), log,
transcript (partial output, typed errors), model context (invariant 1)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tether.runtimes.openai import OpenAIRuntime
from tether.settings import Settings

from engine_harness import harness
from fake_openai import (
    FakeOpenAI,
    barrier,
    drop_connection,
    error,
    hang,
    malformed,
    reasoning,
    reply,
    text,
    tool_call,
)
from helpers import (
    ServerProcess,
    fold_frames,
    new_session,
    read_events,
    start_turn,
    wait_idle,
)

pytestmark = pytest.mark.slow


def test_streamed_answer_with_reasoning_and_a_workspace_tool(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(
            reasoning("Need the notes."),
            text("Checking the notes."),
            tool_call("call_1", "read_file", {"path": "notes.txt"}),
        ),
        reply(text("The launch is on **Tuesday**.")),
    )
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "When is the launch?")
        body = wait_idle(client, sid)
        assistant = body["messages"][-1]
        assert assistant["state"] == "completed"
        assert assistant["content"] == "The launch is on **Tuesday**."
        kinds = [(i["type"], i.get("interim")) for i in assistant["timeline"]]
        assert kinds == [("reasoning", None), ("text", True), ("tool", None), ("text", False)]
        tool = assistant["timeline"][2]
        assert tool["name"] == "read_file" and tool["done"] and not tool["is_error"]
        assert "Tuesday" in tool["result_preview"]
        first, second = fake.requests
        assert first["messages"][-1] == {"role": "user", "content": "When is the launch?"}
        assert first["stream"] is True and first["model"] == "fake-model"
        roles = [m["role"] for m in second["messages"]]
        assert roles[-2:] == ["assistant", "tool"]
        assert "Tuesday" in second["messages"][-1]["content"]
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        assert events[2].json["data"] == {
            "stream_id": assistant["stream_id"],
            "turn_id": assistant["turn_id"],
            "runtime": "openai",
            "model": "fake-model",
        }


def test_stop_mid_stream_closes_the_model_request_within_a_second(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("Partial answer "), barrier("mid"), text("never sent"), hang()))
    with openai_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "Talk to me")
        assert fake.wait_reached("mid", 10)
        read_events(client, sid, after="0", stop_on="text.delta")
        stopped_at = time.monotonic()
        assert client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()[
            "cancelled"
        ]
        assert fake.wait_disconnects(1, 5)
        assert fake.disconnect_times[0] - stopped_at < 1.0
        body = wait_idle(client, sid)
        assert body["messages"][-1]["state"] == "cancelled"
        assert body["messages"][-1]["content"] == "Partial answer "
        # the partial answer is part of what the model sees next (invariant 1)
        fake.script(reply(text("ok")))
        start_turn(client, sid, "Go on")
        wait_idle(client, sid)
        sent = fake.requests[-1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"].startswith("Partial answer")
        assert sent[2] == {"role": "user", "content": "Go on"}


@pytest.mark.parametrize(
    ("script", "code"),
    [
        (error(401, "Incorrect API key provided", code="invalid_api_key"), "auth"),
        (error(429, "Rate limit reached", code="rate_limit_exceeded"), "rate_limit"),
        (error(404, "The model does not exist", code="model_not_found"), "model_not_found"),
        (
            error(
                400,
                "This model's maximum context length is 8192 tokens",
                code="context_length_exceeded",
            ),
            "context_overflow",
        ),
        (error(500, "The server had an error"), "bad_response"),
        (malformed(), "bad_response"),
        (drop_connection(text("half")), "network"),
    ],
)
def test_provider_failures_end_the_run_with_a_typed_error(
    openai_server: ServerProcess, fake: FakeOpenAI, script: object, code: str
) -> None:
    fake.default_reply = script
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "hello")
        body = wait_idle(client, sid)
        assistant = body["messages"][-1]
        assert assistant["state"] == "error"
        assert assistant["error"]["code"] == code
        assert assistant["error"]["message"]
        notice = assistant["timeline"][-1]
        assert notice["type"] == "notice" and assistant["error"]["message"] in notice["text"]
        assert body["busy"] is False
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        finished = [f.json["data"] for f in events if f.event == "run.finished"]
        assert len(finished) == 1 and finished[0]["error"]["code"] == code


def test_the_tool_loop_stops_at_its_limit(openai_server: ServerProcess, fake: FakeOpenAI) -> None:
    fake.default_reply = reply(tool_call("call_again", "list_files", {"path": "."}))
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "loop forever")
        body = wait_idle(client, sid)
        assistant = body["messages"][-1]
        assert assistant["state"] == "tool_limit_reached"
        assert "tool-call limit" in assistant["timeline"][-1]["text"]


def test_stop_before_the_first_model_request_makes_no_request(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    async def main() -> None:
        runtime = OpenAIRuntime(
            Settings(
                runtime="openai", base_url=fake.base_url, model="fake-model", data_dir=tmp_path
            )
        )
        async with harness(tmp_path, runtime) as h:
            sid = (await h.sessions.create(None))["session_id"]
            run = await h.engine.start(sid, "hi", [], None)
            assert (await h.controls.cancel(stream_id=run["stream_id"]))["cancelled"]
            await h.wait_idle(sid)
            await asyncio.sleep(0.2)
        assert fake.requests_count == 0

    asyncio.run(main())


def test_steer_joins_the_conversation_after_the_current_tool_result(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(
            text("Looking."),
            barrier("before-tool"),
            tool_call("call_1", "list_files", {"path": "."}),
        ),
        reply(text("Done, and budget noted.")),
    )
    with openai_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "Check the files")
        assert fake.wait_reached("before-tool", 10)
        accepted = client.post(
            "/api/chat/steer", json={"stream_id": run["stream_id"], "text": "also note the budget"}
        )
        assert accepted.json()["accepted"] is True
        fake.release("before-tool")
        body = wait_idle(client, sid)
        assert body["messages"][-1]["state"] == "completed"
        second = fake.requests[1]["messages"]
        assert [m["role"] for m in second][-3:] == ["assistant", "tool", "user"]
        assert second[-1] == {"role": "user", "content": "also note the budget"}
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        assert {"role": "user", "content": "also note the budget"} in context["context_messages"]


@pytest.mark.parametrize("order", ["reasoning first", "progress first"])
def test_an_echo_between_reasoning_and_progress_is_shown_once(
    openai_server: ServerProcess, fake: FakeOpenAI, order: str
) -> None:
    """Contract invariant 5 (echo index): stripped once where output enters the log, so the
    settled transcript and a replay of the log both show the progress text once."""
    progress = "Let me check the notes file first."
    if order == "reasoning first":
        steps = [
            reasoning("The user wants the date. Let me   check\nthe notes file first."),
            text(progress),
        ]
        kept = "The user wants the date."
    else:
        steps = [text(progress), reasoning("Let me check the notes\n\nfile   first.")]
        kept = ""
    fake.script(
        reply(*steps, tool_call("call_1", "read_file", {"path": "notes.txt"})),
        reply(text("Tuesday.")),
    )
    with openai_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "When?")
        body = wait_idle(client, sid)
        timeline = body["messages"][-1]["timeline"]
        reasoning_items = [i["text"] for i in timeline if i["type"] == "reasoning"]
        texts = [i["text"] for i in timeline if i["type"] == "text"]
        assert reasoning_items == [kept]
        assert texts == [progress, "Tuesday."]
        frames = read_events(client, sid, after="0", stop_on="heartbeat")
        assert "reasoning.trimmed" in [f.event for f in frames]
        assert fold_frames(frames)["messages"] == body["messages"]
        assert run["stream_id"] == body["messages"][-1]["stream_id"]


@pytest.mark.parametrize(
    ("thought", "progress", "kept"),
    [
        ("Both files are read. Done.", "Done.", "Both files are read."),  # an exact repeat
        ("The change is undone.", "done.", "The change is undone."),  # only folds into a word
    ],
)
def test_a_short_echo_is_shown_once_and_a_short_lookalike_stays(
    openai_server: ServerProcess, fake: FakeOpenAI, thought: str, progress: str, kept: str
) -> None:
    """Contract invariant 5 (echo rule, no minimum): "Done." repeating the reasoning's tail
    is shown once; "done." at the end of "undone." is no echo, and both stay whole."""
    fake.script(
        reply(reasoning(thought), text(progress), tool_call("c1", "read_file", {"path": "x"})),
        reply(text("Tuesday.")),
    )
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "When?")
        body = wait_idle(client, sid)
        timeline = body["messages"][-1]["timeline"]
        assert [i["text"] for i in timeline if i["type"] == "reasoning"] == [kept]
        assert [i["text"] for i in timeline if i["type"] == "text"] == [progress, "Tuesday."]
        frames = read_events(client, sid, after="0", stop_on="heartbeat")
        assert fold_frames(frames)["messages"] == body["messages"]


def test_a_think_block_in_the_content_is_shown_and_kept_as_reasoning(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Invariant 1: the thoughts a model wrote as `<think>...</think>` in its content are the
    row's reasoning, and the next request sends back only the answer the row shows."""
    fake.script(
        reply(text("<think>The user"), text(" greets me.</th"), text("ink>\n\nHello!")),
        reply(text("Fine.")),
    )
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "Hi")
        row = wait_idle(client, sid)["messages"][-1]
        assert row["state"] == "completed" and row["content"] == "Hello!"
        timeline = [(i["type"], i["text"]) for i in row["timeline"]]
        assert timeline == [("reasoning", "The user greets me."), ("text", "Hello!")]
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        said = [m["content"] for m in context["context_messages"] if m["role"] == "assistant"]
        assert said == ["Hello!"]
        start_turn(client, sid, "How are you?")
        wait_idle(client, sid)
        sent = [m for m in fake.requests[-1]["messages"] if m["role"] == "assistant"]
        assert sent == [{"role": "assistant", "content": "Hello!"}]


def test_tool_calls_that_share_an_id_are_each_shown_and_kept(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Invariant 1: a server that gives every call of a reply (or of each step) the same id
    (`call_0`, `0`): before, the row and the context kept only
    the first call of each id, though the model was sent every call and its result."""
    fake.script(
        reply(
            tool_call("call_0", "read_file", {"path": "notes.txt"}),
            tool_call("call_0", "list_files", {}),
        ),
        reply(tool_call("call_0", "search_files", {"pattern": "launch"})),
        reply(text("Tuesday.")),
    )
    with openai_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "When is the launch?")
        row = wait_idle(client, sid)["messages"][-1]
        tools = [i for i in row["timeline"] if i["type"] == "tool"]
        assert [t["name"] for t in tools] == ["read_file", "list_files", "search_files"]
        assert len({t["call_id"] for t in tools}) == 3
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        # the calls and results the model was sent are those the row shows and the context keeps
        assert calls_and_results(context["context_messages"]) == calls_and_results(
            fake.requests[-1]["messages"]
        )
        assert [(t["call_id"], t["name"]) for t in tools] == [
            (c["id"], c["function"]["name"])
            for m in fake.requests[-1]["messages"]
            for c in m.get("tool_calls") or ()
        ]


def calls_and_results(messages: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    calls = [c for m in messages for c in m.get("tool_calls") or ()]
    results = [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]
    return calls, results
