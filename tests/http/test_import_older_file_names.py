"""A session whose log holds attachment names recorded before names were cleaned at intake
(`tests/older_log_kit.py`) exports as Tether JSON with those names raw, and that file imports
back (docs/api.md §12): the copy holds each name as the download and the Markdown export show
it (`shown_file_name`: visible text, `attachment` when nothing shows), in its upload records
and in every event that names the file, so it shows the same visible transcript. Layer:
sessions/transfer (import); the contract's import rules: all or nothing, and a round trip of
Tether's JSON gives the same visible transcript. Real server, real HTTP, real SQLite."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.visible_text import shown_file_name

from helpers import new_session, running_server, session_body, start_turn, wait_idle
from older_log_kit import upload_again_as_an_older_tether

pytestmark = pytest.mark.slow

RAW = {
    "notes.txt": "invoice\u202egnp\u200b.exe\x07",
    "blank.txt": "\u200b\u202e",  # nothing left once cleaned
    "space.txt": " \t ",  # nor here
}
SHOWN = {"notes.txt": "invoicegnp.exe", "blank.txt": "attachment", "space.txt": "attachment"}


def _file(name: str, data: bytes) -> dict[str, str]:
    return {"name": name, "mime": "text/plain", "data_base64": base64.b64encode(data).decode()}


def visible(session: dict[str, Any]) -> list[tuple]:
    """What a person sees of each row, a file by the name it is shown and saved under."""
    return [
        (
            m["role"],
            m["content"],
            m["created_at"],
            m.get("state"),
            [(shown_file_name(a["name"]), a["mime"], a["size"]) for a in m.get("attachments", [])],
        )
        for m in session["messages"]
    ]


def downloads(client: httpx.Client, session: dict[str, Any]) -> list[tuple[str, bytes]]:
    return [
        (response.headers["content-disposition"], response.content)
        for m in session["messages"]
        for a in m.get("attachments", [])
        for response in [client.get(a["url"])]
    ]


def imported(client: httpx.Client, doc: dict[str, Any]) -> str:
    response = client.post("/api/sessions/import", content=json.dumps(doc).encode())
    assert response.status_code == 201, response.text
    return response.json()["sessions"][0]["session_id"]


def test_an_export_of_names_an_older_log_holds_imports_back_as_shown(tmp_path: Path) -> None:
    """`\\u200b\\u202e` was refused, 400 `import_invalid` "is not a plain file name", so a
    user's own export of their own session could not be imported back."""
    data = tmp_path / "data"
    with running_server(data) as server, server.client() as client:
        sid = new_session(client, "older names")
        files = [_file(name, name.encode()) for name in RAW]
        start_turn(client, sid, "first", attachments=files)
        refs = wait_idle(client, sid)["messages"][0]["attachments"]
    upload_again_as_an_older_tether(data, sid, refs, RAW)

    with running_server(data) as server, server.client() as client:
        original = session_body(client, sid)
        export = client.get(f"/api/sessions/{sid}/export").json()
        old = [a["name"] for a in original["messages"][2]["attachments"]]
        assert old == list(RAW.values())  # the log is as it was, and so is its export
        assert [a["name"] for a in export["attachments"]][3:] == list(RAW.values())

        copy_id = imported(client, export)
        copy = session_body(client, copy_id)
        assert visible(copy) == visible(original)
        names = [a["name"] for a in copy["messages"][2]["attachments"]]
        assert names == list(SHOWN.values())  # held as shown, not only drawn so
        assert downloads(client, copy) == downloads(client, original)
        markdown = [
            client.get(f"/api/sessions/{s}/export", params={"format": "markdown"}).text
            for s in (sid, copy_id)
        ]
        assert markdown[0] == markdown[1]
        again = client.get(f"/api/sessions/{copy_id}/export").json()
        in_events = [
            a["name"]
            for e in again["events"]
            if e["type"] == "turn.submitted"
            for a in e["data"]["attachments"]
        ]
        assert in_events[3:] == [a["name"] for a in again["attachments"]][3:] == names

        # the bytes of the older uploads gone too: named in `missing_attachments`, as shown
        gone = export["attachments"][3:]
        lost = {
            **export,
            "attachments": export["attachments"][:3],
            "missing_attachments": [
                {k: a[k] for k in ("id", "name", "mime", "size")} for a in gone
            ],
        }
        lost_id = imported(client, lost)
        lost_copy = session_body(client, lost_id)
        assert visible(lost_copy) == visible(original)
        assert [a["name"] for a in lost_copy["messages"][2]["attachments"]] == names
        again = client.get(f"/api/sessions/{lost_id}/export").json()
        assert [a["name"] for a in again["missing_attachments"]] == names
