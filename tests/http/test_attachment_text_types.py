"""Text files a browser gives no text type (docs/api.md §4): a Dockerfile, `.env`, `.vue`,
`.swift` or `.jsonl` comes as `application/x-…` or, unknown, as the page's
`application/octet-stream`; Ruby and PHP as `application/x-ruby` and `application/x-php`.
They were refused ("cannot take application/octet-stream files. Attach images or text
files.") though they are text files. Layer: the run intake (runs/intake.py) and the
runtimes' types (runtimes/attachments.py). Invariant: a refused start leaves no trace; an
unknown type whose bytes are UTF-8 text is taken as `text/plain` and reaches the model as
text. Real server, real HTTP; the model is the suite's fake over HTTP."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, reply, text
from helpers import new_session, running_server, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow


def _file(name: str, mime: str, data: bytes) -> dict[str, str]:
    return {"name": name, "mime": mime, "data_base64": base64.b64encode(data).decode()}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[httpx.Client, FakeOpenAI]]:
    with FakeOpenAI(model="fake-model") as fake:
        fake.default_reply = reply(text("seen"))
        flags = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
        with running_server(tmp_path / "data", *flags) as server, server.client() as client:
            yield client, fake


def test_text_files_of_unknown_or_script_types_reach_the_model_as_text(
    served: tuple[httpx.Client, FakeOpenAI],
) -> None:
    client, fake = served
    sid = new_session(client)
    files = [
        _file("Dockerfile", "application/octet-stream", b"FROM python:3.12\n"),
        _file("app.rb", "application/x-ruby", b"puts 'hi'\n"),
        _file("index.php", "application/x-php", b"<?php echo 1;\n"),
    ]
    start_turn(client, sid, "three files", attachments=files)
    stored = wait_idle(client, sid)["messages"][0]["attachments"]
    assert [(a["name"], a["mime"]) for a in stored] == [
        ("Dockerfile", "text/plain"),
        ("app.rb", "application/x-ruby"),
        ("index.php", "application/x-php"),
    ]
    sent = json.dumps(fake.last_request["messages"], ensure_ascii=False)
    assert "Attached file Dockerfile:\\nFROM python:3.12" in sent
    assert "Attached file app.rb:\\nputs 'hi'" in sent
    assert "Attached file index.php:\\n<?php echo 1;" in sent


@pytest.mark.parametrize(
    "data", [b"\x7fELF\x02\x01\x01\x00\x00\x00", b"\xff\xfe\xfd not UTF-8"], ids=["nul", "bytes"]
)
def test_an_unknown_type_that_is_not_text_is_still_refused(
    served: tuple[httpx.Client, FakeOpenAI], data: bytes
) -> None:
    client, _ = served
    sid = new_session(client)
    before = session_body(client, sid)
    body = {
        "session_id": sid,
        "message": "a binary",
        "attachments": [_file("blob", "application/octet-stream", data)],
    }
    response = client.post("/api/chat/start", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request"
    assert "application/octet-stream" in response.json()["message"]
    assert session_body(client, sid) == before
