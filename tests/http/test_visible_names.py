"""One-line names are visible text wherever they enter (docs/api.md §3, docs/security.md,
"Titles and names"): a session named by its first message, a title or a file name an import
brings, a file name a turn uploads, and a log written before names were cleaned are all
shown without bidi controls, zero-width or control characters, while Arabic, Hebrew, CJK
and emoji sequences come through unchanged. Layer: the sidebar row fold (its title) and the
session commands and imports that write names; contract invariant 5 (the title is folded
from the log's events, the same on every replay and rebuild). Real server, real HTTP, real
SQLite."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from names_kit import LEGITIMATE

from chatgpt_kit import Conversation
from helpers import ServerProcess, new_session, running_server, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow

HOSTILE = "\u202eevil\u200b \u2066title\u2069\u00ad here"
HOSTILE_SHOWN = "evil title here"
SPOOFED_FILE = "invoice\u202egnp.exe"
SPOOFED_FILE_SHOWN = "invoicegnp.exe"
NOT_SHOWN = set("\u202e\u200b\u2066\u2069\x07\u00ad")
AT = 1_700_000_000.0


def row_of(client: httpx.Client, sid: str) -> dict[str, Any]:
    return next(r for r in client.get("/api/sessions").json()["sessions"] if r["session_id"] == sid)


def named_by(client: httpx.Client, message: str) -> str:
    sid = new_session(client)
    start_turn(client, sid, message)
    wait_idle(client, sid)
    return sid


def text_file(name: str) -> dict[str, str]:
    return {"name": name, "mime": "text/plain", "data_base64": base64.b64encode(b"hi").decode()}


def test_a_title_named_by_the_first_message_is_visible_text(shared_server: ServerProcess) -> None:
    """The message keeps every character it was sent with (it is content); the sidebar's
    name for it does not, in the list, the session body and search."""
    with shared_server.client() as client:
        sid = named_by(client, f"{HOSTILE}\x07\nsecond line")
        assert row_of(client, sid)["title"] == HOSTILE_SHOWN
        body = session_body(client, sid)
        assert body["title"] == HOSTILE_SHOWN
        assert body["messages"][0]["content"] == f"{HOSTILE}\x07\nsecond line"
        found = client.get("/api/search", params={"q": "second line"}).json()["results"]
        assert {r["title"] for r in found if r["session_id"] == sid} == {HOSTILE_SHOWN}
        # a first line of nothing visible names nothing: the next line does
        sid = named_by(client, "\u200b\u202e\u2800\nthe real first line")
        assert row_of(client, sid)["title"] == "the real first line"


@pytest.mark.parametrize("kind", sorted(LEGITIMATE))
def test_legitimate_text_names_a_session_unchanged(shared_server: ServerProcess, kind: str) -> None:
    with shared_server.client() as client:
        sid = named_by(client, LEGITIMATE[kind])
        assert row_of(client, sid)["title"] == LEGITIMATE[kind]


def test_a_file_name_is_visible_text_where_it_is_taken_and_in_the_export(
    shared_server: ServerProcess,
) -> None:
    """`invoice\\u202egnp.exe` would show as `invoiceexe.png`: the server keeps the name it
    shows, for the transcript, a files-only first message's title, the download and the
    Markdown export; a name of nothing visible is refused like a name with a path."""
    with shared_server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "", attachments=[text_file(SPOOFED_FILE)])
        body = wait_idle(client, sid)
        attachment = body["messages"][0]["attachments"][0]
        assert attachment["name"] == SPOOFED_FILE_SHOWN
        assert body["title"] == SPOOFED_FILE_SHOWN
        download = client.get(attachment["url"])
        assert download.status_code == 200
        assert SPOOFED_FILE_SHOWN in download.headers["content-disposition"]
        markdown = client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"}).text
        assert f"Attachment: {SPOOFED_FILE_SHOWN}" in markdown
        assert not NOT_SHOWN & set(markdown)

        refused = client.post(
            "/api/chat/start",
            json={"session_id": sid, "message": "x", "attachments": [text_file("\u200b\u202e")]},
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "invalid_request"
        assert len(session_body(client, sid)["messages"]) == 2  # nothing was written


def _tether_file(title: str, renamed: str, file_name: str) -> bytes:
    turn = {
        "turn_id": "u_1",
        "stream_id": "r_1",
        "text": "",
        "attachments": [{"id": "a_1", "name": file_name, "mime": "text/plain", "size": 2}],
        "submitted_at": AT,
    }
    events = [
        ("session.created", {"title": title}, None),
        ("session.updated", {"title": renamed}, None),
        ("turn.submitted", turn, "r_1"),
        ("run.finished", {"stream_id": "r_1", "turn_id": "u_1", "state": "completed"}, "r_1"),
    ]
    out = []
    for seq, (type_, data, stream) in enumerate(events, start=1):
        event: dict[str, Any] = {"seq": seq, "type": type_, "at": AT + seq, "data": data}
        if stream is not None:
            event.update(stream_id=stream, turn_id="u_1")
        out.append(event)
    attachment = {
        "id": "a_1",
        "name": file_name,
        "mime": "text/plain",
        "size": 2,
        "data_base64": base64.b64encode(b"hi").decode(),
    }
    doc = {"format": "tether.session", "version": 1, "events": out, "attachments": [attachment]}
    return json.dumps(doc).encode()


def imported(client: httpx.Client, body: bytes) -> str:
    response = client.post("/api/sessions/import", content=body)
    assert response.status_code == 201, response.text
    return response.json()["sessions"][0]["session_id"]


def test_an_imported_tether_file_holds_its_titles_and_file_names_cleaned(
    shared_server: ServerProcess,
) -> None:
    """Cleaned in the copy's log itself, not only in the row: its own export says the same."""
    with shared_server.client() as client:
        sid = imported(client, _tether_file("\u202efirst\u200b", HOSTILE, SPOOFED_FILE))
        assert row_of(client, sid)["title"] == HOSTILE_SHOWN
        body = session_body(client, sid)
        assert body["messages"][0]["attachments"][0]["name"] == SPOOFED_FILE_SHOWN
        exported = client.get(f"/api/sessions/{sid}/export").json()
        titles = [e["data"]["title"] for e in exported["events"] if "title" in e["data"]]
        assert titles == ["first", HOSTILE_SHOWN]
        assert [a["name"] for a in exported["attachments"]] == [SPOOFED_FILE_SHOWN]
        for kind in sorted(LEGITIMATE):
            sid = imported(client, _tether_file("x", LEGITIMATE[kind], f"{LEGITIMATE[kind]}.txt"))
            assert row_of(client, sid)["title"] == LEGITIMATE[kind], kind
            name = session_body(client, sid)["messages"][0]["attachments"][0]["name"]
            assert name == f"{LEGITIMATE[kind]}.txt", kind


def test_a_chatgpt_title_is_visible_text(shared_server: ServerProcess) -> None:
    hostile = Conversation(HOSTILE, AT, "conv-hostile")
    hostile.add("user", "hello")
    family = Conversation(LEGITIMATE["family emoji (ZWJ)"], AT, "conv-family")
    family.add("user", "hello")
    with shared_server.client() as client:
        response = client.post(
            "/api/sessions/import", content=json.dumps([hostile.data, family.data]).encode()
        )
        assert response.status_code == 201, response.text
        titles = [row_of(client, s["session_id"])["title"] for s in response.json()["sessions"]]
    assert titles == [HOSTILE_SHOWN, LEGITIMATE["family emoji (ZWJ)"]]


def test_titles_a_database_from_before_the_cleaning_holds_are_shown_cleaned(
    tmp_path: Path,
) -> None:
    """A data directory an older Tether wrote: its log holds a title with a bidi override
    (titles were stored as given) and its persisted sidebar rows the raw first-message name,
    under the older fold's version. At the next start the rows are folded again from the
    log, and every title is shown cleaned (the log itself is never rewritten)."""
    data = tmp_path / "data"
    with running_server(data) as server, server.client() as client:
        named = named_by(client, HOSTILE)
        given = new_session(client, "placeholder")
    db = sqlite3.connect(data / "tether.db")
    with db:
        db.execute(
            "UPDATE events SET data = json_set(data, '$.title', ?) "
            "WHERE session_id = ? AND type = 'session.created'",
            (f"{HOSTILE}!", given),
        )
        for sid, key, raw in ((named, "title_from_message", HOSTILE), (given, "title", HOSTILE)):
            (state,) = db.execute(
                "SELECT state FROM session_index WHERE session_id = ?", (sid,)
            ).fetchone()
            db.execute(
                "UPDATE session_index SET state = ? WHERE session_id = ?",
                (json.dumps({**json.loads(state), key: raw}), sid),
            )
        db.execute("UPDATE meta SET value = 'sidebar-10' WHERE key = 'index_version'")
    db.close()
    with running_server(data) as server, server.client() as client:
        assert row_of(client, named)["title"] == HOSTILE_SHOWN
        assert row_of(client, given)["title"] == f"{HOSTILE_SHOWN}!"
        markdown = client.get(f"/api/sessions/{given}/export", params={"format": "markdown"})
        assert markdown.text.startswith(f"# {HOSTILE_SHOWN}!\n")
