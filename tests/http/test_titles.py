"""Titles are text a person can see: invisible formatting characters are removed, NFC is
applied, and a title with a control character or nothing visible left is a clear 400 that
changes nothing, on create and on rename."""

from __future__ import annotations

import httpx
import pytest
from names_kit import LEGITIMATE

from helpers import ServerProcess, new_session

pytestmark = pytest.mark.slow

REFUSED = {
    "zero-width spaces": "\u200b\u200b\u200b",
    "zero-width joiners and word joiners": " \u200d\u2060\u200c\ufeff ",
    "a bidi override alone": "\u202e",
    "bidi isolates and marks": "\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
    "a soft hyphen": "\u00ad",
    "Hangul fillers": "\u3164\u3164",
    "braille blanks": "\u2800",
    "NUL inside": "a\x00b",
    "NUL only": "\x00",
    "a bell": "\x07ring",
    "an escape sequence": "\x1b[31mred",
    "DEL": "x\x7f",
    "a C1 control": "x\x9b1m",
    "only line breaks": "\n\r\t\u2028",
    "a lone combining mark": "\u0301",
}


NORMALISED = {
    "evil\u202etxt.exe": "eviltxt.exe",
    "\u2067right\u2069 to left": "right to left",
    "Cafe\u0301": "Caf\u00e9",
    "zero\u200bwidth": "zerowidth",
    "two\nlines\tand a tab": "two lines and a tab",
    "\ufeffBOM first": "BOM first",
    # ZWJ and ZWNJ join something here (an emoji sequence, a Persian word): they stay; where
    # they join nothing (ASCII letters, a space) they only make one title look like another.
    **{text: text for text in LEGITIMATE.values()},
    "ad\u200dmin": "admin",
    "\u200dpadded\u200c \u200d": "padded",
    "wide   gaps\t\t and\u2028\u2029 breaks": "wide gaps and breaks",
    "\u2066isolated\u2069 \u202aembedded\u202c \u206adeprecated": "isolated embedded deprecated",
    "record\x1eseparator": "record separator",
}


def sidebar(client: httpx.Client) -> list[dict]:
    return client.get("/api/sessions").json()["sessions"]


def assert_clear_400(response: httpx.Response, what: str) -> None:
    assert response.status_code == 400, (what, response.status_code, response.text)
    body = response.json()
    assert body["code"] == "invalid_request", what
    assert "title" in body["message"], (what, body["message"])


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_an_invisible_or_control_title_is_refused_and_changes_nothing(
    shared_server: ServerProcess, kind: str
) -> None:
    title = REFUSED[kind]
    with shared_server.client() as client:
        sid = new_session(client, "kept")
        before = sidebar(client)
        assert_clear_400(client.post("/api/sessions", json={"title": title}), kind)
        renamed = client.patch("/api/session", json={"session_id": sid, "title": title})
        assert_clear_400(renamed, kind)
        assert sidebar(client) == before
        assert (
            client.get("/api/session", params={"session_id": sid}).json()["session"]["title"]
            == "kept"
        )


def test_control_characters_are_named_in_the_message(shared_server: ServerProcess) -> None:
    with shared_server.client() as client:
        message = client.post("/api/sessions", json={"title": "a\x00b"}).json()["message"]
    assert "U+0000" in message


@pytest.mark.parametrize("given", sorted(NORMALISED))
def test_a_visible_title_is_stored_normalised(shared_server: ServerProcess, given: str) -> None:
    with shared_server.client() as client:
        created = client.post("/api/sessions", json={"title": given})
        assert created.status_code == 201, created.text
        assert created.json()["session"]["title"] == NORMALISED[given]
        sid = new_session(client, "before")
        renamed = client.patch("/api/session", json={"session_id": sid, "title": given})
        assert renamed.status_code == 200, renamed.text
        row = client.get("/api/session", params={"session_id": sid}).json()["session"]
        assert row["title"] == NORMALISED[given]
