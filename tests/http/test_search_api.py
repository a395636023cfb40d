"""Search (issue 16.6, docs/api.md): `GET /api/search` over the settled text of user and
assistant rows of every session, from the SQLite FTS5 index the log writer keeps in the
transaction of the events (layer: log writer -> search index; invariant: the index is the
fold of the committed log, never behind it). Deleted sessions and truncated rows are not
found; a restart finds the same; bad queries are a 400, never a 500. Real server, real HTTP,
the fake OpenAI server at the model boundary."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, reasoning, reply, text, tool_call
from helpers import ServerProcess, new_session, session_body, start_turn, wait_idle

pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def serve(data: Path, fake: FakeOpenAI, ws: Path) -> ServerProcess:
    return ServerProcess(
        data,
        *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
        *("--workspace", str(ws)),
    )


@pytest.fixture
def server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("zanzibar is in the tool output only")
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        yield srv
    finally:
        srv.stop()


def search(client: httpx.Client, q: str, **params: object) -> list[dict]:
    response = client.get("/api/search", params={"q": q, **params})
    assert response.status_code == 200, response.text
    return response.json()["results"]


def turn(client: httpx.Client, sid: str, message: str) -> None:
    start_turn(client, sid, message)
    wait_idle(client, sid)


def test_user_and_assistant_text_is_found_with_the_match_marked(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(
        reply(
            reasoning("thinking about quokkas"), text("Wombats dig "), text("burrows <b>deep</b>")
        ),
        reply(tool_call("read_file", {"path": "notes.txt"})),
        reply(text("The notes mention an island.")),
    )
    with server.client() as client:
        sid = new_session(client, "Marsupials")
        turn(client, sid, "Tell me about wombats please")
        other = new_session(client)
        turn(client, other, "What do the notes say?")
        rows = session_body(client, sid)["messages"]

        wombats = search(client, "wombats")
        assert {(r["session_id"], r["role"], r["row_id"]) for r in wombats} == {
            (sid, "user", rows[0]["id"]),
            (sid, "assistant", rows[1]["id"]),
        }
        assert all(r["title"] == "Marsupials" for r in wombats)
        answer = next(r for r in wombats if r["role"] == "assistant")
        # the deltas settled into one text, markup kept as text, the match marked as a part
        assert answer["snippet"] == "Wombats dig burrows <b>deep</b>"
        assert answer["snippet_parts"][0] == {"text": "Wombats", "match": True}
        assert "".join(p["text"] for p in answer["snippet_parts"]) == answer["snippet"]
        assert isinstance(answer["at"], float)
        # every word must match; the last one also as a prefix; case and HTML ignored
        assert [r["role"] for r in search(client, "DIG burr")] == ["assistant"]
        assert search(client, "wombats island") == []
        assert [r["session_id"] for r in search(client, "island")] == [other]
        # reasoning and tool output are not the row's text
        assert search(client, "quokkas") == []
        assert search(client, "zanzibar") == []
        # the first title-less session takes its first message as title
        assert search(client, "notes say")[0]["title"] == "What do the notes say?"


def test_best_matches_come_first_and_limit_caps(server: ServerProcess, fake: FakeOpenAI) -> None:
    fake.script(*(reply(text("ok")) for _ in range(3)))
    with server.client() as client:
        sid = new_session(client)
        turn(client, sid, "otter once among many other words that dilute the match here")
        turn(client, sid, "otter otter otter")
        turn(client, sid, "otter twice otter and words")
        found = search(client, "otter")
        assert [r["snippet"] for r in found][0] == "otter otter otter"
        assert len(found) == 3
        assert len(search(client, "otter", limit=2)) == 2


@pytest.mark.parametrize(
    ("q", "code"),
    [
        ("", "invalid_request"),
        ("   ", "invalid_request"),
        ('"*()', "invalid_request"),
        ("x" * 501, "invalid_request"),
        (" ".join(["w"] * 17), "invalid_request"),
    ],
)
def test_bad_queries_are_400(server: ServerProcess, q: str, code: str) -> None:
    with server.client() as client:
        response = client.get("/api/search", params={"q": q})
        assert response.status_code == 400, response.text
        assert response.json()["code"] == code
        assert response.json()["message"]


def test_query_syntax_is_searched_as_words_never_an_error(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("fine")))
    with server.client() as client:
        sid = new_session(client)
        turn(client, sid, 'near the "fox" AND NOT the dog* (really) col:umn')
        for q in ('"fox', "fox AND", "NOT dog", "NEAR(fox dog)", "col:umn", "fox*", "^fox", "dog)"):
            response = client.get("/api/search", params={"q": q})
            assert response.status_code == 200, (q, response.text)
            assert [r["session_id"] for r in response.json()["results"]] == [sid], q
        assert client.get("/api/search").status_code == 400  # no q at all
        for limit in ("0", "101", "x"):
            response = client.get("/api/search", params={"q": "fox", "limit": limit})
            assert response.status_code == 400, limit


def test_deleted_sessions_and_truncated_rows_are_not_found(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(*(reply(text(f"{n} answer kiwi")) for n in ("first", "second", "third")))
    with server.client() as client:
        gone = new_session(client)
        turn(client, gone, "kiwi in a session to delete")
        kept = new_session(client)
        turn(client, kept, "kiwi question one")
        assert len(search(client, "kiwi")) == 4
        assert client.delete("/api/session", params={"session_id": gone}).status_code == 200
        assert {r["session_id"] for r in search(client, "kiwi")} == {kept}
        response = client.post("/api/session/truncate", json={"session_id": kept, "keep_count": 1})
        assert response.status_code == 200, response.text
        assert [r["role"] for r in search(client, "kiwi")] == ["user"]
        # the transcript grows again from there: the new rows are found, the old one is not
        turn(client, kept, "kiwi question two")
        found = search(client, "kiwi")
        assert sorted(r["snippet"] for r in found) == [
            "kiwi question one",
            "kiwi question two",
            "third answer kiwi",
        ]


def test_a_restart_finds_the_same_and_a_missing_index_is_rebuilt(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    (tmp_path / "ws").mkdir()
    fake.script(reply(text("a reply about lemurs")), reply(text("more lemurs")))
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            sid = new_session(client)
            turn(client, sid, "lemurs of madagascar")
            before = search(client, "lemurs")
    finally:
        srv.stop()
    assert len(before) == 2
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            assert search(client, "lemurs") == before
    finally:
        srv.stop()
    # a database from before the index (its version unknown): rebuilt from the log at start
    db = sqlite3.connect(tmp_path / "data" / "tether.db")
    db.execute("DELETE FROM search_rows")
    db.execute("DELETE FROM meta WHERE key='search_version'")
    db.commit()
    db.close()
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            assert search(client, "lemurs") == before
            turn(client, sid, "lemurs again")
            assert len(search(client, "lemurs")) == 4
    finally:
        srv.stop()


def test_a_killed_server_keeps_the_index_with_the_log(tmp_path: Path, fake: FakeOpenAI) -> None:
    """The index is written in the log's transaction: after kill -9 every acknowledged row
    is found, without a rebuild (the stored version is current)."""
    (tmp_path / "ws").mkdir()
    fake.script(reply(text("answer about capybaras")))
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            sid = new_session(client)
            turn(client, sid, "capybaras swim")
    finally:
        srv.stop(signal.SIGKILL)
    db = sqlite3.connect(tmp_path / "data" / "tether.db")
    indexed = db.execute("SELECT role FROM search_rows WHERE session_id=?", (sid,)).fetchall()
    db.close()
    assert sorted(indexed) == [("assistant",), ("user",)]
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            assert len(search(client, "capybaras")) == 2
    finally:
        srv.stop()
