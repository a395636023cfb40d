"""Search (docs/api.md §13) of a row of very many distinct words: PostgreSQL's `tsvector`
holds at most 1 MB, and a row past it made the append fail, so an import holding such an
answer (a pasted log, a data dump) was 503 `storage_unavailable` on PostgreSQL while SQLite
took it. Layer: the search index (log/pg_search.py), written in the append's transaction.
Invariant: indexing never refuses an append; the row's words are found as far as the index
holds them (all of them with SQLite). Real server, real HTTP."""

from __future__ import annotations

import contextlib
import json
import random
import string
import time
from collections.abc import Iterator

import httpx
import pytest
from pg import database

from chatgpt_kit import Conversation
from helpers import running_server

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    with contextlib.ExitStack() as stack:
        args = ()
        if request.param == "postgresql":
            args = ("--database-url", stack.enter_context(database()))
        data = tmp_path_factory.mktemp("long_rows") / "data"
        yield stack.enter_context(
            stack.enter_context(running_server(data, *args)).client(timeout=120)
        )


def test_an_answer_of_a_million_distinct_words_bytes_is_imported_and_found(
    client: httpx.Client,
) -> None:
    rng = random.Random(7)
    dump = " ".join("".join(rng.choices(string.ascii_lowercase, k=7)) for _ in range(200_000))
    chat = Conversation("A pasted dump", time.time() - 3600)
    chat.add("user", "what is in this dump")
    chat.add("assistant", "zebrafish first, then " + dump)
    response = client.post("/api/sessions/import", content=json.dumps([chat.data]).encode())
    assert response.status_code == 201, response.text
    found = client.get("/api/search", params={"q": "zebrafish"}).json()["results"]
    assert [r["role"] for r in found] == ["assistant"]
    assert {"text": "zebrafish", "match": True} in found[0]["snippet_parts"]
