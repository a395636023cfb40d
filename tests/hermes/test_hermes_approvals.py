"""Hermes' dangerous-command approvals go to the user through Tether (never auto-approved).
Layers: runtime (the sidecar's approval prompt blocks the agent until Tether answers), run
registry (`POST /api/chat/approve` answers a running run's open prompt once), run journal
(`approval.requested` / `approval.resolved`), visible transcript (the approval item). End to
end: `tether serve --runtime hermes` with the real hermes-agent and a real workspace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import (
    ServerProcess,
    live_timeline,
    new_session,
    running_server,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "scratch").mkdir(parents=True)
    (root / "scratch" / "note.txt").write_text("keep me unless allowed")
    return root


@pytest.fixture
def server(
    tmp_path: Path,
    hermes_flags: list[str],
    workspace: Path,
) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *hermes_flags,
        "--workspace",
        str(workspace),
    ) as running:
        yield running


def asked(client: httpx.Client, sid: str) -> dict[str, Any]:
    return wait_until(
        lambda: next((i for i in live_timeline(client, sid) if i["type"] == "approval"), None),
        90,
        "the agent's approval question",
    )


@pytest.mark.parametrize(("choice", "deleted"), [("once", True), ("deny", False)])
def test_a_flagged_command_runs_only_when_the_user_allows_it(
    server: ServerProcess, fake: FakeOpenAI, workspace: Path, choice: str, deleted: bool
) -> None:
    fake.script(
        reply(text("Cleaning up."), tool_call("call_1", "terminal", {"command": "rm -r scratch"})),
        reply(text("ESCALATE")),  # Hermes' smart approval asks its model first
        reply(text("All done.")),
    )
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "clear the scratch folder")
        item = asked(client, sid)
        assert item["command"] == "rm -r scratch" and "delete" in item["description"]
        assert (workspace / "scratch").exists()  # nothing ran while the question was open
        answer = client.post(
            "/api/chat/approve",
            json={
                "stream_id": run["stream_id"],
                "approval_id": item["approval_id"],
                "choice": choice,
            },
        ).json()
        assert answer["accepted"] is True
        body = wait_idle(client, sid, timeout=90)
        row = body["messages"][-1]
        assert row["state"] == "completed" and row["content"].endswith("All done.")
        approval = next(i for i in row["timeline"] if i["type"] == "approval")
        assert (approval["choice"], approval["reason"]) == (choice, "user")
        assert (workspace / "scratch").exists() is not deleted
        tool = next(i for i in row["timeline"] if i["type"] == "tool")
        assert ("BLOCKED" in (tool["result"] or "")) is not deleted


def test_stop_while_the_agent_waits_denies_and_frees_it(
    server: ServerProcess, fake: FakeOpenAI, workspace: Path
) -> None:
    fake.script(
        reply(tool_call("call_1", "terminal", {"command": "rm -r scratch"})),
        reply(text("ESCALATE")),
        reply(text("I will not.")),
        reply(text("Next answer.")),
    )
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "clear it")
        asked(client, sid)
        client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        body = wait_idle(client, sid, timeout=90)
        assert body["messages"][-1]["state"] == "cancelled"
        assert (workspace / "scratch" / "note.txt").exists()
        start_turn(client, sid, "something else")  # the agent is not stuck on the question
        body = wait_idle(client, sid, timeout=90)
        assert body["messages"][-1]["state"] == "completed"


def answer(client: httpx.Client, run: dict[str, Any], item: dict[str, Any], choice: str) -> Any:
    return client.post(
        "/api/chat/approve",
        json={"stream_id": run["stream_id"], "approval_id": item["approval_id"], "choice": choice},
    )


def delete_turn(client: httpx.Client, sid: str, folder: str, choice: str | None) -> dict:
    """One turn whose agent runs `rm -r <folder>`; `choice` answers its question (None: the
    agent must not ask). Returns the turn's row."""
    run = start_turn(client, sid, f"clear {folder}")
    if choice is not None:
        item = asked(client, sid)
        assert item["choices"] == ["once", "session", "always", "deny"]
        assert answer(client, run, item, choice).json()["accepted"] is True
    row = wait_idle(client, sid, timeout=90)["messages"][-1]
    assert row["state"] == "completed", row
    questions = [i for i in row["timeline"] if i["type"] == "approval"]
    assert len(questions) == (0 if choice is None else 1)
    return row


def deleting(folder: str, *, ask: bool) -> list[Any]:
    """The fake model's replies for one `delete_turn` (Hermes' smart approval asks its model
    only when the command is not allowed already)."""
    return [
        reply(tool_call(f"call_{folder}", "terminal", {"command": f"rm -r {folder}"})),
        *([reply(text("ESCALATE"))] if ask else []),
        reply(text("All done.")),
    ]


def test_allow_for_this_session_stops_asking_in_this_session_only(
    server: ServerProcess, fake: FakeOpenAI, workspace: Path, hermes_env: Path
) -> None:
    """`session` goes to Hermes' session allowlist (`approve_session`): the session's next
    recursive delete runs without a question, another session is still asked, and nothing
    is written to the permanent allowlist."""
    for folder in ("second", "third"):
        (workspace / folder).mkdir()
    fake.script(
        *deleting("scratch", ask=True),
        *deleting("second", ask=False),
        *deleting("third", ask=True),
    )
    with server.client() as client:
        sid = new_session(client)
        delete_turn(client, sid, "scratch", "session")
        delete_turn(client, sid, "second", None)
        assert not (workspace / "scratch").exists() and not (workspace / "second").exists()
        other = new_session(client)
        delete_turn(client, other, "third", "deny")
        assert (workspace / "third").exists()
    assert "command_allowlist" not in (hermes_env / "config.yaml").read_text()


def test_always_allow_goes_to_the_permanent_allowlist(
    server: ServerProcess, fake: FakeOpenAI, workspace: Path, hermes_env: Path
) -> None:
    """`always` goes to Hermes' permanent allowlist (`approve_permanent`, saved as
    `command_allowlist` in the home's config.yaml): another session (its own agent in the
    same sidecar) runs a recursive delete without a question."""
    (workspace / "second").mkdir()
    fake.script(*deleting("scratch", ask=True), *deleting("second", ask=False))
    with server.client() as client:
        delete_turn(client, new_session(client), "scratch", "always")
        config = (hermes_env / "config.yaml").read_text()
        assert "command_allowlist:\n  - recursive delete\n" in config, config
        delete_turn(client, new_session(client), "second", None)
        assert not (workspace / "second").exists()


def test_a_choice_the_agent_does_not_offer_is_refused(
    server: ServerProcess, fake: FakeOpenAI, workspace: Path, hermes_env: Path
) -> None:
    """When Hermes' smart approval says DENY, it lets the owner override for this command
    only: the question offers `once` and `deny`, and `always` is 400 with nothing changed."""
    fake.script(
        reply(tool_call("call_1", "terminal", {"command": "rm -r scratch"})),
        reply(text("DENY")),
        reply(text("All done.")),
    )
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "clear the scratch folder")
        item = asked(client, sid)
        assert item["choices"] == ["once", "deny"]
        refused = answer(client, run, item, "always")
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_request"
        assert "once, deny" in refused.json()["message"]
        assert asked(client, sid)["choice"] is None and (workspace / "scratch").exists()
        assert answer(client, run, item, "once").json()["accepted"] is True
        row = wait_idle(client, sid, timeout=90)["messages"][-1]
        assert row["state"] == "completed" and not (workspace / "scratch").exists()
    assert "command_allowlist" not in (hermes_env / "config.yaml").read_text()
