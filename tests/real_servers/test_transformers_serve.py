"""Tether against Hugging Face `transformers serve` (a real OpenAI-compatible server, CPU
torch) on loopback, through Tether's real server process: a turn, a tool call, compression,
an unknown model, Stop ending the server's own generation, an answer cut off at the token
limit, and the server killed mid-answer.
Layers: the log's one run.finished and the row it settles (state, finish_reason, error,
partial timeline), the run registry (Stop)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from servekit import TransformersServe

from helpers import (
    ServerProcess,
    live_timeline,
    new_session,
    read_events,
    running_server,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow


@contextmanager
def tether(tmp_path: Path, serve: TransformersServe, *extra: str) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        "--runtime",
        "openai",
        "--base-url",
        serve.base_url,
        "--model",
        serve.model,
        *extra,
    ) as srv:
        yield srv


@pytest.fixture
def tether_stops(tmp_path: Path, serve_stops: TransformersServe) -> Iterator[ServerProcess]:
    with tether(tmp_path, serve_stops) as srv:
        yield srv


def test_a_turn_and_the_next_one(tether_stops: ServerProcess) -> None:
    with tether_stops.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "hello")
        row = wait_idle(client, sid, timeout=60)["messages"][-1]
        assert row["state"] == "completed", row
        assert row["content"] == "hello world"
        assert "finish_reason" not in row
        assert row["usage"]["completion_tokens"] >= 2
        start_turn(client, sid, "again")
        body = wait_idle(client, sid, timeout=60)
        assert [m["role"] for m in body["messages"]] == ["user", "assistant"] * 2
        assert body["messages"][-1]["content"] == "hello world"
        # transformers serve states no context window: it stays unknown (docs/runtimes.md)
        health = client.get("/api/health").json()
        assert health["context_window"] is None and health["context_window_source"] is None


def test_a_tool_call_and_the_answer_after_it(
    tmp_path: Path, serve_tools: TransformersServe
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("launch on Tuesday\n")
    with (
        tether(tmp_path, serve_tools, "--workspace", str(workspace)) as srv,
        srv.client() as client,
    ):
        sid = new_session(client)
        start_turn(client, sid, "what files are there?")
        row = wait_idle(client, sid, timeout=60)["messages"][-1]
    assert row["state"] == "completed", row
    tool, answer = row["timeline"]
    assert tool["type"] == "tool" and tool["name"] == "list_files" and tool["done"]
    assert not tool["is_error"] and "notes.txt" in tool["result_preview"]
    assert answer["type"] == "text" and row["content"] == "hello world"


def test_in_place_compression_of_an_earlier_turn(
    tmp_path: Path, serve_stops: TransformersServe
) -> None:
    long = "tell me something long " * 100  # 400 words: one token each for this tokenizer
    with (
        tether(tmp_path, serve_stops, "--context-window", "1024") as srv,
        srv.client() as client,
    ):
        sid = new_session(client)
        start_turn(client, sid, long)
        assert wait_idle(client, sid, timeout=60)["messages"][-1]["state"] == "completed"
        start_turn(client, sid, long)
        body = wait_idle(client, sid, timeout=60)
        events = read_events(client, sid, after="0", stop_on="heartbeat")
        context = client.get("/api/session/context", params={"session_id": sid}).json()
    assert body["messages"][-1]["state"] == "completed", body["messages"][-1]
    done = [f.json["data"] for f in events if f.event == "compression.completed"]
    assert len(done) == 1 and done[0]["summary"] == "hello world"
    assert done[0]["tokens_before"] > done[0]["tokens_after"]
    first = context["context_messages"][0]
    assert first["role"] == "system" and first["content"].endswith("hello world")
    assert [e["turn_id"] for e in context["excluded"]] == [body["messages"][0]["turn_id"]]


def test_a_model_the_server_is_not_pinned_to_is_model_not_found(
    tmp_path: Path, serve_stops: TransformersServe
) -> None:
    with (
        running_server(
            tmp_path / "data",
            "--runtime",
            "openai",
            "--base-url",
            serve_stops.base_url,
            "--model",
            "some-other-model",
        ) as srv,
        srv.client() as client,
    ):
        sid = new_session(client)
        start_turn(client, sid, "hello")
        row = wait_idle(client, sid, timeout=60)["messages"][-1]
    assert row["state"] == "error"
    assert row["error"]["code"] == "model_not_found"
    assert "pinned to" in row["error"]["message"]


@pytest.mark.parametrize(
    ("flags", "limit"),
    [
        pytest.param(("--max-tokens", "12"), 12, id="configured"),
        pytest.param(("--context-window", "512"), 64, id="an-eighth-of-the-window"),
    ],
)
def test_an_answer_cut_off_at_the_token_limit(
    tmp_path: Path, serve_endless: TransformersServe, flags: tuple[str, ...], limit: int
) -> None:
    with tether(tmp_path, serve_endless, *flags) as srv, srv.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "write a long story")
        row = wait_idle(client, sid, timeout=60)["messages"][-1]
    assert row["state"] == "completed", row
    assert row["finish_reason"] == "length"
    assert row["content"].split() == ["more"] * limit
    notice = row["timeline"][-1]
    assert notice["type"] == "notice" and notice["kind"] == "length"


def quiet_window(server: TransformersServe, window: float = 1.5, within: float = 5.0) -> float:
    """The least CPU the server spent in a `window` during the `within` seconds after a
    Stop: its own clean-up right after the request closed can take a second of CPU (seen
    once in a full run), while a generation that goes on (4,000 tokens here, well past
    `within`) keeps every window busy."""
    least = float("inf")
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        before = server.cpu_seconds()
        time.sleep(window)
        least = min(least, server.cpu_seconds() - before)
        if least < 0.25:
            break
    return least


def test_stop_ends_the_servers_generation(tmp_path: Path, serve_endless: TransformersServe) -> None:
    with tether(tmp_path, serve_endless, "--context-window", "8192", "--max-tokens", "4000") as srv:
        with srv.client() as client:
            sid = new_session(client)
            run = start_turn(client, sid, "tell me something long")
            wait_until(lambda: live_timeline(client, sid), 60, "the first words")
            before = serve_endless.cpu_seconds()
            time.sleep(1.0)
            generating = serve_endless.cpu_seconds() - before
            assert client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]}).json()[
                "cancelled"
            ]
            row = wait_idle(client, sid, timeout=30)["messages"][-1]
            after_stop = quiet_window(serve_endless)
        assert row["state"] == "cancelled"
        assert row["content"].split()[0] == "more"
        assert generating > 0.3, f"the server was not generating ({generating:.2f} s CPU in 1 s)"
        assert after_stop < 0.25, f"the server kept generating ({after_stop:.2f} s CPU in 1.5 s)"
        assert len(row["content"].split()) < 4000


def test_a_server_killed_mid_answer_ends_the_run_in_error_with_its_text(
    tmp_path: Path, serve_to_kill: TransformersServe
) -> None:
    with tether(tmp_path, serve_to_kill, "--context-window", "8192", "--max-tokens", "4000") as srv:
        with srv.client() as client:
            sid = new_session(client)
            start_turn(client, sid, "tell me something long")
            wait_until(lambda: live_timeline(client, sid), 60, "the first words")
            serve_to_kill.kill()
            row = wait_idle(client, sid, timeout=30)["messages"][-1]
            events = read_events(client, sid, after="0", stop_on="heartbeat")
            start_turn(client, sid, "are you there?")  # the server is down now
            down = wait_idle(client, sid, timeout=30)["messages"][-1]
        assert row["state"] == "error", row
        assert row["error"]["code"] == "network"
        assert row["content"].split()[0] == "more"
        assert [f.json["data"]["state"] for f in events if f.event == "run.finished"] == ["error"]
        assert down["state"] == "error" and down["error"]["code"] == "network"
        assert "Could not reach" in down["error"]["message"]
