"""Search (docs/api.md §13) for words that stand inside punctuated text: a file name, a
URL, an e-mail address, a path, an HTML tag. Layer: the search index (log/sqlite_search.py,
log/pg_search.py) and the query's words (sessions/search.py). Invariant: a word is a run of
letters, digits and marks between punctuation in the index as in the query, on both
backends, so every word written is found and marked, and the snippet shows the text as
written. PostgreSQL's parser read `config.yaml`, a URL, an address or a path as one token and
left HTML tags (and a script's content) out: none of their words were found, and the
snippet lost the tags. Real server, real HTTP, the fake OpenAI server at the model
boundary."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest
from pg import database

from fake_openai import FakeOpenAI, reply, text
from helpers import new_session, running_server, start_turn, wait_idle

pytestmark = pytest.mark.slow

MESSAGE = (
    "Edit config.yaml, read https://docs.example.org/guide/setup, mail jo.doe@corp.test, "
    'run /usr/local/bin/python3 and wrap it in <div class="container"><script>alert(1)</script>'
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A server on each backend, holding one session whose user message is MESSAGE."""
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeOpenAI())
        fake.script(reply(text("noted")))
        args = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
        if request.param == "postgresql":
            args += ("--database-url", stack.enter_context(database()))
        data = tmp_path_factory.mktemp("punctuated") / "data"
        client = stack.enter_context(stack.enter_context(running_server(data, *args)).client())
        sid = new_session(client)
        start_turn(client, sid, MESSAGE)
        wait_idle(client, sid)
        yield client


def found(client: httpx.Client, q: str) -> list[dict]:
    response = client.get("/api/search", params={"q": q})
    assert response.status_code == 200, response.text
    return response.json()["results"]


@pytest.mark.parametrize(
    ("q", "words"),
    [
        ("config.yaml", ["config", "yaml"]),
        ("yaml", ["yaml"]),
        ("guide setup", ["guide", "setup"]),
        ("docs.example.org", ["docs", "example", "org"]),
        ("doe", ["doe"]),
        ("jo.doe@corp.test", ["jo", "doe", "corp", "test"]),
        ("python3", ["python3"]),
        ("bin python", ["bin", "python3"]),
        ("div container", ["div", "container"]),
        ("script alert", ["script", "alert", "script"]),
    ],
)
def test_every_word_of_punctuated_text_is_found_and_marked(
    client: httpx.Client, q: str, words: list[str]
) -> None:
    [hit] = found(client, q)
    assert hit["role"] == "user"
    assert [p["text"] for p in hit["snippet_parts"] if p["match"]] == words


def test_the_snippet_keeps_html_tags_as_the_text_they_are(client: httpx.Client) -> None:
    [hit] = found(client, "container")
    assert '<div class="container"><script>alert(1)</script>' in hit["snippet"]
    assert hit["snippet"] == "".join(p["text"] for p in hit["snippet_parts"])


def test_a_postgresql_index_made_before_m013_is_made_again_from_the_log(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A database from before migration m013 holds vectors of the text (m004's column):
    the next start applies m013 and indexes the rows again, so their words are found."""
    import psycopg

    with contextlib.ExitStack() as stack:
        url = stack.enter_context(database())
        fake = stack.enter_context(FakeOpenAI())
        fake.script(reply(text("noted")))
        args = ("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model")
        data = tmp_path_factory.mktemp("before_m013") / "data"
        with running_server(data, *args, "--database-url", url) as srv, srv.client() as client:
            sid = new_session(client)
            start_turn(client, sid, MESSAGE)
            wait_idle(client, sid)
        with psycopg.connect(url, autocommit=True) as db:  # back to m004's shape
            db.execute("ALTER TABLE search_rows DROP COLUMN tsv")
            db.execute("ALTER TABLE search_rows DROP COLUMN words")
            db.execute(
                "ALTER TABLE search_rows ADD COLUMN tsv TSVECTOR GENERATED ALWAYS AS "
                "(to_tsvector('tether_search'::regconfig, text)) STORED"
            )
            db.execute("DELETE FROM tether_migrations WHERE name='m013_search_words'")
        with running_server(data, *args, "--database-url", url) as srv, srv.client() as client:
            [hit] = found(client, "yaml")
            assert [p["text"] for p in hit["snippet_parts"] if p["match"]] == ["yaml"]
