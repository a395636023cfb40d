"""Search (docs/api.md §13) in scripts whose words hold combining marks (Unicode categories
Mn, Mc, Me): Devanagari vowel signs and viramas, Arabic harakat, Thai vowel marks, Hebrew
points, a Latin letter followed by a combining accent. Layer: the search index
(log/sqlite_search.py, the tokenizer of migration m007; log/pg_search.py) and the query's
words (sessions/search.py). Invariant: a word is one token in the index and one term in the
query, so it is found whole, by its prefix, and marked whole in the snippet; on both
backends. Real server, real HTTP, the fake OpenAI server at the model boundary."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pg import database

from fake_openai import FakeOpenAI, reply, text
from helpers import new_session, running_server, start_turn, wait_idle

pytestmark = pytest.mark.slow

HINDI = "नमस्ते"  # न म स ् त े: a virama and a vowel sign inside
ARABIC = "كِتَابٌ"  # kitābun with its harakat
THAI = "สวัสดี"  # two vowel marks inside
HEBREW = "שָׁלוֹם"  # with its points
DECOMPOSED = "cafe\u0301"  # "café" as e + COMBINING ACUTE ACCENT
MESSAGE = (
    f"Say {HINDI}, read {ARABIC}, greet {THAI} and {HEBREW} at the {DECOMPOSED} (plain words too)"
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A server on each backend, holding one session whose user message is MESSAGE."""
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(database()) if request.param == "postgresql" else None
        data = tmp_path_factory.mktemp("marks") / "data"
        yield stack.enter_context(serving(data, url, with_message=True))


@contextlib.contextmanager
def serving(data: Path, url: str | None, with_message: bool = False) -> Iterator[httpx.Client]:
    """A client of a real server on `data` (PostgreSQL at `url`, SQLite without), the fake
    OpenAI server answering; with `with_message`, MESSAGE sent and its run settled."""
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeOpenAI())
        fake.script(reply(text("noted")))
        args = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
        if url is not None:
            args += ("--database-url", url)
        client = stack.enter_context(stack.enter_context(running_server(data, *args)).client())
        if with_message:
            sid = new_session(client)
            start_turn(client, sid, MESSAGE)
            wait_idle(client, sid)
        yield client


def marked(client: httpx.Client, q: str) -> list[str]:
    """The matched parts of the snippet of the one row `q` finds."""
    response = client.get("/api/search", params={"q": q})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["role"] for r in results] == ["user"], q
    return [p["text"] for p in results[0]["snippet_parts"] if p["match"]]


@pytest.mark.parametrize(
    ("q", "word"),
    [
        (HINDI, HINDI),
        ("नमस्", HINDI),  # a prefix ending in the virama
        (ARABIC, ARABIC),
        ("كِتَا", ARABIC),
        (THAI, THAI),
        ("สวัส", THAI),
        (HEBREW, HEBREW),
        ("שָׁלוֹ", HEBREW),
        (DECOMPOSED, DECOMPOSED),
        ("café", DECOMPOSED),  # precomposed: accents are ignored both ways
        ("cafe", DECOMPOSED),
        ("caf", DECOMPOSED),
    ],
)
def test_a_word_with_combining_marks_is_found_and_marked_whole(
    client: httpx.Client, q: str, word: str
) -> None:
    assert marked(client, q) == [word]


def test_several_such_words_match_together_and_a_piece_after_a_mark_is_no_word(
    client: httpx.Client,
) -> None:
    assert marked(client, f"{HINDI} {ARABIC} {THAI}") == [HINDI, ARABIC, THAI]
    # what follows a virama or a vowel mark is inside the word, not a word of its own
    for piece in ("ते", "สดี", "ابٌ"):
        response = client.get("/api/search", params={"q": piece})
        assert response.status_code == 200, response.text
        assert response.json()["results"] == [], piece


def test_marks_without_a_letter_are_no_word(client: httpx.Client) -> None:
    """A combining accent alone folds to nothing in the index: as a word it would be an
    empty prefix matching every row. Marks alone are punctuation to the query."""
    response = client.get("/api/search", params={"q": "\u0301\u0301\u0301"})
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request"
    assert marked(client, f"{THAI} \u064e\u064e\u064e") == [THAI]  # fathas alone: no word


def test_an_index_made_before_m007_is_made_again_when_the_server_starts(tmp_path: Path) -> None:
    """A SQLite database from before migration m007 holds m004's index, which cut words at
    their marks: the next start applies m007, and the words are found whole."""
    data = tmp_path / "data"
    with serving(data, None, with_message=True):
        pass
    db = sqlite3.connect(data / "tether.db")
    db.execute("DROP TABLE search_fts")
    db.execute(  # m004's table, as an older Tether made it
        "CREATE VIRTUAL TABLE search_fts USING fts5(text, content='search_rows', "
        "content_rowid='id', tokenize='unicode61 remove_diacritics 2')"
    )
    db.execute("INSERT INTO search_fts(search_fts) VALUES ('rebuild')")
    db.execute("DELETE FROM migrations WHERE name='m007_search_words_with_marks'")
    db.commit()
    [(old,)] = db.execute(
        "SELECT highlight(search_fts, 0, '[', ']') FROM search_fts WHERE search_fts MATCH ?",
        (f'"{HINDI}"',),
    )
    db.close()
    assert "[नमस्त]े, " in old  # the word in pieces: its last vowel sign left out
    with serving(data, None) as client:
        for word in (HINDI, ARABIC, THAI, HEBREW, DECOMPOSED):
            assert marked(client, word) == [word]
