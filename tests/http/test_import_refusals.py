"""A malformed or hostile import file (docs/api.md §12) is refused with the stable code
naming what is wrong, and nothing of it is written: the log (its SQLite file), the sidebar and
the attachment store are as they were. Over real HTTP against a real server."""

from __future__ import annotations

import base64
import copy
import io
import json
import sqlite3
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatgpt_kit import Conversation
from helpers import (
    ServerProcess,
    new_session,
    running_server,
    session_body,
    start_turn,
    wait_idle,
)


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict]]:
    """A server holding one session with an attachment, and that session's JSON export."""
    data = tmp_path_factory.mktemp("refusals") / "data"
    with running_server(data, "--max-import-bytes", "2000000") as server, server.client() as c:
        sid = new_session(c, "kept")
        upload = {"name": "a.txt", "mime": "text/plain", "data_base64": "aGVsbG8K"}
        start_turn(c, sid, "with a file", attachments=[upload])
        wait_idle(c, sid)
        export = json.loads(c.get(f"/api/sessions/{sid}/export").content)
        yield server, export


def slow_client(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=60)


def everything(server: ServerProcess) -> tuple:
    """The database's rows and the attachment files, read behind the server's back."""
    conn = sqlite3.connect(server.data_dir / "tether.db")
    try:
        events = conn.execute("SELECT COUNT(*), MAX(id) FROM events").fetchone()
        owners = conn.execute("SELECT COUNT(*) FROM attachments").fetchone()
        index = conn.execute("SELECT COUNT(*) FROM session_index").fetchone()
    finally:
        conn.close()
    files = sorted(p.name for p in (server.data_dir / "attachments").rglob("*") if p.is_file())
    return events, owners, index, files


def edited(change: Callable[[dict], Any]) -> Callable[[dict], bytes]:
    def make(export: dict) -> bytes:
        doc = copy.deepcopy(export)
        change(doc)
        return json.dumps(doc).encode()

    return make


def _nested(depth: int) -> bytes:
    return (
        b'{"format": "tether.session", "version": 1, "events": '
        + b"[" * depth
        + b"]" * depth
        + b"}"
    )


def _first(doc: dict, type_: str) -> dict:
    return next(e for e in doc["events"] if e["type"] == type_)


def _updated(doc: dict, **data: Any) -> None:
    """A `session.updated` at the end of the log."""
    last = doc["events"][-1]
    event = {"seq": last["seq"] + 1, "type": "session.updated", "at": last["at"], "data": data}
    doc["events"].append(event)


def _event(doc: dict, type_: str, data: dict, stream: str | None = None) -> None:
    """`type_` at the end of the log (on `stream`, whose turn is `data`'s)."""
    last = doc["events"][-1]
    event = {"seq": last["seq"] + 1, "type": type_, "at": last["at"], "data": data}
    if stream is not None:
        event.update(stream_id=stream, turn_id=data.get("turn_id"))
    doc["events"].append(event)


def _forked(doc: dict, **switch: Any) -> None:
    """The first message edited (a fork of two branches), then the first branch shown again
    by a `branch.switched` with `switch` over what the server would write."""
    _event(doc, "transcript.truncated", {"keep_count": 0, "transcript_generation": 1})
    turn = {"turn_id": "u_fork", "stream_id": "r_fork", "text": "edited", "attachments": []}
    turn["submitted_at"] = doc["events"][-1]["at"]
    _event(doc, "turn.submitted", turn, "r_fork")
    done = {"stream_id": "r_fork", "turn_id": "u_fork", "state": "completed"}
    _event(doc, "run.finished", done, "r_fork")
    first = _first(doc, "turn.submitted")["data"]["turn_id"]
    shown = {"row_id": first, "index": 1, "message_count": 2, "transcript_generation": 2}
    _event(doc, "branch.switched", {**shown, **switch})


def _chatgpt_with_a_bad_node() -> bytes:
    conversation = Conversation("x", 1_700_000_000)
    node = conversation.add("user", "hi")
    conversation.mapping[node]["message"]["content"] = "not an object"
    return json.dumps([conversation.data]).encode()


def _chatgpt_with_a_cycle() -> bytes:
    conversation = Conversation("x", 1_700_000_000)
    a = conversation.add("user", "a")
    b = conversation.add("assistant", "b")
    conversation.mapping[a]["parent"] = b
    return json.dumps([conversation.data]).encode()


def _chatgpt_with_children_not_a_list() -> bytes:
    """Without `current_node` the branch shown is found by walking `children`."""
    conversation = Conversation("x", 1_700_000_000)
    conversation.add("user", "hi")
    conversation.mapping[conversation.root]["children"] = 5
    del conversation.data["current_node"]
    return json.dumps([conversation.data]).encode()


def _zipped(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr(name, data)
    return out.getvalue()


def _chatgpt_saying(text: str) -> bytes:
    conversation = Conversation("x", 1_700_000_000)
    conversation.add("user", text)
    return json.dumps([conversation.data]).encode()


FUTURE = 4_102_444_800.0  # 2100-01-01


def _chatgpt_at(conversation_time: float, message_time: float) -> bytes:
    conversation = Conversation("x", conversation_time)
    node = conversation.add("user", "hi")
    conversation.mapping[node]["message"]["create_time"] = message_time
    return json.dumps([conversation.data]).encode()


def _lines_with_a_bad_third(export: dict) -> bytes:
    good = json.dumps(export)
    return "\n".join([good, good.replace('"kept"', '"other"'), "{not json"]).encode()


def _all_sessions_with_a_bad_third(export: dict) -> bytes:
    second = copy.deepcopy(export)
    second["events"][0]["data"]["title"] = "second"
    third = copy.deepcopy(export)
    third["events"][1]["at"] = "yesterday"
    return "\n".join(json.dumps(e) for e in (export, second, third)).encode()


GEN = {"transcript_generation": 1}  # what the first truncate of a log carries

CASES: list[tuple[str, Callable[[dict], bytes], int, str, str]] = [
    ("not json", lambda e: b"<html>nope", 400, "import_not_json", "not JSON"),
    ("not utf-8", lambda e: b'{"a": "\xff"}', 400, "import_not_json", "UTF-8"),
    ("empty body", lambda e: b"", 400, "import_not_json", "not JSON"),
    ("something else", lambda e: b'{"hello": 1}', 400, "import_unknown_format", "neither"),
    ("a list of numbers", lambda e: b"[1, 2]", 400, "import_unknown_format", "neither"),
    (
        "a newer version",
        edited(lambda d: d.update(version=99)),
        400,
        "import_unsupported_version",
        "version 99",
    ),
    (
        "a version before the first",
        edited(lambda d: d.update(version=0)),
        400,
        "import_unsupported_version",
        "version 0",
    ),
    (
        "a time that is text",
        edited(lambda d: d["events"][1].update(at="yesterday")),
        400,
        "import_invalid",
        "events[1].at",
    ),
    (
        "a message that is a number",
        edited(lambda d: _first(d, "turn.submitted")["data"].update(text=12)),
        400,
        "import_invalid",
        ".data.text",
    ),
    (
        "a gap in the seqs",
        edited(lambda d: d["events"][2].update(seq=7)),
        400,
        "import_invalid",
        "events[2].seq",
    ),
    (
        "an unknown event",
        edited(lambda d: d["events"][2].update(type="evil.thing")),
        400,
        "import_invalid",
        "not a Tether event",
    ),
    (
        "an event its type's definition does not describe",
        edited(lambda d: _first(d, "text.delta").update(type="tool.completed")),
        400,
        "import_invalid",
        "validation errors for ToolCompleted",
    ),
    (
        "a title with a control character",
        edited(lambda d: d["events"][0]["data"].update(title="bad\x00title")),
        400,
        "import_invalid",
        "data.title",
    ),
    (
        "a system prompt longer than a session's may be",
        edited(lambda d: _updated(d, system_prompt="x" * 20_001)),
        400,
        "import_invalid",
        "data.system_prompt",
    ),
    (
        "a model id longer than one may be",
        edited(lambda d: _updated(d, model="m" * 201)),
        400,
        "import_invalid",
        "data.model",
    ),
    (
        "an empty model id",
        edited(lambda d: _updated(d, model=" ")),
        400,
        "import_invalid",
        "data.model",
    ),
    (
        "bad base64",
        edited(lambda d: d["attachments"][0].update(data_base64="@@not base64@@")),
        400,
        "import_bad_base64",
        "attachments[0].data_base64",
    ),
    (
        "a size the bytes do not have",
        edited(lambda d: d["attachments"][0].update(size=5000)),
        400,
        "import_invalid",
        "attachments[0].size",
    ),
    (
        "a reference to bytes it does not carry",
        edited(lambda d: d.update(attachments=[])),
        400,
        "import_invalid",
        "does not hold",
    ),
    (
        "a reference whose size is not its bytes'",
        edited(lambda d: _first(d, "turn.submitted")["data"]["attachments"][0].update(size=999)),
        400,
        "import_invalid",
        "data.attachments[0].size",
    ),
    (
        "a reference whose name is a path",
        edited(lambda d: _first(d, "turn.submitted")["data"]["attachments"][0].update(name="a/b")),
        400,
        "import_invalid",
        "data.attachments[0].name",
    ),
    (
        "an attachment no event refers to",
        edited(
            lambda d: d["attachments"].append(
                {**d["attachments"][0], "id": "a_stray", "data_base64": "c3RyYXkK"}
            )
        ),
        400,
        "import_invalid",
        "attachments[1].id",
    ),
    (
        "a missing attachment no event refers to",
        edited(
            lambda d: d.update(
                missing_attachments=[{"id": "a_gone", "name": "x", "mime": "", "size": 1}]
            )
        ),
        400,
        "import_invalid",
        "missing_attachments[0].id",
    ),
    (
        "a path as a file name",
        edited(lambda d: d["attachments"][0].update(name="../../etc/passwd")),
        400,
        "import_invalid",
        "plain file name",
    ),
    (
        "a path behind invisible characters as a file name",
        edited(lambda d: d["attachments"][0].update(name="\u202e..\u200b/etc")),
        400,
        "import_invalid",
        "plain file name",
    ),
    (
        "an over-long file name",
        edited(lambda d: d["attachments"][0].update(name="x" * 256)),
        400,
        "import_invalid",
        "attachments[0].name",
    ),
    (
        "an over-long name of a missing attachment",
        edited(
            lambda d: d.update(
                missing_attachments=[{"id": "a_gone", "name": "x" * 256, "mime": "", "size": 1}]
            )
        ),
        400,
        "import_invalid",
        "missing_attachments[0].name",
    ),
    (
        "a truncate keeping more messages than are shown",
        edited(lambda d: _event(d, "transcript.truncated", {"keep_count": 99, **GEN})),
        400,
        "import_invalid",
        "data.keep_count",
    ),
    (
        "a truncate keeping a negative count",
        edited(lambda d: _event(d, "transcript.truncated", {"keep_count": -1, **GEN})),
        400,
        "import_invalid",
        "data.keep_count",
    ),
    (
        "a transcript generation that does not follow the one before",
        edited(
            lambda d: _event(
                d, "transcript.truncated", {"keep_count": 0, "transcript_generation": -7}
            )
        ),
        400,
        "import_invalid",
        "data.transcript_generation",
    ),
    (
        "a branch switch with a message count it does not show",
        edited(lambda d: _forked(d, message_count=1000)),
        400,
        "import_invalid",
        "data.message_count",
    ),
    (
        "a run that finishes twice",
        edited(lambda d: _event(d, "run.finished", dict(_first(d, "run.finished")["data"]))),
        400,
        "import_invalid",
        "shows 2",
    ),
    (
        "a run finished that never started",
        edited(
            lambda d: _event(
                d, "run.finished", {"stream_id": "r_x", "turn_id": None, "state": "error"}, "r_x"
            )
        ),
        400,
        "import_invalid",
        "shows 2",
    ),
    (
        "a negative token count",
        edited(
            lambda d: _first(d, "run.finished")["data"].update(
                usage={"prompt_tokens": -5000, "completion_tokens": 10}
            )
        ),
        400,
        "import_invalid",
        "data.usage.prompt_tokens",
    ),
    (
        "a time in the future",
        edited(lambda d: d["events"][1].update(at=FUTURE)),
        400,
        "import_invalid",
        "events[1].at: is 4.10244e+09 (2100-01-01 00:00 UTC), later than this server's clock",
    ),
    (
        "an absurd time",
        edited(lambda d: d["events"][-1].update(at=1e300)),
        400,
        "import_invalid",
        "after the year 9999",
    ),
    (
        "a message submitted in the future",
        edited(lambda d: _first(d, "turn.submitted")["data"].update(submitted_at=FUTURE)),
        400,
        "import_invalid",
        ".data.submitted_at",
    ),
    (
        "a row time inherited from the future",
        edited(lambda d: d["events"][0]["data"].update(inherited_updated_at=FUTURE)),
        400,
        "import_invalid",
        "events[0].data: is 4.10244e+09",
    ),
    (
        "a ChatGPT conversation created in the future",
        lambda e: _chatgpt_at(FUTURE, 1_700_000_000),
        400,
        "import_invalid",
        "[0].create_time",
    ),
    (
        "ChatGPT's data export as it is downloaded, a zip archive",
        lambda e: _zipped("conversations.json", b"[]"),
        400,
        "import_not_json",
        "a zip archive: import the conversations.json inside it",
    ),
    (
        "the chat.html beside conversations.json",
        lambda e: b"<!DOCTYPE html>\n<html><head><title>ChatGPT Data Export</title></head></html>",
        400,
        "import_not_json",
        "an HTML page, not JSON",
    ),
    (
        "half a UTF-16 pair in a message",
        edited(lambda d: _first(d, "turn.submitted")["data"].update(text="cut \ud83d here")),
        400,
        "import_invalid",
        "events[1].data.text: holds half a UTF-16 pair",
    ),
    (
        "half a UTF-16 pair in a ChatGPT message",
        lambda e: _chatgpt_saying("cut \ud83d here"),
        400,
        "import_invalid",
        ".message.content.parts: holds half a UTF-16 pair",
    ),
    (
        "a session id that is not text",
        edited(lambda d: d.update(session_id=5)),
        400,
        "import_invalid",
        "session_id: Input should be a valid string",
    ),
    (
        "a ChatGPT time too large for a float",
        lambda e: _chatgpt_at(1_700_000_000, 1_700_000_000).replace(b"1700000000", b"1" * 400, 1),
        400,
        "import_invalid",
        "[0].create_time: is 1.79769e+308 (after the year 9999)",
    ),
    (
        "a ChatGPT time JSON reads as infinity",
        lambda e: _chatgpt_at(1_700_000_000, 1_700_000_000).replace(b"1700000000", b"1e400", 1),
        400,
        "import_invalid",
        "[0].create_time: is 1.79769e+308 (after the year 9999)",
    ),
    (
        "a ChatGPT message created in the future",
        lambda e: _chatgpt_at(1_700_000_000, FUTURE),
        400,
        "import_invalid",
        ".message.create_time",
    ),
    ("nested 100,000 deep", lambda e: _nested(100_000), 400, "import_too_deep", "deeper"),
    ("nested 200 deep", lambda e: _nested(200), 400, "import_too_deep", "deeper"),
    ("over the size limit", lambda e: b" " * 2_000_001, 413, "payload_too_large", "larger"),
    (
        "a ChatGPT node of the wrong type",
        lambda e: _chatgpt_with_a_bad_node(),
        400,
        "import_invalid",
        "message.content",
    ),
    (
        "a ChatGPT tree with a cycle",
        lambda e: _chatgpt_with_a_cycle(),
        400,
        "import_invalid",
        "own ancestor",
    ),
    (
        "ChatGPT children that are not a list",
        lambda e: _chatgpt_with_children_not_a_list(),
        400,
        "import_invalid",
        "children",
    ),
    ("JSON lines, line 3 broken", _lines_with_a_bad_third, 400, "import_not_json", "Line 3"),
    (
        "all sessions, the third wrong",
        _all_sessions_with_a_bad_third,
        400,
        "import_invalid",
        "line 3",
    ),
]


@pytest.mark.parametrize(
    ("name", "make", "status", "code", "says"), CASES, ids=[c[0] for c in CASES]
)
def test_a_bad_file_is_refused_naming_what_is_wrong_and_nothing_is_written(
    refusing: tuple[ServerProcess, dict],
    name: str,
    make: Callable[[dict], bytes],
    status: int,
    code: str,
    says: str,
) -> None:
    server, export = refusing
    before = everything(server)
    with slow_client(server) as client:
        rows = client.get("/api/sessions").json()
        response = client.post("/api/sessions/import", content=make(export))
        assert response.status_code == status, response.text
        body = response.json()
        assert body["code"] == code, body
        assert says in body["message"], body
        assert client.get("/api/sessions").json() == rows
    assert everything(server) == before


def test_the_unchanged_export_does_import(refusing: tuple[ServerProcess, dict]) -> None:
    """The cases above fail for what they change, not for the file they start from."""
    server, export = refusing
    with slow_client(server) as client:
        response = client.post("/api/sessions/import", content=json.dumps(export).encode())
        assert response.status_code == 201, response.text


def test_times_up_to_now_import_unchanged_and_none_sorts_in_the_future(
    refusing: tuple[ServerProcess, dict],
) -> None:
    """Layer: sessions' sidebar row; invariant 4 (an import is not activity): events keep
    their own times, up to the clock skew another server may have (a minute ahead here), so
    the row sorts where its history puts it; the refusals above keep any later time out.
    ChatGPT's `update_time` is not read (the row's times are its messages'), so even one
    far in the future leaves the row at its last message."""
    server, export = refusing
    doc = copy.deepcopy(export)
    ahead = time.time() + 60
    doc["events"][-1]["at"] = ahead
    conversation = Conversation("updated later", 1_700_000_000)
    conversation.add("user", "hi")
    conversation.data["update_time"] = FUTURE
    with slow_client(server) as client:
        response = client.post("/api/sessions/import", content=json.dumps(doc).encode())
        assert response.status_code == 201, response.text
        [row] = response.json()["sessions"]
        again = json.loads(client.get(f"/api/sessions/{row['session_id']}/export").content)
        assert [e["at"] for e in again["events"]] == [e["at"] for e in doc["events"]]
        assert row["created_at"] == doc["events"][0]["at"]
        body = json.dumps([conversation.data]).encode()
        response = client.post("/api/sessions/import", content=body)
        assert response.status_code == 201, response.text
        [chatgpt] = response.json()["sessions"]
        assert chatgpt["updated_at"] == 1_700_000_010.0 < time.time()


def test_a_fork_and_a_switch_as_the_server_writes_them_do_import(
    refusing: tuple[ServerProcess, dict],
) -> None:
    """The counts checked above are the ones the server writes: such a file imports, and its
    row counts what its transcript shows."""
    server, export = refusing
    doc = copy.deepcopy(export)
    _forked(doc)
    with slow_client(server) as client:
        response = client.post("/api/sessions/import", content=json.dumps(doc).encode())
        assert response.status_code == 201, response.text
        [row] = response.json()["sessions"]
        body = session_body(client, row["session_id"])
        assert row["message_count"] == len(body["messages"]) == 2
        assert row["transcript_generation"] == 2
        assert body["messages"][0]["branch"] == {"index": 1, "count": 2}


def test_a_stored_attachment_is_released_when_its_import_is_refused(tmp_path: Path) -> None:
    """An import whose bytes are new and whose events are refused by the log (a JSON value it
    cannot store) leaves no file behind: the bytes are stored first, then released."""
    with running_server(tmp_path / "data") as server, slow_client(server) as client:
        sid = new_session(client, "x")
        upload = {"name": "b.txt", "mime": "text/plain", "data_base64": "Ynl0ZXMK"}
        start_turn(client, sid, "f", attachments=[upload])
        wait_idle(client, sid)
        export = json.loads(client.get(f"/api/sessions/{sid}/export").content)
        client.delete("/api/session", params={"session_id": sid})
        assert everything(server)[3] == []
        fresh = base64.b64encode(b"never stored\n").decode()
        export["attachments"][0].update(data_base64=fresh, size=13)
        turn = _first(export, "turn.submitted")["data"]
        turn["attachments"][0].update(size=13)
        # JSON can say it, UTF-8 cannot store it; in an event's data the check refuses it
        # before anything is stored, in the id the copy keeps as its origin only the log does
        export["session_id"] = "s_lone \ud800"
        response = client.post(
            "/api/sessions/import", content=json.dumps(export).encode("utf-8", "surrogatepass")
        )
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "import_invalid"
        assert "cannot store" in response.json()["message"]  # refused by the log, not before
        assert everything(server)[3] == [] and client.get("/api/sessions").json()["sessions"] == []
