"""Edit, regenerate and branch switch (docs/api.md §10) with `tether serve --runtime hermes`:
the real hermes-agent in its sidecar, the fake OpenAI-compatible server as its model.

Hermes keeps its own copy of every turn in `state.db`, the old branch's rows included; the
model must still get only the branch the page shows (contract invariant 1), and
`GET /api/session/context` must say exactly what it got."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from statedb import write_state

from fake_openai import FakeOpenAI, reply, text
from helpers import ServerProcess, new_session, running_server, start_turn, wait_idle, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def server(
    tmp_path: Path,
    hermes_flags: list[str],
) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *hermes_flags,
    ) as running:
        yield running


def said(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A model request (or context) as (role, text) pairs; Hermes' system prompt left out."""
    return [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "assistant")]


def contents(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"]]


def turn_request(fake: FakeOpenAI, message: str) -> dict[str, Any]:
    """The newest model request of the turn that sent `message` (not a title or summary)."""
    for request in reversed(fake.requests):
        last = request["messages"][-1]
        if last["role"] == "user" and last["content"] == message:
            return request
    raise AssertionError(f"no model request ends with {message!r}")


def context_of(client: httpx.Client, sid: str) -> list[tuple[str, Any]]:
    response = client.get("/api/session/context", params={"session_id": sid})
    assert response.status_code == 200, response.text
    return said(response.json()["context_messages"])


def assert_context_follows(
    client: httpx.Client, sid: str, request: dict[str, Any], answer: str
) -> None:
    """GET /api/session/context is the request the model got, then the answer it gave."""
    assert context_of(client, sid) == [*said(request["messages"]), ("assistant", answer)]


def answered(client: httpx.Client, fake: FakeOpenAI, sid: str, message: str, answer: str) -> dict:
    fake.script(reply(text(answer)))
    start_turn(client, sid, message)
    body = wait_idle(client, sid, timeout=90)
    assert body["messages"][-1]["content"] == answer
    return body


def stored_texts(home: Path, sid: str) -> list[str]:
    """What Hermes' own `state.db` holds for the session's agent session (every branch)."""
    with sqlite3.connect(home / "state.db") as db:
        rows = db.execute("SELECT content FROM messages WHERE session_id = ? ORDER BY id", (sid,))
        return [str(content) for (content,) in rows]


def children(body: dict[str, Any], parent_id: str) -> list[str]:
    """The rows that follow `parent_id` on every branch (GET /api/session's `branches`)."""
    assert body["branches"] is not None
    return [row for row, parent in body["branches"]["order"] if parent == parent_id]


def test_a_regenerated_answer_is_a_new_branch_and_the_model_never_sees_the_old_one(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path
) -> None:
    with server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "first question", "first answer")
        body = answered(client, fake, sid, "second question", "old second answer")
        old = body["messages"][3]

        fake.script(reply(text("new second answer")))
        response = client.post("/api/chat/regenerate", json={"session_id": sid})
        assert response.status_code == 200, response.text
        body = wait_idle(client, sid, timeout=90)
        assert contents(body) == [
            ("user", "first question"),
            ("assistant", "first answer"),
            ("user", "second question"),
            ("assistant", "new second answer"),
        ]
        new = body["messages"][3]
        assert new["branch"] == {"index": 2, "count": 2}
        # Two branches after "second question": the old answer is kept, hidden.
        assert children(body, body["messages"][2]["id"]) == [old["id"], new["id"]]
        assert [row["content"] for row in body["branches"]["hidden"]] == ["old second answer"]

        # The model got the first exchange and the question once, never the old answer.
        asked = [r for r in fake.requests if r["messages"][-1]["content"] == "second question"]
        assert len(asked) == 2  # the first answer's request, then the regenerated one's
        request = turn_request(fake, "second question")
        assert said(request["messages"]) == [
            ("user", "first question"),
            ("assistant", "first answer"),
            ("user", "second question"),
        ]
        assert "old second answer" not in json.dumps(request)
        assert_context_follows(client, sid, request, "new second answer")

        # Hermes' own store keeps the old answer; the next turn still gets exactly the context.
        assert "old second answer" in stored_texts(hermes_env, sid)
        expected = context_of(client, sid)
        answered(client, fake, sid, "third question", "third answer")
        request = turn_request(fake, "third question")
        assert said(request["messages"]) == [*expected, ("user", "third question")]
        assert "old second answer" not in json.dumps(request)
        assert_context_follows(client, sid, request, "third answer")


def test_an_edit_and_a_switch_back_each_send_the_model_the_branch_shown(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path
) -> None:
    with server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "original question", "original answer")
        before = answered(client, fake, sid, "follow-up question", "follow-up answer")
        first = before["messages"][0]

        # Edit the first message: the model gets the edited message alone.
        fake.script(reply(text("edited answer")))
        start_turn(client, sid, "edited question", edit_of=first["id"])
        body = wait_idle(client, sid, timeout=90)
        assert contents(body) == [("user", "edited question"), ("assistant", "edited answer")]
        assert body["messages"][0]["branch"] == {"index": 2, "count": 2}
        request = turn_request(fake, "edited question")
        assert said(request["messages"]) == [("user", "edited question")]
        assert "original answer" in stored_texts(hermes_env, sid)
        dumped = json.dumps(request)
        for old in ("original question", "original answer", "follow-up"):
            assert old not in dumped
        assert_context_follows(client, sid, request, "edited answer")

        assert "edited answer" in stored_texts(hermes_env, sid)
        # Switch back to the first branch: shown whole, and it is what the model gets next.
        response = client.post(
            "/api/session/branch",
            json={"session_id": sid, "row_id": body["messages"][0]["id"], "index": 1},
        )
        assert response.status_code == 200, response.text
        assert contents(response.json()["session"]) == contents(before)
        assert context_of(client, sid) == contents(before)

        answered(client, fake, sid, "third question", "third answer")
        request = turn_request(fake, "third question")
        assert said(request["messages"]) == [*contents(before), ("user", "third question")]
        dumped = json.dumps(request)
        assert "edited question" not in dumped and "edited answer" not in dumped
        assert_context_follows(client, sid, request, "third answer")


def test_a_regenerated_answer_the_cli_wrote_leaves_the_model_context(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path
) -> None:
    """Layer: model context of an imported turn (`agent.imported`), invariant 1: the model
    gets the branch shown. A turn the CLI wrote is imported as a user row and an answer row;
    Regenerate hides that answer behind a new branch, and the imported user row used to carry
    the agent's messages of the whole turn, the old answer included, into every later
    request (and into `GET /api/session/context`)."""
    with server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "from tether", "one")
        write_state(
            hermes_python,
            hermes_env,
            [["append", sid, "user", "from the cli", {}], ["append", sid, "assistant", "old", {}]],
        )
        wait_until(lambda: len(contents(wait_idle(client, sid))) == 4, 30, "the CLI turn")
        fake.script(reply(text("new")))
        response = client.post("/api/chat/regenerate", json={"session_id": sid})
        assert response.status_code == 200, response.text
        body = wait_idle(client, sid, timeout=90)
        assert contents(body)[2:] == [("user", "from the cli"), ("assistant", "new")]
        assert_context_follows(client, sid, turn_request(fake, "from the cli"), "new")
        answered(client, fake, sid, "next", "two")
        assert said(turn_request(fake, "next")["messages"]) == [
            ("user", "from tether"),
            ("assistant", "one"),
            ("user", "from the cli"),
            ("assistant", "new"),
            ("user", "next"),
        ]
