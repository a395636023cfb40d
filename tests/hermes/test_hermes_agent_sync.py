"""Layers: agent-store reconciliation -> run journal -> visible transcript, model context and
sidebar (issue 7, items 3-4), end to end: `tether serve --runtime hermes` while the real
hermes CLI (or hermes-agent's own `SessionDB`) writes into the same profile.

- a turn the CLI adds to a session Tether drives shows up in Tether (display and model
  context, contract invariant 1) without Tether's own turns coming back twice;
- a compression continuation the agent's lineage authorizes is exposed as
  `continuation_session_id`, a stale `POST /api/chat/start` gets 409 `session_rotated`
  before any mutation, and the continuation is a Tether session that drives the agent's
  continuation.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from statedb import write_state

from fake_openai import FakeOpenAI, barrier, reply, text
from helpers import (
    ServerProcess,
    new_session,
    read_events,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SUMMARY = "[CONTEXT COMPACTION — REFERENCE ONLY] Earlier turns were compacted: a greeting."


@pytest.fixture
def server(
    tmp_path: Path,
    hermes_flags: list[str],
) -> Iterator[ServerProcess]:
    with running_server(
        tmp_path / "data",
        *hermes_flags,
        "--agent-sync-seconds",
        "0.3",
    ) as running:
        yield running


def user_texts(request: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in request["messages"] if m["role"] == "user"]


def test_a_turn_the_cli_wrote_is_shown_and_sent_to_the_model(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path, tmp_path: Path
) -> None:
    fake.script(
        reply(text("answer to tether")),
        reply(text("answer to the cli")),
        reply(text("third answer")),
    )
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "from tether")
        wait_idle(client, sid, timeout=90)
        cli = subprocess.run(
            [
                str(hermes_python.parent / "hermes"),
                "chat",
                "-q",
                "from the cli",
                "-Q",
                "--resume",
                sid,
                "-t",
                "terminal",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
            env={
                "HERMES_HOME": str(hermes_env),
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp_path),
                "OPENAI_API_KEY": "test-key",
            },
        )
        assert cli.returncode == 0, cli.stdout + cli.stderr

        body = wait_until(
            lambda: (b := session_body(client, sid)) and len(b["messages"]) == 4 and b,
            30,
            "the CLI turn in Tether",
        )
        assert [(m["role"], m["content"], m.get("origin")) for m in body["messages"]] == [
            ("user", "from tether", None),
            ("assistant", "answer to tether", None),
            ("user", "from the cli", "agent"),
            ("assistant", "answer to the cli", "agent"),
        ]
        assert body["message_count"] == 4

        start_turn(client, sid, "third")
        body = wait_idle(client, sid, timeout=90)
        assert body["messages"][-1]["content"] == "third answer"
        # The model saw what the user sees, each turn once, in order.
        assert user_texts(fake.requests[-1]) == ["from tether", "from the cli", "third"]
        time.sleep(1.0)  # several sync passes: Tether's own turn is not imported back
        assert len(session_body(client, sid)["messages"]) == 6


def test_a_turn_the_cli_wrote_during_a_tether_turn_is_kept(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path
) -> None:
    """Invariant 5: while Tether's turn waits on the model, another client writes a turn
    into the same agent session with Hermes' own SessionDB. Only the rows Tether's agent
    wrote are its: the CLI's turn reaches the display and the model, Tether's comes back
    never (the sidecar reports the ids its SessionDB wrote)."""
    fake.script(reply(barrier("hold"), text("answer to tether")), reply(text("third answer")))
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "from tether")
        assert fake.wait_reached("hold", 90)
        write_state(
            hermes_python,
            hermes_env,
            [
                ["append", sid, "user", "from the cli", {}],
                ["append", sid, "assistant", "answer to the cli", {}],
            ],
        )
        fake.release("hold")
        wait_idle(client, sid, timeout=90)
        body = wait_until(
            lambda: (b := session_body(client, sid)) and len(b["messages"]) == 4 and b,
            30,
            "the CLI turn in Tether",
        )
        assert [(m["role"], m["content"], m.get("origin")) for m in body["messages"]] == [
            ("user", "from tether", None),
            ("assistant", "answer to tether", None),
            ("user", "from the cli", "agent"),
            ("assistant", "answer to the cli", "agent"),
        ]
        start_turn(client, sid, "third")
        wait_idle(client, sid, timeout=90)
        assert user_texts(fake.requests[-1]) == ["from tether", "from the cli", "third"]
        time.sleep(1.0)  # several sync passes: nothing comes back twice
        assert len(session_body(client, sid)["messages"]) == 6


def test_no_pass_imports_while_a_tether_turn_is_open(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path
) -> None:
    """The contract omits an ambiguous timestamp bucket while its turn is active; Tether
    does not reconcile an open turn at all. The CLI writes a turn whose user row has the
    exact timestamp of Tether's running turn: for many sync intervals nothing is imported;
    once the turn is done, the CLI's turn is shown once, and Tether's never twice."""
    fake.script(reply(barrier("hold"), text("answer to tether")), reply(text("next")))
    with server.client() as client:
        sid = new_session(client)
        run = start_turn(client, sid, "from tether")
        assert fake.wait_reached("hold", 90)
        at = run["pending_started_at"]
        write_state(
            hermes_python,
            hermes_env,
            [
                ["append", sid, "user", "same time, other client", {"timestamp": at}],
                ["append", sid, "assistant", "answer to the cli", {}],
            ],
        )
        deadline = time.monotonic() + 2.0  # six or seven sync passes
        while time.monotonic() < deadline:
            body = session_body(client, sid)
            assert [m["content"] for m in body["messages"]] == ["from tether"]
            assert imported_events(client, sid) == []
            time.sleep(0.2)
        fake.release("hold")
        wait_idle(client, sid, timeout=90)
        body = wait_until(
            lambda: (b := session_body(client, sid)) and len(b["messages"]) == 4 and b,
            30,
            "the CLI turn in Tether",
        )
        assert [(m["content"], m.get("origin")) for m in body["messages"]] == [
            ("from tether", None),
            ("answer to tether", None),
            ("same time, other client", "agent"),
            ("answer to the cli", "agent"),
        ]


def imported_events(client: Any, sid: str) -> list[dict[str, Any]]:
    frames = read_events(client, sid, after="0", stop_on="heartbeat")
    return [f.json["data"] for f in frames if f.event == "agent.imported"]


def test_passes_that_import_nothing_write_no_event_before_or_after_a_restart(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path
) -> None:
    """Issue 14 item 5: a pass before every turn and every sync interval used to write an
    `agent.imported` with `entries: []` just to move the watermark. Now only an import is an
    event; where the passes got to survives a restart without one."""
    fake.script(*(reply(text(f"answer {n}")) for n in range(4)))
    with server.client() as client:
        sid = new_session(client)
        for n in range(3):
            start_turn(client, sid, f"turn {n}")
            wait_idle(client, sid, timeout=90)
        time.sleep(1.0)  # several sync passes over the rows of Tether's own turns
        assert imported_events(client, sid) == []
        write_state(
            hermes_python,
            hermes_env,
            [["append", sid, "user", "from the cli", {}], ["append", sid, "assistant", "ok", {}]],
        )
        wait_until(lambda: imported_events(client, sid), 30, "the CLI turn imported")
    server.restart()
    with server.client() as client:
        start_turn(client, sid, "after the restart")
        wait_idle(client, sid, timeout=90)
        time.sleep(1.0)
        [event] = imported_events(client, sid)
        assert [[r["content"] for r in e["rows"]] for e in event["entries"]] == [
            ["from the cli", "ok"]
        ]
        contents = [m["content"] for m in session_body(client, sid)["messages"]]
        assert contents.count("from the cli") == 1 and len(contents) == 10


def test_a_continuation_from_the_agents_lineage_is_followed_not_forked(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path
) -> None:
    fake.script(reply(text("hello there")), reply(text("continuing in the continuation")))
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "first")
        wait_idle(client, sid, timeout=90)
        # The CLI compresses the session into a continuation; Tether's poll finds it.
        write_state(
            hermes_python,
            hermes_env,
            [
                ["end", sid, "compression"],
                ["sleep", 0.05],
                ["create", "cli_cont", "cli", {"parent_session_id": sid}],
                [
                    "replace",
                    "cli_cont",
                    [
                        {"role": "user", "content": SUMMARY},
                        {"role": "assistant", "content": "hello there"},
                    ],
                ],
            ],
        )
        wait_until(
            lambda: session_body(client, sid)["continuation_session_id"],
            30,
            "the continuation from the lineage",
        )
        # The CLI talks on there; a stale tab sends at once, before the next poll.
        write_state(
            hermes_python,
            hermes_env,
            [
                ["sleep", 0.05],
                ["append", "cli_cont", "user", "asked in the cli", {}],
                ["append", "cli_cont", "assistant", "answered in the cli", {}],
            ],
        )
        before = session_body(client, sid)

        stale = client.post("/api/chat/start", json={"session_id": sid, "message": "stale"})
        assert stale.status_code == 409, stale.text
        assert stale.json()["code"] == "session_rotated"
        child = stale.json()["continuation_session_id"]
        assert child and child != sid
        parent = session_body(client, sid)
        assert parent["continuation_session_id"] == child
        assert parent["messages"] == before["messages"]  # no turn, no pending, no worker
        assert parent["pending_user_message"] is None and parent["busy"] is False

        body = session_body(client, child)  # its history is there as soon as the 409 is
        assert body["parent_session_id"] == sid
        assert [m["content"] for m in body["messages"]] == [
            "asked in the cli",
            "answered in the cli",
        ]
        assert [m["content"] for m in body["inherited_messages"]] == ["first", "hello there"]
        context = client.get("/api/session/context", params={"session_id": child}).json()
        messages = context["context_messages"]
        assert messages[0]["role"] == "system" and "a greeting" in messages[0]["content"]
        assert [m["content"] for m in messages[1:]] == [
            "hello there",
            "asked in the cli",
            "answered in the cli",
        ]
        listed = [r["session_id"] for r in client.get("/api/sessions").json()["sessions"]]
        assert child in listed and sid not in listed

        start_turn(client, child, "go on")
        wait_idle(client, child, timeout=90)
        assert user_texts(fake.requests[-1])[-2:] == ["asked in the cli", "go on"]
    db = sqlite3.connect(hermes_env / "state.db")
    rows = db.execute("SELECT session_id FROM messages WHERE content = 'go on'").fetchall()
    assert rows == [("cli_cont",)]  # the agent continued its own continuation


def test_a_session_started_in_the_cli_appears_and_continues_in_tether(
    server: ServerProcess, fake: FakeOpenAI, hermes_env: Path, hermes_python: Path, tmp_path: Path
) -> None:
    fake.script(reply(text("hi from the cli")))  # later requests (titles, ...) get "ok"
    cli = subprocess.run(
        [
            str(hermes_python.parent / "hermes"),
            "chat",
            "-q",
            "hello from a new cli session",
            "-Q",
            "-t",
            "terminal",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env={
            "HERMES_HOME": str(hermes_env),
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "OPENAI_API_KEY": "test-key",
        },
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    db = sqlite3.connect(hermes_env / "state.db")
    [(agent_id,)] = db.execute("SELECT id FROM sessions WHERE source = 'cli'").fetchall()
    with server.client() as client:

        def adopted() -> list[dict[str, Any]]:
            return [
                r for r in client.get("/api/sessions").json()["sessions"] if r["message_count"] >= 2
            ]

        [row] = wait_until(adopted, 30, "the CLI's session in the sidebar")
        sid = row["session_id"]
        body = session_body(client, sid)
        assert [(m["role"], m["content"]) for m in body["messages"][:2]] == [
            ("user", "hello from a new cli session"),
            ("assistant", "hi from the cli"),
        ]
        time.sleep(1.0)  # later passes adopt it once
        assert len(client.get("/api/sessions").json()["sessions"]) == 1

        fake.script(reply(text("continued in tether")))
        start_turn(client, sid, "and now from tether")
        body = wait_idle(client, sid, timeout=90)
        assert body["messages"][-1]["content"] == "continued in tether"
        assert user_texts(fake.requests[-1]) == [
            "hello from a new cli session",
            "and now from tether",
        ]  # each once
    rows = db.execute("SELECT session_id FROM messages WHERE content = 'and now from tether'")
    assert rows.fetchall() == [(agent_id,)]  # the agent continued the CLI's own session


def test_a_cli_session_deleted_in_tether_stays_deleted(
    server: ServerProcess, hermes_env: Path, hermes_python: Path
) -> None:
    """Deleting a session that was started in the CLI removes Tether's copy only (the CLI's
    own stays in `state.db`). The next pass used to find the CLI session driven by no
    existing Tether session and adopt it again, under the same id: Delete did nothing."""
    write_state(
        hermes_python,
        hermes_env,
        [
            ["create", "cli1", "cli", {}],
            ["append", "cli1", "user", "hello from the cli", {}],
            ["append", "cli1", "assistant", "hi", {}],
        ],
    )
    with server.client() as client:

        def listed() -> list[str]:
            return [r["session_id"] for r in client.get("/api/sessions").json()["sessions"]]

        [sid] = wait_until(listed, 30, "the CLI's session in the sidebar")
        assert client.delete("/api/session", params={"session_id": sid}).json() == {"ok": True}
        time.sleep(1.5)  # several passes
        assert listed() == []
        write_state(hermes_python, hermes_env, [["append", "cli1", "user", "more", {}]])
        time.sleep(1.5)  # the CLI goes on in it: still Tether's copy is gone
        assert listed() == []
        # a session started in the CLI afterwards still shows up
        write_state(hermes_python, hermes_env, [["create", "cli2", "cli", {}]])
        [other] = wait_until(listed, 30, "the second CLI session")
        assert other != sid


def test_a_session_archived_in_the_cli_is_adopted_archived(
    server: ServerProcess, hermes_env: Path, hermes_python: Path
) -> None:
    """Hermes' archive (`SessionDB.set_session_archived`) hides a session from its lists
    and keeps its messages. Discovery ignored it: an archived CLI session showed up in
    Tether's sidebar as an active one. It is adopted archived: out of the sidebar, in the
    archived list with its history, as in Hermes."""
    write_state(
        hermes_python,
        hermes_env,
        [
            ["create", "cli_old", "cli", {}],
            ["append", "cli_old", "user", "an old question", {}],
            ["append", "cli_old", "assistant", "an old answer", {}],
            ["archive", "cli_old"],
            ["create", "cli_new", "cli", {}],
            ["append", "cli_new", "user", "a new question", {}],
            ["append", "cli_new", "assistant", "a new answer", {}],
        ],
    )
    with server.client() as client:

        def listed(archived: bool) -> list[dict[str, Any]]:
            query = "?archived=1" if archived else ""
            return client.get(f"/api/sessions{query}").json()["sessions"]

        wait_until(lambda: len(listed(False)) + len(listed(True)) >= 2, 30, "both adopted")
        [active] = listed(False)
        assert session_body(client, active["session_id"])["messages"][0]["content"] == (
            "a new question"
        )
        [archived] = listed(True)
        assert archived["archived"] is True
        body = session_body(client, archived["session_id"])
        assert [(m["role"], m["content"]) for m in body["messages"]] == [
            ("user", "an old question"),
            ("assistant", "an old answer"),
        ]
        time.sleep(1.0)  # later passes adopt neither again
        assert len(listed(False)) == 1
        assert len(listed(True)) == 1
