"""Layers: run journal (the log), worker lifecycle registry, visible transcript, model context.

`kill -9` of the server at each phase of a run, then a restart. Whatever the phase:

- the log is intact (seqs 1..N, contiguous, no duplicates) and every run ends exactly once
  (one `run.finished` per stream, `interrupted` for the killed one, written by recovery);
- nothing already shown is lost: every event a client saw before the kill is in the log
  with the same content, and the settled assistant row's timeline starts with the live
  timeline seen before the kill (contract invariant 3; invariant 6 for the compression
  divider, which is live-only);
- the recovery is maintenance (invariant 4): the session's `updated_at`, `last_message_at`
  and `activity_count` are those of before the kill, in the session and in the list;
- the user turn that started the run is visible before its output (invariant 2) and in
  `GET /api/session/context` (invariant 1), and it reaches the model with the next turn,
  which the session accepts at once.

Each test runs on SQLite and on PostgreSQL. On PostgreSQL the restarted server is a new
replica: the killed one's run ends when its lease expires (up to ~12 s after the restart)
rather than at start-up, and the checks wait for that ending.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.projections.context import UNFINISHED_TOOL_RESULT

from fake_openai import FakeOpenAI, barrier, reasoning, reply, text, tool_call
from faultkit import (
    Backend,
    assert_each_run_ends_once,
    assert_log_intact,
    assert_visible_turns_in_context,
    live_text,
    live_timeline,
    openai_flags,
    wait_run_ended,
    whole_log,
)
from helpers import (
    ServerProcess,
    new_session,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def server(
    tmp_path: Path, fake: FakeOpenAI, workspace: Path, store_flags: list[str]
) -> Iterator[ServerProcess]:
    # A search that stays in flight for seconds: 1,500 names (hard links) of one 2 MB file
    # without a match; the search reads them all until its 10 s budget runs out. (A FIFO
    # used to hold a tool open forever; the tools now refuse one at once.)
    slow = workspace / "slow"
    slow.mkdir()
    (slow / "0.txt").write_text(("nothing to find on this line " * 3 + "\n") * 23_000)
    for n in range(1, 1500):
        os.link(slow / "0.txt", slow / f"{n}.txt")
    with running_server(tmp_path / "data", *openai_flags(fake, workspace), *store_flags) as srv:
        yield srv


@pytest.fixture
def bare_server(
    tmp_path: Path, fake: FakeOpenAI, store_flags: list[str]
) -> Iterator[ServerProcess]:
    """No workspace, so no tool schemas count against a tiny context window."""
    with running_server(tmp_path / "data", *openai_flags(fake), *store_flags) as srv:
        yield srv


@dataclass
class Seen:
    """What a client had been shown when the server died."""

    session_id: str
    stream_id: str
    message: str
    log: list[dict[str, Any]]  # every event it had received, from seq 1
    live: list[dict[str, Any]]  # the live timeline `GET /api/session` showed
    activity: tuple[float, float, int]  # (updated_at, last_message_at, activity_count)


def activity_of(row: dict[str, Any]) -> tuple[float, float, int]:
    """What only activity moves (contract invariant 4), of a session body or sidebar row."""
    return row["updated_at"], row["last_message_at"], row["activity_count"]


def observe(client: httpx.Client, session_id: str, run: dict, message: str) -> Seen:
    log = whole_log(client, session_id)
    body = session_body(client, session_id)
    assert body["live"] is not None and body["live"]["stream_id"] == run["stream_id"]
    assert body["pending_user_message"] == message
    assert not [
        e
        for e in log
        if e["type"] == "run.finished" and e["envelope"]["stream_id"] == run["stream_id"]
    ]
    return Seen(
        session_id, run["stream_id"], message, log, body["live"]["timeline"], activity_of(body)
    )


def kill_and_restart(server: ServerProcess, backend: Backend, seen: Seen) -> None:
    """`kill -9`, a start, and the wait for recovery to end the killed run."""
    server.kill()
    server.start()
    with server.client() as client:
        wait_run_ended(client, seen.session_id, seen.stream_id, backend)


def assert_recovered(client: httpx.Client, seen: Seen) -> tuple[dict, dict, list]:
    """The checks every phase shares; returns (assistant row, context, log)."""
    log = whole_log(client, seen.session_id)
    assert_log_intact(log)
    assert log[: len(seen.log)] == seen.log  # nothing shown is lost or changed
    endings = assert_each_run_ends_once(log)
    ending = endings[seen.stream_id]
    assert ending["state"] == "interrupted" and ending["maintenance"] is True

    body = session_body(client, seen.session_id)
    assert body["busy"] is False and body["live"] is None
    assert body["pending_user_message"] is None
    # The recovery (or takeover) is maintenance: nothing unread, no move in the list.
    listed = {r["session_id"]: r for r in client.get("/api/sessions").json()["sessions"]}
    assert activity_of(body) == activity_of(listed[seen.session_id]) == seen.activity
    user, assistant = body["messages"][-2:]
    assert user["role"] == "user" and user["content"] == seen.message  # the owner comes first
    assert assistant["role"] == "assistant" and assistant["stream_id"] == seen.stream_id
    assert assistant["turn_id"] == user["turn_id"]
    assert assistant["state"] == "interrupted"
    assert assistant["timeline"][-1]["type"] == "notice"
    shown = [i for i in seen.live if i["type"] != "compression"]  # the divider is live-only
    assert assistant["timeline"][: len(shown)] == shown
    assert len(assistant["timeline"]) == len(shown) + 1  # plus the notice, nothing invented

    context = assert_visible_turns_in_context(client, seen.session_id)
    assert {"role": "user", "content": seen.message} in context["context_messages"]
    return assistant, context, log


def assert_accepts_a_new_turn(client: httpx.Client, fake: FakeOpenAI, seen: Seen) -> list:
    """The next turn runs to completion, and the model receives the interrupted turn with
    it. Returns the messages the model received."""
    fake.reset()  # frees anything the dead process left blocked, forgets old requests
    fake.script(reply(text("Back again.")))
    start_turn(client, seen.session_id, "Are you still there?")
    body = wait_idle(client, seen.session_id)
    assert body["messages"][-1]["state"] == "completed"
    assert body["messages"][-1]["content"] == "Back again."
    sent = fake.requests[-1]["messages"]
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert users[-2:] == [seen.message, "Are you still there?"]
    return sent


def test_kill_right_after_the_start_returns_keeps_the_turn(
    server: ServerProcess, fake: FakeOpenAI, backend: Backend
) -> None:
    fake.script(reply(barrier("never"), text("never shown")))  # the run cannot end by itself
    message = "Kill me before I get going"
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, message)
    server.kill()  # no await in between: the model call may not even have started
    server.start()
    with server.client() as client:
        log = wait_run_ended(client, sid, run["stream_id"], backend)
        submitted = [e["envelope"] for e in log if e["type"] == "turn.submitted"]
        assert len(submitted) == 1  # what the start answered is exactly what was kept
        assert submitted[0]["data"]["stream_id"] == run["stream_id"]
        assert submitted[0]["data"]["turn_id"] == run["turn_id"]
        assert submitted[0]["data"]["submitted_at"] == run["pending_started_at"]
        assert not [e for e in log if e["type"].endswith(".delta")]
        at = submitted[0]["at"]  # the one activity: the turn
        seen = Seen(sid, run["stream_id"], message, log[:2], [], (at, at, 1))
        assistant, _, _ = assert_recovered(client, seen)
        assert assistant["content"] == ""
        user = session_body(client, sid)["messages"][0]
        assert user["created_at"] == run["pending_started_at"]
        assert_accepts_a_new_turn(client, fake, seen)


def test_kill_after_the_model_got_the_request_but_sent_nothing(
    server: ServerProcess, fake: FakeOpenAI, backend: Backend
) -> None:
    fake.script(reply(barrier("first"), text("never shown")))
    message = "Think quietly"
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, message)
        assert fake.wait_reached("first", 10)
        seen = observe(client, sid, run, message)
        assert [e["type"] for e in seen.log] == ["session.created", "turn.submitted", "run.started"]
        assert seen.live == []
    kill_and_restart(server, backend, seen)
    with server.client() as client:
        assistant, context, _ = assert_recovered(client, seen)
        assert [i["type"] for i in assistant["timeline"]] == ["notice"]
        assert assistant["content"] == ""
        assert context["context_messages"][0] == {"role": "user", "content": message}
        assert_accepts_a_new_turn(client, fake, seen)


def test_kill_mid_stream_keeps_the_streamed_reasoning_and_text(
    server: ServerProcess, fake: FakeOpenAI, backend: Backend
) -> None:
    fake.script(
        reply(
            reasoning("Weighing the options."),
            text("Partial "),
            text("answer, "),
            barrier("mid"),
            text("never shown"),
        )
    )
    message = "Tell me slowly"
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, message)
        assert fake.wait_reached("mid", 10)
        wait_until(lambda: live_text(client, sid) == "Partial answer, ", what="the text")
        seen = observe(client, sid, run, message)
        assert [i["type"] for i in seen.live] == ["reasoning", "text"]
    kill_and_restart(server, backend, seen)
    with server.client() as client:
        assistant, context, _ = assert_recovered(client, seen)
        assert assistant["content"] == "Partial answer, "
        assert assistant["timeline"][0]["text"] == "Weighing the options."
        replies = [m for m in context["context_messages"] if m["role"] == "assistant"]
        assert replies[0]["content"].startswith("Partial answer, ")
        sent = assert_accepts_a_new_turn(client, fake, seen)
        assert sent[1]["role"] == "assistant"
        assert sent[1]["content"].startswith("Partial answer, ")


def test_kill_mid_tool_call_leaves_the_tool_unfinished_and_answered_with_no_result(
    server: ServerProcess, fake: FakeOpenAI, backend: Backend
) -> None:
    fake.script(
        reply(
            text("Searching."),
            tool_call("call_slow", "search_files", {"pattern": "needle", "path": "slow"}),
        ),
        reply(text("never requested")),
    )
    message = "Where is the needle?"
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, message)
        wait_until(
            lambda: [i for i in live_timeline(client, sid) if i["type"] == "tool"],
            what="tool.started",
        )
        seen = observe(client, sid, run, message)
        types = [e["type"] for e in seen.log]
        assert "tool.started" in types and "tool.completed" not in types
        assert fake.requests_count == 1  # the tool is still in flight: no second request
        tool = seen.live[-1]
        assert tool["name"] == "search_files" and tool["done"] is False
    kill_and_restart(server, backend, seen)
    with server.client() as client:
        assistant, context, log = assert_recovered(client, seen)
        assert "tool.completed" not in [e["type"] for e in log]
        tool = [i for i in assistant["timeline"] if i["type"] == "tool"]
        assert len(tool) == 1 and tool[0]["done"] is False and tool[0]["call_id"] == "call_slow"
        call = {"role": "tool", "tool_call_id": "call_slow", "content": UNFINISHED_TOOL_RESULT}
        messages = context["context_messages"]
        asked = messages.index(call) - 1
        assert messages[asked]["role"] == "assistant"
        assert [c["id"] for c in messages[asked]["tool_calls"]] == ["call_slow"]
        sent = assert_accepts_a_new_turn(client, fake, seen)
        assert call in sent  # the model is told the tool never returned


def test_kill_during_compression_drops_the_divider_and_keeps_the_history(
    bare_server: ServerProcess, fake: FakeOpenAI, backend: Backend
) -> None:
    fake.context_length = 400  # compress above 320 tokens
    with bare_server.client() as client:
        sid = new_session(client)
        fake.script(
            reply(
                text("A short first answer."), usage={"prompt_tokens": 20, "completion_tokens": 350}
            )
        )
        start_turn(client, sid, "First question")
        assert wait_idle(client, sid)["messages"][-1]["state"] == "completed"
        fake.script(reply(barrier("summary"), text("never returned")))  # the summary request
        message = "Second question, past the threshold"
        run = start_turn(client, sid, message)
        assert fake.wait_reached("summary", 10)
        wait_until(lambda: live_timeline(client, sid), what="compression.started")
        seen = observe(client, sid, run, message)
        assert "compression.started" in [e["type"] for e in seen.log]
        assert [(i["type"], i["done"]) for i in seen.live] == [("compression", False)]
        assert "stream" not in fake.requests[-1]  # it is the non-streaming summary request
    kill_and_restart(bare_server, backend, seen)
    with bare_server.client() as client:
        assistant, context, log = assert_recovered(client, seen)
        assert "compression.completed" not in [e["type"] for e in log]
        assert [i["type"] for i in assistant["timeline"]] == ["notice"]  # no divider
        assert context["compressions"] == 0 and context["excluded"] == []
        first = session_body(client, sid)["messages"][:2]
        assert [m["content"] for m in first] == ["First question", "A short first answer."]
        assert_accepts_a_new_turn(client, fake, seen)


def test_kill_while_finishing_keeps_the_whole_answer_and_ends_the_run_once(
    server: ServerProcess, fake: FakeOpenAI, backend: Backend
) -> None:
    answer = "The whole answer, every word."
    fake.script(
        reply(
            reasoning("Almost there."),
            text("The whole answer, "),
            text("every word."),
            barrier("end"),
        )
    )  # before the finish chunk
    message = "Finish this"
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, message)
        assert fake.wait_reached("end", 10)
        wait_until(lambda: live_text(client, sid) == answer, what="the whole answer")
        seen = observe(client, sid, run, message)
    kill_and_restart(server, backend, seen)
    with server.client() as client:
        assistant, _, _ = assert_recovered(client, seen)
        assert assistant["content"] == answer
    server.restart()  # a second start finds nothing left to settle
    with server.client() as client:
        log = whole_log(client, sid)
        assert_each_run_ends_once(log)
        assert len([e for e in log if e["type"] == "run.finished"]) == 1
        assert_accepts_a_new_turn(client, fake, seen)
