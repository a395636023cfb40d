"""Layer: the SQLite search index's tokenizer (log/migrations.py m007) and the query's words
(sessions/search.py `search_terms`). Invariant: a query word is never split where the index
keeps one word, or the word is not found (docs/api.md §13). Every letter, digit and
combining mark Python's Unicode data knows (and the private-use areas' ends) is checked
between two letters, in the index as migrated and in the query; punctuation and `_`
separate words in both."""

from __future__ import annotations

import sqlite3
import sys
import unicodedata

from tether.log.migrations import apply_migrations
from tether.sessions.search import search_terms

BATCH = 100  # characters to a row
# The private-use areas' ends: their 137,000 characters are one category, read alike.
PRIVATE_USE = ["\ue000", "\uf8ff", "\U000f0000", "\U000ffffd", "\U00100000", "\U0010fffd"]


def test_letters_digits_and_marks_stay_inside_one_word_in_the_index_and_the_query() -> None:
    chars = [
        chr(code)
        for code in range(1, sys.maxunicode + 1)
        if unicodedata.category(chr(code))[0] in "LNM"
    ] + PRIVATE_USE
    separators = [" ", "_", "-", "'", ".", "\u00a0", "\u2014"]
    batches = [chars[i : i + BATCH] for i in range(0, len(chars), BATCH)] + [separators]
    db = sqlite3.connect(":memory:", isolation_level=None)
    apply_migrations(db)
    db.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, search_fts, 'instance')")
    db.executemany(  # one row per batch: each character between two letters, spaces between
        "INSERT INTO search_rows (id, session_id, row_id, role, position, at, text) "
        "VALUES (?, 's', 'r', 'user', 0, 0, ?)",
        [(n, " ".join(f"z{c}z" for c in batch)) for n, batch in enumerate(batches)],
    )
    tokens = dict(db.execute("SELECT doc, count(*) FROM temp.vocab GROUP BY doc"))
    split_by_index = [b for n, b in enumerate(batches[:-1]) if tokens[n] != len(b)]
    split_by_query = [c for c in chars if len(search_terms(f"z{c}z")) != 1]
    assert split_by_index == [] and split_by_query == []
    assert len(chars) > 100_000  # the whole of Unicode's letters, not a sample
    assert tokens[len(batches) - 1] == 2 * len(separators)
    assert all(search_terms(f"z{c}z") == ["z", "z"] for c in separators)
