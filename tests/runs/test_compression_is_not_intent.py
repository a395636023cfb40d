"""Contract invariant 6 and issue-map rows #2308 / #2355: a compression summary is reference
material for the agent, never the user's current intent, never visible transcript, and never
carried into an ordinary fresh chat. Layers: model context, transcript."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.events import SUMMARY_PREFIX
from tether.runtimes.compression import WORK_LABEL

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import (
    ServerProcess,
    new_session,
    running_server,
    session_body,
    start_turn,
    wait_idle,
)

pytestmark = pytest.mark.slow

STALE_TASK = "ACTIVE TASK: delete the staging database"


def test_a_fresh_chat_never_resumes_a_stale_compressed_task(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.context_length = 500
    with openai_server.client() as client:
        old = new_session(client)
        fake.script(
            reply(text("word " * 350), usage={"prompt_tokens": 20, "completion_tokens": 420})
        )
        start_turn(client, old, "help me clean up staging")
        wait_idle(client, old)
        fake.script(
            reply(text(f"Summary. {STALE_TASK}.")),  # the compression pass
            reply(text("Noted.")),
        )
        start_turn(client, old, "thanks, that's all for now")
        body = wait_idle(client, old)
        sent = fake.requests[-1]["messages"]
        # the summary is a system message that says what it is; the user's words are last
        assert sent[0]["role"] == "system" and sent[0]["content"].startswith(SUMMARY_PREFIX)
        assert STALE_TASK in sent[0]["content"]
        assert sent[-1] == {"role": "user", "content": "thanks, that's all for now"}
        assert all(STALE_TASK not in str(m["content"]) for m in sent if m["role"] == "user")
        assert STALE_TASK not in str(body["messages"])  # never visible transcript
        # an ordinary fresh chat starts clean: nothing of the old task reaches the model
        fresh = new_session(client)
        fake.script(reply(text("Hello!")))
        start_turn(client, fresh, "hi")
        wait_idle(client, fresh)
        assert fake.requests[-1]["messages"] == [{"role": "user", "content": "hi"}]
        context = client.get("/api/session/context", params={"session_id": fresh}).json()
        assert STALE_TASK not in str(context) and context["compressions"] == 0
        assert session_body(client, fresh)["parent_session_id"] is None


def test_a_later_turn_never_gets_a_past_turns_work_as_its_own(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """A pass that also summarized the current turn's earlier tool exchanges (level 2,
    docs/compression.md) labels that part "work already done in the current turn": true for
    that turn's own later requests, false for every later turn, which gets the turn's
    exchanges in full from the transcript anyway. What the pass records for the context is
    the summary of the turns before its boundary only, so the next turn (here sent as it is:
    the server came back with a larger window) is not told that a past task is its own."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    for name in ("one", "two"):  # ~7,000 characters each: two of them pass a 3,000 window
        lines = (f"{name} {i:05d} {'x' * 25}\n" for i in range(200))
        (workspace / f"{name}.txt").write_text("".join(lines))
    fake.context_length = 3000
    args = ["--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"]
    with running_server(tmp_path / "data", *args, "--workspace", str(workspace)) as server:
        with server.client() as client:
            sid = new_session(client)
            fake.script(reply(text("Hello.")))
            start_turn(client, sid, "hi")
            wait_idle(client, sid)
            fake.script(
                reply(tool_call("c1", "read_file", {"path": "one.txt"})),
                reply(tool_call("c2", "read_file", {"path": "two.txt"})),
                reply(text("EARLIER: the user said hi.")),  # level 1: the turns before
                reply(text("WORK: one.txt holds 200 lines.")),  # level 2: this turn's work
                reply(text("They differ.")),
            )
            start_turn(client, sid, "compare one.txt and two.txt")
            wait_idle(client, sid)
            assert "WORK: one.txt" in str(fake.requests[-1]["messages"])  # its own work
        server.extra += ["--context-window", "100000"]
        server.restart()
        with server.client() as client:
            context = client.get("/api/session/context", params={"session_id": sid}).json()
            fake.script(reply(text("You're welcome.")))
            start_turn(client, sid, "thanks")
            wait_idle(client, sid)
    sent = fake.requests[-1]["messages"]
    assert sent == [*context["context_messages"], {"role": "user", "content": "thanks"}]
    assert sent[0] == {"role": "system", "content": f"{SUMMARY_PREFIX}EARLIER: the user said hi."}
    assert sent[1] == {"role": "user", "content": "compare one.txt and two.txt"}
    assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == ["c1", "c2"]
    assert "WORK" not in str(sent) and WORK_LABEL not in str(context)
