"""Attachment names a log recorded before names were cleaned (an older Tether, another
replica of one, stored them as given), as the real page shows them in Chromium: a user row's
file chip, its download name and an image's text, the files an edit keeps and those an edit
leaves in the composer are the name as visible text (docs/api.md §3, `js/names.js`), as the
Markdown export shows it, while the log and the session's view keep the name as recorded;
a name that shows nothing once cleaned is `attachment` there, as the download names it.
Layer: the page's transcript rows (drawing only; the log and the folds are unchanged)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from helpers import new_session, running_server, session_body, start_turn, wait_idle
from older_log_kit import upload_again_as_an_older_tether
from pagekit import open_app, wait_settled

pytestmark = pytest.mark.slow

# 1x1 transparent PNG
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
RAW = {
    "notes.txt": "invoice\u202egnp\u200b.exe\x07",
    "photo.png": "ph\u2066oto\u2069\u00ad.png",
    "blank.txt": "\u200b\u202e",  # nothing left once cleaned
}
SHOWN = {"notes.txt": "invoicegnp.exe", "photo.png": "photo.png", "blank.txt": "attachment"}
CHIPS = [SHOWN["notes.txt"], SHOWN["blank.txt"]]


def _file(name: str, mime: str, data: bytes) -> dict[str, str]:
    return {"name": name, "mime": mime, "data_base64": base64.b64encode(data).decode()}


def test_file_names_an_older_log_holds_are_shown_as_visible_text(
    context: BrowserContext, tmp_path: Path
) -> None:
    """`invoice\\u202egnp.exe` showed as `invoiceexe.png` in its chip (and was the name the
    chip's download saved), and the edit box and the composer took it on; `\\u200b\\u202e`
    was an empty chip and an empty name in the export, though its download is `attachment`."""
    data = tmp_path / "data"
    with running_server(data) as server, server.client() as client:
        sid = new_session(client, "older names")
        files = [
            _file("notes.txt", "text/plain", b"hi"),
            _file("photo.png", "image/png", PNG),
            _file("blank.txt", "text/plain", b"blank"),
        ]
        start_turn(client, sid, "first", attachments=files)
        refs = wait_idle(client, sid)["messages"][0]["attachments"]
    upload_again_as_an_older_tether(data, sid, refs, RAW)

    with running_server(data, env={"TETHER_DEMO_DELAY": "0.01"}) as server:
        with server.client() as client:
            old = session_body(client, sid)["messages"][2]["attachments"]
            assert [a["name"] for a in old] == list(RAW.values())  # the log is as it was
            markdown = client.get(f"/api/sessions/{sid}/export", params={"format": "markdown"})
            assert "Attachment: invoicegnp.exe (2 bytes)" in markdown.text
            assert "Attachment: attachment (5 bytes)" in markdown.text
            for ref in old:  # the name each file downloads under, as the page names it
                shown = SHOWN[next(k for k, v in RAW.items() if v == ref["name"])]
                disposition = client.get(ref["url"]).headers["content-disposition"]
                assert f'filename="{shown}"' in disposition
        page = context.new_page()
        open_app(page, server.base_url, f"/s/{sid}")
        wait_settled(page)
        row = page.locator("#transcript .rows > .row.user").nth(1)
        chips = row.locator(".file-chip")
        expect(chips).to_have_text(CHIPS)
        for i, name in enumerate(CHIPS):
            expect(chips.nth(i)).to_have_attribute("download", name)
        expect(row.locator(".user-attachments img")).to_have_attribute("alt", SHOWN["photo.png"])

        row.get_by_role("button", name="Edit").click()
        kept = row.get_by_role("list", name="Attachments").locator(".chip-name")
        expect(kept).to_have_text(list(SHOWN.values()))
        for name in CHIPS:
            expect(row.get_by_role("button", name=f"Remove {name}")).to_be_visible()
        row.get_by_role("textbox", name="Edit message").fill("files, on second thought")
        with server.client() as client:  # another tab hides the row being edited
            first_answer = session_body(client, sid)["messages"][1]["id"]
            response = client.post(
                "/api/chat/regenerate", json={"session_id": sid, "row_id": first_answer}
            )
            assert response.status_code == 200, response.text
            wait_idle(client, sid)
        expect(page.locator("#transcript .rows > .row.user")).to_have_count(1)
        expect(page.locator("#attachment-chips .chip-name")).to_have_text(list(SHOWN.values()))
