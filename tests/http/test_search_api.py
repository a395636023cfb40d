"""Search (issue 16.6, docs/api.md): `GET /api/search` over the settled text of user and
assistant rows of every session, from the SQLite FTS5 index the log writer keeps in the
transaction of the events (layer: log writer -> search index; invariant: the index is the
fold of the committed log, never behind it). Deleted sessions are not found; every row of
every branch is (an edit, a regenerate, an undo or a switch loses nothing), with `shown`
from the session's fold; a restart finds the same; bad queries are a 400, never a 500. Real
server, real HTTP, the fake OpenAI server at the model boundary."""

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
        reply(tool_call("c1", "read_file", {"path": "notes.txt"})),
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


def test_an_answers_snippet_is_its_text_without_markdown_syntax(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """The transcript shows an answer's Markdown rendered, so its snippet is the text a person
    reads there (docs/api.md §13: plain text): no emphasis, code, heading, list or quote
    marks, no link address, nor a table's rule; a link address holding the match is kept
    whole. Arithmetic and snake_case keep their characters, and a user row, shown as typed,
    keeps its own."""
    fake.script(
        reply(
            text(
                "## Numbats\n\nThe **numbat** eats `termites`; see [the *guide*](https://x.example/a)."
            )
        ),
        reply(
            text(
                "- 2*3 is six\n- snake_case numbat\n> a numbat quote\n\n```python\nnumbat = 1\n```"
            )
        ),
        reply(text("| animal | food |\n|---|---|\n| numbat | termites |")),
        reply(text("See [here](https://numbat.example/wiki).")),
        reply(text("ok")),
    )
    with server.client() as client:
        sid = new_session(client)
        for message in ("first", "second", "third", "fourth", "**numbat** as typed"):
            turn(client, sid, message)
        found = {r["snippet"]: r for r in search(client, "numbat", limit=10)}
        assert set(found) == {
            "Numbats The numbat eats termites; see the guide.",
            "2*3 is six snake_case numbat a numbat quote numbat = 1",
            "animal food numbat termites",
            "See [here](https://numbat.example/wiki).",
            "**numbat** as typed",
        }, set(found)
        marked = found["animal food numbat termites"]["snippet_parts"]
        assert marked == [
            {"text": "animal food ", "match": False},
            {"text": "numbat", "match": True},
            {"text": " termites", "match": False},
        ]
        in_link = found["See [here](https://numbat.example/wiki)."]["snippet_parts"]
        assert {"text": "numbat", "match": True} in in_link


def test_a_matched_word_beside_an_underscore_or_a_star_keeps_them_in_an_answers_snippet(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    """Markdown makes no emphasis of `_` inside a word nor of `*` between digits, so the
    rendered answer shows `snake_case_name` and `2*3`; its snippet must too, whichever word
    of them is the match (the match markers beside the `_` or `*` are no space)."""
    fake.script(reply(text("Call snake_case_name with 2*3 today.")))
    with server.client() as client:
        sid = new_session(client)
        turn(client, sid, "go")
        for q in ("snake", "case", "name", "2", "3"):
            snippets = [r["snippet"] for r in search(client, q) if r["role"] == "assistant"]
            assert snippets == ["Call snake_case_name with 2*3 today."], q


@pytest.mark.parametrize(
    ("q", "code"),
    [
        ("", "invalid_request"),
        ("   ", "invalid_request"),
        ('"*()', "invalid_request"),
        ("_", "invalid_request"),  # an underscore is punctuation, as the index reads it
        ("__ -_-", "invalid_request"),
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


def test_a_query_of_emoji_alone_is_told_it_holds_no_word(server: ServerProcess) -> None:
    """Emoji are symbols, not words, to the index: a search for one is refused saying so,
    not calling it punctuation."""
    with server.client() as client:
        response = client.get("/api/search", params={"q": "🎉 ✅"})
        assert response.status_code == 400, response.text
        assert response.json()["code"] == "invalid_request"
        assert "emoji" in response.json()["message"]


def test_query_syntax_is_searched_as_words_never_an_error(
    server: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text("fine")))
    with server.client() as client:
        sid = new_session(client)
        turn(client, sid, 'near the "fox" AND NOT the dog* (really) col:umn snake_case')
        for q in (
            "snake_case",
            "_snake",
            '"fox',
            "fox AND",
            "NOT dog",
            "NEAR(fox dog)",
            "col:umn",
            "fox*",
            "^fox",
            "dog)",
        ):
            response = client.get("/api/search", params={"q": q})
            assert response.status_code == 200, (q, response.text)
            assert [r["session_id"] for r in response.json()["results"]] == [sid], q
        assert client.get("/api/search").status_code == 400  # no q at all
        for limit in ("0", "101", "x"):
            response = client.get("/api/search", params={"q": "fox", "limit": limit})
            assert response.status_code == 400, limit


def test_deleted_sessions_are_not_found_and_truncated_rows_are(
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
        assert all(r["shown"] for r in search(client, "kiwi"))
        response = client.post("/api/session/truncate", json={"session_id": kept, "keep_count": 1})
        assert response.status_code == 200, response.text
        # an undo hides the answer as a branch: still found, not shown
        assert shown_of(search(client, "kiwi")) == {
            "kiwi question one": True,
            "second answer kiwi": False,
        }
        turn(client, kept, "kiwi question two")
        assert shown_of(search(client, "kiwi")) == {
            "kiwi question one": True,
            "second answer kiwi": False,
            "kiwi question two": True,
            "third answer kiwi": True,
        }


def shown_of(results: list[dict]) -> dict[str, bool]:
    return {r["snippet"]: r["shown"] for r in results}


def switch(client: httpx.Client, sid: str, row_id: str, index: int) -> None:
    body = {"session_id": sid, "row_id": row_id, "index": index}
    response = client.post("/api/session/branch", json=body)
    assert response.status_code == 200, response.text


def test_every_branch_is_found_after_edit_regenerate_switch_and_restart(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """Layer: search index + session fold. Invariant: nothing of any branch is lost from
    search (contract invariant 8: the index is the fold of the committed log), and `shown`
    is the branch the user sees (invariant 1), also after a restart rebuilds the index."""
    (tmp_path / "ws").mkdir()
    fake.script(
        reply(text("answer about the old okapi")),
        reply(text("answer about the new okapi")),
        reply(text("regenerated okapi answer")),
    )
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            sid = new_session(client)
            turn(client, sid, "tell me about the old okapi")
            first = session_body(client, sid)["messages"][0]
            # edit: the old message and its answer are a hidden branch, still found
            start_turn(client, sid, "tell me about the new okapi", edit_of=first["id"])
            wait_idle(client, sid)
            assert shown_of(search(client, "okapi")) == {
                "tell me about the old okapi": False,
                "answer about the old okapi": False,
                "tell me about the new okapi": True,
                "answer about the new okapi": True,
            }
            assert [r["shown"] for r in search(client, "old okapi")] == [False, False]
            # regenerate: both answers found, no second copy of the message
            response = client.post("/api/chat/regenerate", json={"session_id": sid})
            assert response.status_code == 200, response.text
            body = wait_idle(client, sid)
            after_regenerate = {
                "tell me about the old okapi": False,
                "answer about the old okapi": False,
                "tell me about the new okapi": True,
                "answer about the new okapi": False,
                "regenerated okapi answer": True,
            }
            found = search(client, "okapi")
            assert shown_of(found) == after_regenerate and len(found) == 5
            shown_ids = {m["id"] for m in body["messages"]}
            hidden_ids = {m["id"] for m in body["branches"]["hidden"]}
            assert {r["row_id"] for r in found if r["shown"]} == shown_ids
            assert {r["row_id"] for r in found if not r["shown"]} == hidden_ids
            # switch back to the first message: its rows are shown, the edit's hidden
            switch(client, sid, body["messages"][0]["id"], 1)
            after_switch = {
                "tell me about the old okapi": True,
                "answer about the old okapi": True,
                "tell me about the new okapi": False,
                "answer about the new okapi": False,
                "regenerated okapi answer": False,
            }
            assert shown_of(search(client, "okapi")) == after_switch
            before = search(client, "okapi")
    finally:
        srv.stop()
    # a restart finds the same; so does a rebuild of the index from the log
    for rebuild in (False, True):
        if rebuild:
            db = sqlite3.connect(tmp_path / "data" / "tether.db")
            db.execute("UPDATE meta SET value='search-1' WHERE key='search_version'")
            db.commit()
            db.close()
        srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
        try:
            with srv.client() as client:
                assert search(client, "okapi") == before
        finally:
            srv.stop()


def test_an_index_built_before_branches_is_rebuilt_with_the_hidden_rows(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """An index of the previous fold version dropped truncated rows: its version differs,
    so the start rebuilds it and the hidden branch is found again."""
    (tmp_path / "ws").mkdir()
    fake.script(reply(text("first tapir answer")), reply(text("second tapir answer")))
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            sid = new_session(client)
            turn(client, sid, "tapir please")
            assert client.post("/api/chat/regenerate", json={"session_id": sid}).status_code == 200
            wait_idle(client, sid)
            assert len(search(client, "tapir")) == 3
    finally:
        srv.stop()
    # what the old fold left behind: the hidden answer dropped, version search-1
    db = sqlite3.connect(tmp_path / "data" / "tether.db")
    db.execute("DELETE FROM search_rows WHERE text='first tapir answer'")
    db.execute("UPDATE meta SET value='search-1' WHERE key='search_version'")
    db.commit()
    db.close()
    srv = serve(tmp_path / "data", fake, tmp_path / "ws").start()
    try:
        with srv.client() as client:
            assert shown_of(search(client, "tapir")) == {
                "tapir please": True,
                "first tapir answer": False,
                "second tapir answer": True,
            }
    finally:
        srv.stop()


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
