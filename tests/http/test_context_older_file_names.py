"""The model gets an attachment under the name the page shows (contract invariant 1: what the
user sees is what the model gets). A log written before names were cleaned at intake holds
them raw (`tests/older_log_kit.py`); the page shows each as `shown_file_name` does (visible
text, `attachment` when nothing shows), and so do `GET /api/session/context` and the request
the next turn sends the model. Layer: projections/context and runs/worker (the turn's
input). Real server, real HTTP, real SQLite; the model is the suite's fake over HTTP."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text
from helpers import new_session, running_server, session_body, start_turn, wait_idle
from older_log_kit import upload_again_as_an_older_tether

pytestmark = pytest.mark.slow

RAW = {"notes.txt": "invoice\u202egnp\u200b.exe\x07", "blank.txt": "\u200b\u202e"}
SHOWN = {"notes.txt": "invoicegnp.exe", "blank.txt": "attachment"}


def _file(name: str, data: bytes) -> dict[str, str]:
    return {"name": name, "mime": "text/plain", "data_base64": base64.b64encode(data).decode()}


def test_the_model_gets_an_older_logs_file_names_as_the_page_shows_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with FakeOpenAI(model="fake-model") as fake:
        flags = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
        fake.default_reply = reply(text("seen"))
        with (
            running_server(data_dir, *flags) as server,
            httpx.Client(base_url=server.base_url, timeout=20) as client,
        ):
            sid = new_session(client)
            files = [_file("notes.txt", b"first file"), _file("blank.txt", b"second file")]
            start_turn(client, sid, "two files", attachments=files)
            refs = wait_idle(client, sid)["messages"][0]["attachments"]
        upload_again_as_an_older_tether(data_dir, sid, refs, RAW)
        with (
            running_server(data_dir, *flags) as server,
            httpx.Client(base_url=server.base_url, timeout=20) as client,
        ):
            shown = [a["name"] for a in session_body(client, sid)["messages"][2]["attachments"]]
            assert shown == list(RAW.values())  # the log is never rewritten; the page cleans

            response = client.get("/api/session/context", params={"session_id": sid})
            assert response.status_code == 200, response.text
            older = response.json()["context_messages"][2]["content"]
            named = [part["name"] for part in older if part["type"] == "attachment"]
            assert named == list(SHOWN.values())

            start_turn(client, sid, "and now?")
            wait_idle(client, sid)
        sent = json.dumps(fake.last_request["messages"], ensure_ascii=False)
    assert "Attached file invoicegnp.exe:\\nfirst file" in sent
    assert "Attached file attachment:\\nsecond file" in sent
    for raw in RAW.values():
        assert raw not in sent
    assert not any(ch in sent for ch in "\u202e\u200b\x07")
