"""`tether serve --runtime hermes` end to end: the engine drives the real hermes-agent in its
sidecar; turns, tools, Stop and steer land in the log like any runtime's."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import processes_with

from fake_openai import FakeOpenAI, barrier, hang, reasoning, reply, text, tool_call
from helpers import (
    ServerProcess,
    new_session,
    read_events,
    running_server,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def hermes_server(
    tmp_path: Path,
    hermes_flags: list[str],
) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *hermes_flags,
        "--cancel-reclaim-seconds",
        "5",
    ) as server:
        yield server


def test_turns_with_tools_land_in_the_log_and_the_context(
    hermes_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(
            reasoning("Plan: run it."),
            text("Running."),
            tool_call("call_1", "terminal", {"command": "echo served"}),
        ),
        reply(text("It said served.")),
        reply(text("Second answer.")),
    )
    with hermes_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "run echo")
        body = wait_idle(client, sid, timeout=90)
        assistant = body["messages"][-1]
        assert assistant["content"].endswith("It said served.")
        kinds = [item["type"] for item in assistant["timeline"]]
        assert "tool" in kinds and "reasoning" in kinds
        tool = next(i for i in assistant["timeline"] if i["type"] == "tool")
        assert tool["name"] == "terminal" and "served" in tool["result_preview"]
        start_turn(client, sid, "again")
        body = wait_idle(client, sid, timeout=60)
        assert body["messages"][-1]["content"] == "Second answer."
        # the second turn's request carries the first turn as history
        contents = [str(m.get("content")) for m in fake.requests[-1]["messages"]]
        assert "run echo" in contents and contents[-1] == "again"


def test_stop_mid_stream_cancels_and_closes_the_request(
    hermes_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("partial answer"), barrier("b"), hang()), reply(text("after stop")))
    with hermes_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "go on")
        assert fake.wait_reached("b", 60)
        read_events(client, sid, after="0", stop_on="text.delta", timeout=30)
        stop = client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()
        assert stop["cancelled"] is True
        body = wait_idle(client, sid, timeout=30)
        assert fake.wait_disconnects(1, 15)
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        finished = [f.json["data"] for f in events if f.event == "run.finished"]
        assert finished[-1]["state"] == "cancelled"
        assert "partial answer" in body["messages"][-1]["content"]
        start_turn(client, sid, "next")
        body = wait_idle(client, sid, timeout=60)
        assert body["messages"][-1]["content"] == "after stop"


def test_steer_is_delivered_where_the_agent_took_it(
    hermes_server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(
            text("Checking."),
            barrier("first"),
            tool_call("call_1", "terminal", {"command": "echo one"}),
        ),
        reply(text("Budget mentioned.")),
    )
    with hermes_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "summarise")
        assert fake.wait_reached("first", 60)
        steer = client.post(
            "/api/chat/steer", json={"stream_id": run["stream_id"], "text": "mention the budget"}
        ).json()
        assert steer["accepted"] is True
        fake.release("first")
        body = wait_idle(client, sid, timeout=60)
        assistant = body["messages"][-1]
        steer_rows = [i for i in assistant["timeline"] if i["type"] == "steer"]
        assert [(r["text"], r["leftover"]) for r in steer_rows] == [("mention the budget", False)]
        types = [i["type"] for i in assistant["timeline"]]
        assert types.index("tool") < types.index("steer")
        assert "mention the budget" in str(fake.requests[1]["messages"][-1]["content"])


def test_the_turn_after_a_stop_mid_tool_starts_without_the_agents_paragraph_break(
    hermes_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Layer: the runtime's text stream -> visible transcript and model context (invariant 1:
    the row shows what the model said). Hermes marks a paragraph break to prepend to the text
    after a tool round; a turn stopped during its tool never streams that text, and the mark
    used to carry into the next turn, whose answer then began with a blank line in the row,
    the Copy text and the next turns' model context."""
    fake.script(
        reply(text("Sleeping."), tool_call("call_1", "terminal", {"command": "sleep 30"})),
        reply(text("Next answer.")),
    )
    with hermes_server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "sleep please")
        read_events(client, sid, after="0", stop_on="tool.started", timeout=60)
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        wait_idle(client, sid, timeout=60)
        start_turn(client, sid, "next")
        body = wait_idle(client, sid, timeout=60)
        assert body["messages"][-1]["content"] == "Next answer."
        context = client.get("/api/session/context", params={"session_id": sid}).json()
        assert context["context_messages"][-1] == {"role": "assistant", "content": "Next answer."}


def test_shutting_down_mid_tool_ends_the_tools_process(
    tmp_path: Path, hermes_flags: list[str], fake: FakeOpenAI
) -> None:
    """Hermes runs a terminal command in a session of its own, so only the agent's close
    ends it. On a graceful shutdown Tether drops its agents, then tells the sidecar to
    close, and the sidecar used to exit before the agents dropped had closed: the command
    ran on after Tether had stopped (a `sleep` here; a build, a server, anything)."""
    token = f"tether-probe-{tmp_path.name}"
    fake.script(
        reply(
            text("Waiting."), tool_call("call_1", "terminal", {"command": f"sleep 600 # {token}"})
        )
    )
    server = ServerProcess(tmp_path / "data", *hermes_flags).start()
    try:
        with server.client() as client:
            sid = new_session(client)
            start_turn(client, sid, "wait")
            read_events(client, sid, after="0", stop_on="tool.started", timeout=60)
        wait_until(lambda: processes_with(token), timeout=30, what="the tool's process")
        assert server.stop() == 0
        wait_until(lambda: not processes_with(token), timeout=10, what="the tool to end")
    finally:
        for pid in processes_with(token):
            os.kill(pid, signal.SIGKILL)
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
