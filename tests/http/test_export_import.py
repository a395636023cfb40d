"""Export and import of Tether's own form (docs/api.md §12), over real HTTP against real
servers and their SQLite files. Layers: the log (one transaction per import, events keep
their times), the sidebar row (invariant 4: an import is not activity) and the transcript
(the round trip folds to the same visible rows)."""

from __future__ import annotations

import base64
import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from markdown_it import MarkdownIt

from helpers import (
    ServerProcess,
    new_session,
    rotated_conversation,
    running_server,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

PICTURE = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def visible(session: dict[str, Any]) -> list[tuple]:
    """What a person sees of each row (ids and URLs name the session, so they differ)."""
    return [
        (
            m["role"],
            m["content"],
            m["created_at"],
            m.get("finished_at"),
            m.get("state"),
            [(a["name"], a["mime"], a["size"]) for a in m.get("attachments") or []],
            [(i["type"], i.get("text"), i.get("name")) for i in m.get("timeline") or []],
        )
        for m in session["messages"]
    ]


def unnamed(value: Any) -> Any:
    """`value` without the ids an import gives anew (attachments are their own per session)."""
    if isinstance(value, dict):
        return {k: unnamed(v) for k, v in value.items() if k != "attachment_id"}
    if isinstance(value, list):
        return [unnamed(v) for v in value]
    return value


ROW_FIELDS = ("title", "created_at", "updated_at", "last_message_at", "pinned", "message_count")


def row_of(client: httpx.Client, session_id: str) -> dict[str, Any]:
    rows = client.get("/api/sessions").json()["sessions"]
    rows += client.get("/api/sessions", params={"archived": 1}).json()["sessions"]
    return next(r for r in rows if r["session_id"] == session_id)


def imported(client: httpx.Client, body: bytes, status: int = 201, **params: str) -> dict:
    response = client.post("/api/sessions/import", content=body, params=params)
    assert response.status_code == status, response.text
    return response.json()


def event_count(server: ServerProcess) -> int:
    conn = sqlite3.connect(server.data_dir / "tether.db")
    try:
        return conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        conn.close()


def a_session_with_everything(client: httpx.Client) -> str:
    sid = new_session(client, "Plans <b>bold</b>")
    start_turn(
        client,
        sid,
        "look at this",
        attachments=[
            {
                "name": "dot.png",
                "mime": "image/png",
                "data_base64": base64.b64encode(PICTURE).decode(),
            },
            {"name": "notes.txt", "mime": "text/plain", "data_base64": "aGVsbG8K"},
        ],
    )
    wait_idle(client, sid)
    start_turn(client, sid, "and <script>alert(1)</script> this")
    wait_idle(client, sid)
    assert client.patch("/api/session", json={"session_id": sid, "pinned": True}).status_code == 200
    return sid


def test_a_json_export_imports_elsewhere_as_the_same_transcript_row_and_attachments(
    tmp_path: Path,
) -> None:
    with (
        running_server(tmp_path / "a") as source,
        running_server(tmp_path / "b") as target,
        source.client() as a,
    ):
        sid = a_session_with_everything(a)
        response = a.get(f"/api/sessions/{sid}/export", params={"format": "json"})
        assert response.status_code == 200
        assert response.headers["content-disposition"].startswith("attachment;")
        assert response.headers["content-type"].startswith("application/json")
        export = response.content
        assert json.loads(export)["format"] == "tether.session"
        original, original_row = session_body(a, sid), row_of(a, sid)

        with target.client() as b:
            body = imported(b, export)
            assert body["created"] == 1 and body["existing"] == 0
            copy_id = body["sessions"][0]["session_id"]
            copy = session_body(b, copy_id)
            assert visible(copy) == visible(original)
            for field in ROW_FIELDS:  # its own times: an import is not activity (inv. 4)
                assert row_of(b, copy_id)[field] == original_row[field], field
            files = [
                b.get(att["url"]).content
                for m in copy["messages"]
                for att in m.get("attachments", [])
            ]
            assert files == [PICTURE, b"hello\n"]
            context = b.get("/api/session/context", params={"session_id": copy_id}).json()
            original_context = a.get("/api/session/context", params={"session_id": sid}).json()
            assert unnamed(context["context_messages"]) == unnamed(
                original_context["context_messages"]
            )

        target.restart()
        with target.client() as b:
            assert visible(session_body(b, copy_id)) == visible(original)
            assert imported(b, export, status=200)["sessions"][0]["session_id"] == copy_id
            assert [r["session_id"] for r in b.get("/api/sessions").json()["sessions"]] == [copy_id]


def test_an_attachment_whose_bytes_are_gone_is_named_in_the_export_not_dropped(
    tmp_path: Path,
) -> None:
    """Layer: sessions/transfer (export and import). The bytes of one attachment removed
    behind the server's back: the JSON export still holds the others, names the lost one in
    `missing_attachments` (it left it out in silence, making a file its own import refused),
    and imports as a copy that refers to it, with no bytes either, and says so again."""
    with running_server(tmp_path / "data") as server, server.client() as client:
        sid = a_session_with_everything(client)
        [lost] = [
            p
            for p in (server.data_dir / "attachments").rglob("*")
            if p.is_file() and p.read_bytes() == b"hello\n"
        ]
        lost.unlink()
        export = json.loads(client.get(f"/api/sessions/{sid}/export").content)
        assert [a["name"] for a in export["attachments"]] == ["dot.png"]
        [missing] = export["missing_attachments"]
        assert {k: missing[k] for k in ("name", "mime", "size")} == {
            "name": "notes.txt",
            "mime": "text/plain",
            "size": 6,
        }
        body = imported(client, json.dumps(export).encode())
        copy_id = body["sessions"][0]["session_id"]
        [files] = [m["attachments"] for m in session_body(client, copy_id)["messages"][:1]]
        assert [f["name"] for f in files] == ["dot.png", "notes.txt"]
        assert client.get(files[0]["url"]).content == PICTURE
        assert client.get(files[1]["url"]).status_code == 404
        again = json.loads(client.get(f"/api/sessions/{copy_id}/export").content)
        assert [a["name"] for a in again["missing_attachments"]] == ["notes.txt"]
        all_lines = client.get("/api/export").text.splitlines()
        assert all(
            "notes.txt" in json.dumps(json.loads(line)["missing_attachments"]) for line in all_lines
        )


def test_importing_into_the_server_it_came_from_makes_one_copy_and_again_none(
    server: ServerProcess,
) -> None:
    with server.client() as client:
        sid = a_session_with_everything(client)
        export = client.get(f"/api/sessions/{sid}/export").content
        first = imported(client, export)["sessions"][0]
        assert first["session_id"] != sid
        events = event_count(server)
        again = imported(client, export, status=200)
        assert again == {
            "sessions": [first],
            "created": 0,
            "existing": 1,
            "skipped": {},
        }
        assert event_count(server) == events
        assert len(client.get("/api/sessions").json()["sessions"]) == 2
        # the copy is a session of its own: a new turn there leaves the original as it was
        before = visible(session_body(client, sid))
        start_turn(client, first["session_id"], "only in the copy")
        wait_idle(client, first["session_id"])
        assert visible(session_body(client, sid)) == before
        own = session_body(client, first["session_id"])["messages"][0]["attachments"][0]["url"]
        assert client.get(own).content == PICTURE


def test_a_run_exported_while_it_ran_imports_as_interrupted_without_looking_newer(
    server: ServerProcess,
) -> None:
    with server.client() as client:
        sid = new_session(client)
        start_turn(client, sid, "hello")
        wait_idle(client, sid)
        export = json.loads(client.get(f"/api/sessions/{sid}/export").content)
        # cut the log before its run.finished, as an export made mid-run holds it
        cut = next(i for i, e in enumerate(export["events"]) if e["type"] == "run.finished")
        export["events"] = export["events"][:cut]
        body = imported(client, json.dumps(export).encode())
        row = body["sessions"][0]
        copy = session_body(client, row["session_id"])
        assert copy["live"] is None and copy["messages"][-1]["state"] == "interrupted"
        submitted = next(e for e in export["events"] if e["type"] == "turn.submitted")
        assert row["updated_at"] == submitted["at"]  # the interruption is not activity
        assert row["activity_count"] == row["message_count"] - 1  # maintenance, not news


def test_export_all_streams_json_lines_that_import_every_session_once(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "a") as source,
        running_server(tmp_path / "b") as target,
        source.client() as a,
        target.client() as b,
    ):
        sids = [a_session_with_everything(a)]
        for n in range(2):
            sids.append(new_session(a, f"chat {n}"))
            start_turn(a, sids[-1], f"message {n}")
            wait_idle(a, sids[-1])
        response = a.get("/api/export")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        assert response.headers["content-disposition"].startswith("attachment;")
        lines = response.content.decode().splitlines()
        assert len(lines) == 3 and all(json.loads(line)["format"] for line in lines)

        body = imported(b, response.content)
        assert body["created"] == 3
        copies = {r["title"]: r["session_id"] for r in body["sessions"]}
        for sid in sids:
            title = row_of(a, sid)["title"]
            assert visible(session_body(b, copies[title])) == visible(session_body(a, sid))
        assert [r["title"] for r in b.get("/api/sessions").json()["sessions"]] == [
            r["title"] for r in a.get("/api/sessions").json()["sessions"]
        ]
        assert imported(b, response.content, status=200)["existing"] == 3
        assert len(b.get("/api/sessions").json()["sessions"]) == 3


def test_the_all_sessions_file_imports_when_messages_hold_unicode_line_breaks(
    server: ServerProcess,
) -> None:
    """The file's lines are split at newlines only: U+2028, U+2029 and U+0085 are line
    breaks to `str.splitlines` but plain characters inside a JSON string, and the export
    writes them as they are."""
    text = "one\u2028two\u2029three\u0085four"
    with server.client() as client:
        sid = new_session(client, "breaks")
        start_turn(client, sid, text)
        wait_idle(client, sid)
        new_session(client, "second")
        export = client.get("/api/export").content
        assert text.encode() in export and export.count(b"\n") == 2
        body = imported(client, export)
        assert body["created"] == 2
        copy = next(r["session_id"] for r in body["sessions"] if r["title"] == "breaks")
        assert visible(session_body(client, copy)) == visible(session_body(client, sid))


def test_markdown_export_is_the_visible_transcript_as_a_download(server: ServerProcess) -> None:
    with server.client() as client:
        sid = a_session_with_everything(client)
        response = client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/markdown")
        disposition = response.headers["content-disposition"]
        assert disposition.startswith('attachment; filename="Plans bbold')
        text = response.text
        assert text.startswith("# Plans &lt;b>bold&lt;/b>\n")  # shown as text, as on the page
        assert text.index("look at this") < text.index("and &lt;script>alert(1)&lt;/script> this")
        assert "- Attachment: dot.png" in text and text.count("## User") == 2
        assert text.count("## Assistant") == 2


def test_markdown_export_shows_html_mid_line_and_odd_tool_names_as_the_page_does(
    shared_server: ServerProcess,
) -> None:
    """Layer: sessions/transfer (Markdown export). HTML in the middle of a line was written
    raw, so a `<script>` or `<img onerror>` in a message was markup in a Markdown viewer
    (the page shows it as text), and a tool name with backticks broke out of its code span.
    Now both read as the page shows them; code spans, fences and autolinks stay as they are."""
    said = "and <script>alert(1)</script> this <img src=x onerror=alert(1)>"
    answer = "see `<b>` and <https://example.org> but <i>not this</i>"
    tool = "a`b``c"
    turn = {"turn_id": "u_1", "stream_id": "r_1", "text": said, "attachments": []}
    events = [
        ("session.created", {"title": "odd <b>names</b>"}),
        ("turn.submitted", {**turn, "submitted_at": 1_700_000_000.0}),
        ("tool.started", {"stream_id": "r_1", "call_id": "c1", "name": tool, "args": {}}),
        ("text.delta", {"stream_id": "r_1", "item_id": "t1", "text": answer}),
        ("run.finished", {"stream_id": "r_1", "turn_id": "u_1", "state": "completed"}),
    ]
    doc = {
        "format": "tether.session",
        "version": 1,
        "events": [
            {"seq": i, "type": t, "at": 1_700_000_000.0 + i, "data": d}
            | ({"stream_id": "r_1", "turn_id": "u_1"} if i > 1 else {})
            for i, (t, d) in enumerate(events, start=1)
        ],
    }
    with shared_server.client() as client:
        sid = imported(client, json.dumps(doc).encode())["sessions"][0]["session_id"]
        text = client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"}).text
    tokens = MarkdownIt("commonmark").parse(text)
    inline = [child for t in tokens if t.type == "inline" for child in t.children or []]
    assert not [t for t in inline if t.type == "html_inline"], text
    assert not [t for t in tokens if t.type == "html_block"], text
    shown = "".join(t.content for t in inline if t.type == "text")
    assert said in shown and "<i>not this</i>" in shown and "odd <b>names</b>" in shown
    codes = [t.content for t in inline if t.type == "code_inline"]
    assert codes == [tool, "<b>"], text  # the tool ran before the answer's text
    assert [t.attrs["href"] for t in inline if t.type == "link_open"] == ["https://example.org"]


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_exporting_an_unknown_session_is_404_and_a_bad_format_400(
    shared_server: ServerProcess, fmt: str
) -> None:
    with shared_server.client() as client:
        response = client.get("/api/sessions/s_nope/export", params={"format": fmt})
        assert response.status_code == 404 and response.json()["code"] == "session_not_found"
        sid = new_session(client)
        response = client.get(f"/api/sessions/{sid}/export", params={"format": "pdf"})
        assert response.status_code == 400 and response.json()["code"] == "invalid_request"


def test_import_progress_is_polled_by_the_id_the_client_gave(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        sid = new_session(client, "progress")
        export = client.get(f"/api/sessions/{sid}/export").content
        imported(client, export, import_id="my-import-1")
        progress = client.get("/api/imports/my-import-1").json()
        assert progress["phase"] == "done" and progress["done"] == progress["total"] == 1
        assert progress["created"] + progress["existing"] == 1
        missing = client.get("/api/imports/never-started")
        assert missing.status_code == 404 and missing.json()["code"] == "import_not_found"


def test_an_upload_cut_short_fails_its_import_and_writes_nothing(tmp_path: Path) -> None:
    """Layer: an import's job (docs/api.md §12, "Progress"). An upload that never arrives
    whole (the client gone halfway, a body streamed past --max-import-bytes) ends its job
    failed, with the code of why, instead of `reading` for ever; nothing of it is written."""
    with (
        running_server(tmp_path / "data", "--max-import-bytes", "100000") as server,
        server.client() as client,
    ):
        export = client.get(f"/api/sessions/{new_session(client, 'kept')}/export").content
        rows = client.get("/api/sessions").json()
        head = (
            "POST /api/sessions/import?import_id=cut HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(export)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", server.port)) as cut:
            cut.sendall(head.encode() + export[: len(export) // 2])
            wait_until(lambda: client.get("/api/imports/cut").status_code == 200, what="job")
        progress = wait_until(
            lambda: (p := client.get("/api/imports/cut").json())["phase"] != "reading" and p,
            what="the cut upload's job to end",
        )
        assert progress["phase"] == "failed", progress
        assert progress["error"]["code"] == "import_incomplete", progress

        def too_large() -> Iterator[bytes]:
            for _ in range(20):
                yield b" " * 10_000

        response = client.post(
            "/api/sessions/import", params={"import_id": "big"}, content=too_large()
        )
        assert response.status_code == 413 and response.json()["code"] == "payload_too_large"
        progress = client.get("/api/imports/big").json()
        assert progress["phase"] == "failed", progress
        assert progress["error"]["code"] == "payload_too_large", progress
        assert client.get("/api/sessions").json() == rows


def test_each_session_of_a_rotated_conversation_exports_and_imports_alone(
    tmp_path: Path,
) -> None:
    """A conversation that continued in a child (`--compression-mode rotate`) is two
    sessions; each one's own export imports. Its lineage points at a session the file does
    not hold, so the copy has none: the parent's copy is not rotated into a session that is
    not there (it takes new turns), the child's copy has no parent."""
    with rotated_conversation(tmp_path / "data") as (client, parent, child):
        copies = {}
        for sid in (parent, child):
            body = imported(client, client.get(f"/api/sessions/{sid}/export").content)
            copies[sid] = body["sessions"][0]["session_id"]
        parent_copy, child_copy = (session_body(client, copies[s]) for s in (parent, child))
        assert visible(parent_copy) == visible(session_body(client, parent))
        assert parent_copy["continuation_session_id"] is None
        assert child_copy["parent_session_id"] is None
        start_turn(client, copies[parent], "going on in the copy")
        wait_idle(client, copies[parent])


@pytest.mark.parametrize("first", ["child", "parent"])
def test_a_rotated_pair_imported_after_one_of_them_links_no_session_it_did_not_make(
    tmp_path: Path, first: str
) -> None:
    """A file holding a rotated parent and its child, imported after one of the two was
    imported alone: that one is found (idempotence), not made again, so the other's copy
    may not link to the copy this import planned for it and never made. The parent's copy
    pointed at that nonexistent continuation and refused every turn with 409
    `session_rotated`; a child's copy named a parent that does not exist."""
    with rotated_conversation(tmp_path / "data") as (client, parent, child):
        alone = parent if first == "parent" else child
        before = imported(client, client.get(f"/api/sessions/{alone}/export").content)
        every = client.get("/api/export").content.splitlines()
        pair = b"\n".join(s for s in every if json.loads(s)["session_id"] in (parent, child))
        body = imported(client, pair)
        assert (body["created"], body["existing"]) == (1, 1)
        copies = {row["session_id"] for row in body["sessions"]}
        assert before["sessions"][0]["session_id"] in copies
        for row in body["sessions"]:
            for link in (row["parent_session_id"], row["continuation_session_id"]):
                assert link is None or link in copies, (row, link)
        (made,) = copies - {before["sessions"][0]["session_id"]}
        start = client.post("/api/chat/start", json={"session_id": made, "message": "go on"})
        assert start.status_code == 200, start.text
        wait_idle(client, made)


def test_branches_round_trip_through_the_json_export(tmp_path: Path) -> None:
    """Edit and regenerate (docs/api.md §10) are events of the log, so the export carries
    them: the copy shows the same branch, hides the same rows, and switches like the
    original."""
    with (
        running_server(tmp_path / "a") as source,
        running_server(tmp_path / "b") as target,
        source.client() as a,
        target.client() as b,
    ):
        sid = new_session(a, "branches")
        start_turn(a, sid, "first question")
        wait_idle(a, sid)
        start_turn(a, sid, "second question")
        wait_idle(a, sid)
        assert a.post("/api/chat/regenerate", json={"session_id": sid}).status_code == 200
        wait_idle(a, sid)
        edited = session_body(a, sid)["messages"][2]["id"]
        start_turn(a, sid, "second question, edited", edit_of=edited)
        wait_idle(a, sid)
        original = session_body(a, sid)
        assert original["branches"] is not None

        body = imported(b, a.get(f"/api/sessions/{sid}/export").content)
        copy_id = body["sessions"][0]["session_id"]
        copy = session_body(b, copy_id)
        assert visible(copy) == visible(original)
        assert [m.get("branch") for m in copy["messages"]] == [
            m.get("branch") for m in original["messages"]
        ]
        assert visible({"messages": copy["branches"]["hidden"]}) == visible(
            {"messages": original["branches"]["hidden"]}
        )
        for client, session in ((a, original), (b, copy)):
            fork = session["messages"][2]["id"]
            switched = client.post(
                "/api/session/branch",
                json={"session_id": session["session_id"], "row_id": fork, "index": 1},
            )
            assert switched.status_code == 200, switched.text
        assert visible(session_body(b, copy_id)) == visible(session_body(a, sid))
        assert row_of(b, copy_id)["updated_at"] == row_of(a, sid)["updated_at"]
