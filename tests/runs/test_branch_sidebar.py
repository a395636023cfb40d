"""The sidebar row of a session with branches (docs/api.md §3, §10), through the real
server and the fake model: the automatic title follows the first message shown (files alone
are named by their first file), never a title set by hand; the failed-run mark follows the
branch shown. Layer: the sidebar row fold (`projections/sidebar.py`); keeps contract
invariants 4 (the mark moves, `updated_at` and the order do not) and 5 (both are folded from
the log, the same on every replay)."""

from __future__ import annotations

import base64
import json
import signal
from typing import Any

import httpx
import pytest
from runs.branch_kit import answered, switch

from fake_openai import FakeOpenAI, error, hang, reply, text
from helpers import (
    ServerProcess,
    live_timeline,
    new_session,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow


def test_a_first_message_of_files_only_is_named_by_its_first_file_on_every_branch(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """A branch whose first message is files without text (`chat/start` takes files alone, and
    an import brings such turns: a Tether export holds whatever its log held): a switch to
    it named the session "New chat" in the sidebar and the header, over a conversation that
    had long started. The first attachment's name names it, on its branch, through a switch
    there and back, and through a restart that rebuilds the rows from the log. Layer: the
    sidebar row fold (`projections/sidebar.py`), through the real API; keeps contract
    invariant 5 (the title is folded from the log's events, the same on every replay)."""

    def titles(client: httpx.Client, sid: str) -> tuple[str, str]:
        listed = {
            s["session_id"]: s["title"] for s in client.get("/api/sessions").json()["sessions"]
        }
        return session_body(client, sid)["title"], listed[sid]

    files = [
        {"name": name, "mime": "text/plain", "data_base64": base64.b64encode(b"data").decode()}
        for name in ("Lisbon itinerary.txt", "budget.txt")
    ]
    named = ("Lisbon itinerary.txt", "Lisbon itinerary.txt")
    with openai_server.client() as client:
        original = new_session(client)
        fake.script(reply(text("Read them.")))
        start_turn(client, original, "see the files", attachments=files)
        first = session_body(client, original)["messages"][0]["id"]
        wait_idle(client, original)
        fake.script(reply(text("Sure.")))
        edit = {"session_id": original, "message": "Plan the trip", "edit_of": first}
        assert client.post("/api/chat/start", json=edit).status_code == 200
        wait_idle(client, original)

        # The same log, its files-only first message as an import brings it.
        export = client.get(f"/api/sessions/{original}/export").json()
        files_only = next(e for e in export["events"] if e["type"] == "turn.submitted")
        assert files_only["data"]["text"] == "see the files"
        files_only["data"]["text"] = ""
        imported = client.post("/api/sessions/import", content=json.dumps(export))
        assert imported.status_code == 201, imported.text
        sid = imported.json()["sessions"][0]["session_id"]
        assert titles(client, sid) == ("Plan the trip", "Plan the trip")
        shown = session_body(client, sid)["messages"][0]
        assert switch(client, sid, shown["id"], 1).status_code == 200
        body = session_body(client, sid)
        assert body["messages"][0]["content"] == ""
        assert [a["name"] for a in body["messages"][0]["attachments"]] == [f["name"] for f in files]
        assert titles(client, sid) == named
        assert switch(client, sid, body["messages"][0]["id"], 2).status_code == 200
        assert titles(client, sid) == ("Plan the trip", "Plan the trip")
        assert switch(client, sid, shown["id"], 1).status_code == 200

    openai_server.stop()
    openai_server.start()
    with openai_server.client() as client:
        assert titles(client, sid) == named


def test_the_automatic_title_follows_the_first_message_shown_never_a_title_set_by_hand(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """A session named by its first message kept that name after the message was edited:
    the sidebar and the header said "plan teh trip" over a conversation that now starts
    "Plan the Lisbon trip". The first message shown names the session, on every branch;
    an edit further down, and a title set by hand, are left alone. Layer: the sidebar row
    fold (`projections/sidebar.py`), through the real API; keeps contract invariant 5 (the
    title is folded from the log's branch events, the same on every replay)."""

    def titles(client: httpx.Client, sid: str) -> tuple[str, str]:
        listed = {
            s["session_id"]: s["title"] for s in client.get("/api/sessions").json()["sessions"]
        }
        return session_body(client, sid)["title"], listed[sid]

    with openai_server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "plan teh trip\nto Lisbon", "Sure.")
        answered(client, fake, sid, "in May", "Noted.")
        assert titles(client, sid) == ("plan teh trip", "plan teh trip")
        first = session_body(client, sid)["messages"][0]["id"]

        fake.script(reply(text("Sure.")))
        edit = {"session_id": sid, "message": "Plan the Lisbon trip", "edit_of": first}
        assert client.post("/api/chat/start", json=edit).status_code == 200
        body = wait_idle(client, sid)
        assert titles(client, sid) == ("Plan the Lisbon trip", "Plan the Lisbon trip")
        assert client.get("/api/sessions", params={"q": "Lisbon trip"}).json()["sessions"]

        # A switch to the first branch shows its first message, and its name.
        edited = body["messages"][0]["id"]
        assert switch(client, sid, edited, 1).status_code == 200
        assert titles(client, sid) == ("plan teh trip", "plan teh trip")
        assert switch(client, sid, first, 2).status_code == 200
        assert titles(client, sid) == ("Plan the Lisbon trip", "Plan the Lisbon trip")

        # An edit further down names nothing.
        answered(client, fake, sid, "in May", "Noted.")
        fake.script(reply(text("Noted.")))
        later = session_body(client, sid)["messages"][2]["id"]
        edit = {"session_id": sid, "message": "in June", "edit_of": later}
        assert client.post("/api/chat/start", json=edit).status_code == 200
        wait_idle(client, sid)
        assert titles(client, sid) == ("Plan the Lisbon trip", "Plan the Lisbon trip")

        # A title set by hand stays through an edit of the first message and a switch.
        renamed = client.patch("/api/session", json={"session_id": sid, "title": "Holidays"})
        assert renamed.status_code == 200
        fake.script(reply(text("Sure.")))
        edit = {"session_id": sid, "message": "Plan the Porto trip", "edit_of": edited}
        assert client.post("/api/chat/start", json=edit).status_code == 200
        wait_idle(client, sid)
        assert titles(client, sid) == ("Holidays", "Holidays")
        assert (
            switch(client, sid, session_body(client, sid)["messages"][0]["id"], 1).status_code
            == 200
        )
        assert titles(client, sid) == ("Holidays", "Holidays")


def test_the_sidebars_last_run_state_follows_the_branch_shown(
    openai_server: ServerProcess, fake: FakeOpenAI
) -> None:
    """A failed answer, then a switch to the branch whose answer succeeded: the sidebar row
    kept `last_run_state: "error"` (the failure mark) over a conversation that shows no
    failure, and an undo that hid the failed answer kept it too. It is how the last answer
    shown ended. Layer: the sidebar row fold (`projections/sidebar.py`), from
    `branch.switched` and `transcript.truncated`, which now say it (`sessions/branching.py`);
    invariant 4: the mark moves with the branch, `updated_at` and the order do not."""

    def marks(client: httpx.Client, sid: str) -> tuple[Any, Any]:
        listed = {s["session_id"]: s for s in client.get("/api/sessions").json()["sessions"]}
        return session_body(client, sid)["last_run_state"], listed[sid]["last_run_state"]

    with openai_server.client() as client:
        sid = new_session(client)
        answered(client, fake, sid, "one", "A1")
        answer = session_body(client, sid)["messages"][1]
        fake.script(error(401, "bad key"))
        regenerated = client.post("/api/chat/regenerate", json={"session_id": sid})
        assert regenerated.status_code == 200, regenerated.text
        body = wait_idle(client, sid)
        assert body["messages"][1]["state"] == "error"
        assert marks(client, sid) == ("error", "error")
        updated_at = body["updated_at"]

        assert switch(client, sid, body["messages"][1]["id"], 1).status_code == 200
        assert marks(client, sid) == ("completed", "completed")
        assert switch(client, sid, answer["id"], 2).status_code == 200
        assert marks(client, sid) == ("error", "error")
        assert session_body(client, sid)["updated_at"] == updated_at  # not activity

        # An undo that hides the failed answer: the mark goes with it.
        undo = client.post("/api/session/truncate", json={"session_id": sid, "keep_count": 1})
        assert undo.status_code == 200, undo.text
        assert marks(client, sid) == (None, None)
        fake.script(reply(text("A1 again")))
        assert client.post("/api/chat/regenerate", json={"session_id": sid}).status_code == 200
        body = wait_idle(client, sid)
        assert marks(client, sid) == ("completed", "completed")
        assert switch(client, sid, body["messages"][1]["id"], 2).status_code == 200
        assert marks(client, sid) == ("error", "error")

        # A run a crash cut (settled by recovery: maintenance) never sets the mark, on its
        # branch either.
        fake.script(reply(text("partial"), hang()))
        start_turn(client, sid, "two")
        wait_until(lambda: "partial" in str(live_timeline(client, sid)), what="partial output")
    openai_server.stop(signal.SIGKILL)
    openai_server.start()
    with openai_server.client() as client:
        body = wait_idle(client, sid)
        assert body["messages"][-1]["state"] == "interrupted"
        assert marks(client, sid) == ("error", "error")
        assert switch(client, sid, body["messages"][1]["id"], 3).status_code == 200
        assert marks(client, sid) == ("completed", "completed")
        shown = switch(client, sid, session_body(client, sid)["messages"][1]["id"], 2)
        assert [m["content"] for m in shown.json()["session"]["messages"]][2:] == ["two", "partial"]
        assert marks(client, sid) == ("error", "error")
