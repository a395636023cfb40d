"""Layer: the log's attachment store and its owners (log/owners.py), over real HTTP against a
real server and its real SQLite file. Issue 11, point 3: an upload's name, type and session
are its own; the same bytes uploaded elsewhere share only the bytes, invisibly."""

from __future__ import annotations

import base64
import shutil
import sqlite3
from pathlib import Path

import httpx

from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle

SECRET = b"salary 2026: 123,456\n"
FIXTURE = Path(__file__).parent.parent / "log" / "fixtures" / "made-at-m002"


def upload(name: str, data: bytes = SECRET) -> dict:
    return {"name": name, "mime": "text/plain", "data_base64": base64.b64encode(data).decode()}


def sent_attachment(client: httpx.Client, session_id: str, name: str) -> dict:
    start_turn(client, session_id, f"keep {name}", attachments=[upload(name)])
    return wait_idle(client, session_id)["messages"][0]["attachments"][0]


def download_name(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["content-disposition"]


def every_value(db_path: Path) -> str:
    """Every row of every table of the database, as text, read from the file directly."""
    conn = sqlite3.connect(db_path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return "\n".join(
            repr(row) for table in tables for row in conn.execute(f'SELECT * FROM "{table}"')
        )
    finally:
        conn.close()


def test_same_bytes_in_two_sessions_keep_their_own_names_and_a_deleted_session_leaves_none(
    server: ServerProcess,
) -> None:
    with server.client() as client:
        alice, bob = new_session(client, "alice"), new_session(client, "bob")
        mine = sent_attachment(client, alice, "alice-salary-2026.txt")
        theirs = sent_attachment(client, bob, "bob-notes.txt")
        assert mine["id"] != theirs["id"]
        assert "blob" not in mine and SECRET not in str(session_body(client, bob)).encode()

        assert 'filename="alice-salary-2026.txt"' in download_name(client.get(mine["url"]))
        assert 'filename="bob-notes.txt"' in download_name(client.get(theirs["url"]))
        crossed = client.get(f"/api/attachments/{mine['id']}", params={"session_id": bob})
        assert crossed.status_code == 404 and crossed.json()["code"] == "attachment_not_found"

        assert client.delete("/api/session", params={"session_id": alice}).status_code == 200
        assert client.get(mine["url"]).status_code == 404
        assert client.get(f"/api/attachments/{mine['id']}").status_code == 404
        kept = client.get(theirs["url"])
        assert 'filename="bob-notes.txt"' in download_name(kept) and kept.content == SECRET

        stored = every_value(server.data_dir / "tether.db")
        assert "bob-notes.txt" in stored  # the query sees the database
        assert "alice-salary" not in stored and alice not in stored and mine["id"] not in stored
        files = [p for p in (server.data_dir / "attachments").rglob("*") if p.is_file()]
        assert [p.read_bytes() for p in files] == [SECRET]


def test_a_database_made_before_per_upload_names_keeps_each_sessions_own_name(
    tmp_path: Path,
) -> None:
    """The fixture was written by Tether at migration m002: sessions "alice" and "bob" sent the
    same bytes, as alice-salary-2026.txt and bob-notes.txt, and the shared file of names beside
    the bytes says alice-salary-2026.txt for both."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE, data)
    server = ServerProcess(data).start()
    try:
        with server.client() as client:
            rows = {
                r["title"]: r["session_id"] for r in client.get("/api/sessions").json()["sessions"]
            }
            alice, bob = rows["alice"], rows["bob"]
            mine = session_body(client, alice)["messages"][0]["attachments"][0]
            theirs = session_body(client, bob)["messages"][0]["attachments"][0]
            assert mine["id"] == theirs["id"]  # the old content-addressed id, still readable
            assert 'filename="alice-salary-2026.txt"' in download_name(client.get(mine["url"]))
            bobs = client.get(theirs["url"])
            assert 'filename="bob-notes.txt"' in download_name(bobs) and bobs.content == SECRET
            ambiguous = client.get(f"/api/attachments/{mine['id']}")
            assert ambiguous.status_code == 404  # two sessions hold it: say which

            client.delete("/api/session", params={"session_id": alice})
            assert 'filename="bob-notes.txt"' in download_name(client.get(theirs["url"]))
            assert client.get(mine["url"]).status_code == 404
            stored = every_value(data / "tether.db")
            assert "alice-salary" not in stored and alice not in stored
            assert "m003_attachment_owners" in stored
        assert not list((data / "attachments").rglob("*.json"))  # the shared names are gone
    finally:
        server.stop()
