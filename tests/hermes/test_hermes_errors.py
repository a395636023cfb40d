"""A model error inside Hermes Agent reaches the run with the code a person can act on
(docs/api.md §runs: `auth`, `rate_limit`, `model_not_found`, `context_overflow`,
`network`, `bad_response`), read from the agent's error text by `tether serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from fake_openai import FakeOpenAI, error, reply, text, tool_call
from helpers import new_session, read_events, running_server, start_turn, wait_idle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_provider_errors_get_the_code_of_their_status_and_kind(
    tmp_path: Path, hermes_flags: list[str], fake: FakeOpenAI
) -> None:
    """A number that merely contains a status code ("4010 requests") used to read as that
    status (auth), and Hermes' own context overflow ("Context overflow and auto-compaction is
    disabled") as a bad response."""
    cases = [
        (error(500, "overloaded after 4010 requests"), "bad_response"),
        (error(401, "Incorrect API key provided"), "auth"),
        (
            error(
                400,
                "This model's maximum context length is 131072 tokens.",
                code="context_length_exceeded",
            ),
            "context_overflow",
        ),
    ]
    with running_server(tmp_path / "data", *hermes_flags) as server, server.client() as client:
        for reply, code in cases:
            fake.reset()
            fake.script(reply, reply, reply)
            sid = new_session(client)
            start_turn(client, sid, "hello")
            last = wait_idle(client, sid, timeout=120)["messages"][-1]
            assert last["state"] == "error"
            assert last["error"]["code"] == code, last["error"]


def test_the_agents_iteration_limit_ends_the_run_tool_limit_reached(
    tmp_path: Path, hermes_flags: list[str], fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hermes stops a turn that has no final answer after `max_iterations` requests
    (`turn_exit_reason` `max_iterations_reached`, `completed` false). The run used to end
    `completed`, with no answer and nothing saying why the agent stopped."""
    monkeypatch.setenv("TETHER_HERMES_MAX_ITERATIONS", "2")
    fake.script(
        *(
            reply(text("Again."), tool_call(f"call_{n}", "terminal", {"command": "echo hi"}))
            for n in range(4)
        )
    )
    with running_server(tmp_path / "data", *hermes_flags) as server, server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "loop")
        last = wait_idle(client, sid, timeout=120)["messages"][-1]
        assert last["state"] == "tool_limit_reached"
        notices = [i["text"] for i in last["timeline"] if i["type"] == "notice"]
        assert any("tool-call limit" in n for n in notices), last["timeline"]
        frames = read_events(client, sid, after="0", stop_on="heartbeat")
        [finished] = [f.json["data"] for f in frames if f.event == "run.finished"]
        assert "stopped after 2 iterations" in finished["reason"]
        assert client.get("/api/sessions").json()["sessions"][0]["last_run_state"] == (
            "tool_limit_reached"
        )


def test_an_answer_still_cut_off_after_hermes_continuations_says_so(
    tmp_path: Path, hermes_flags: list[str], fake: FakeOpenAI
) -> None:
    """Hermes asks the model to continue an answer cut at the token limit, a few times, then
    gives up (`completed` false, "Response remained truncated ..."). The run ended a plain
    `completed` with the cut answer, nothing saying it was incomplete."""
    fake.script(*(reply(text("cut "), finish_reason="length") for _ in range(6)))
    with running_server(tmp_path / "data", *hermes_flags) as server, server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "write a lot")
        last = wait_idle(client, sid, timeout=120)["messages"][-1]
        assert last["state"] == "completed"
        assert last["content"].startswith("cut cut")
        notices = [(i["kind"], i["text"]) for i in last["timeline"] if i["type"] == "notice"]
        assert notices == [("length", "Cut off at the token limit: the answer may be incomplete.")]


def test_a_model_that_answers_nothing_ends_the_run_in_error_saying_so(
    tmp_path: Path, hermes_flags: list[str], fake: FakeOpenAI
) -> None:
    """The model answers every request (Hermes' retries too) with no text and no tool call:
    Hermes ends the turn without an answer (`completed` false). The run ended `completed`
    with an empty answer and no notice: an empty bubble, nothing saying why."""
    fake.default_reply = reply()
    with running_server(tmp_path / "data", *hermes_flags) as server, server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "hello")
        last = wait_idle(client, sid, timeout=120)["messages"][-1]
        assert last["state"] == "error", last
        assert last["error"]["code"] == "bad_response", last["error"]
        assert "returned nothing" in last["error"]["message"], last["error"]
        notices = [(i["kind"], i["text"]) for i in last["timeline"] if i["type"] == "notice"]
        assert [kind for kind, _ in notices] == ["error"], last["timeline"]
        assert client.get("/api/sessions").json()["sessions"][0]["last_run_state"] == "error"
