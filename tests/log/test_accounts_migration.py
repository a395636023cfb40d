"""Layer: the log's migrations (log/migrations.py, m005_accounts) on a copy of a data
directory made by Tether before accounts existed (fixtures/made-at-m003: two sessions, one
with a finished turn, written by the server of that day). Upgraded to `--auth accounts`,
its sessions are the first admin's, whole, and nobody else's (docs/api.md §15)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from accounts_kit import add_user, sign_in, tether_users
from helpers import new_session, running_server

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "made-at-m003"


def _migrations(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [name for (name,) in conn.execute("SELECT name FROM migrations ORDER BY name")]
    finally:
        conn.close()


def test_a_single_user_data_directory_becomes_the_first_admins(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE, data)
    assert _migrations(data / "tether.db") == [
        "m001_events",
        "m002_session_index",
        "m003_attachment_owners",
    ]
    made = tether_users(data, "add", "alice", "--admin", password="alice-pass-1")
    assert made.returncode == 0, made.stderr
    assert "alice now owns the 2 session(s) made before accounts" in made.stdout
    assert _migrations(data / "tether.db")[-1] == "m007_search_words_with_marks"
    add_user(data, "bob")  # added later: owns nothing

    with running_server(data, "--auth", "accounts") as srv:
        alice, bob = sign_in(srv, "alice"), sign_in(srv, "bob")
        rows = alice.get("/api/sessions").json()["sessions"]
        assert sorted(r["title"] for r in rows) == ["Before accounts", "Second"]
        old = next(r for r in rows if r["title"] == "Before accounts")
        view = alice.get("/api/session", params={"session_id": old["session_id"]}).json()
        texts = [m.get("content") for m in view["session"]["messages"]]
        assert texts[0] == "hello from the single-user days" and len(texts) == 2
        # m006 copied the old turns' text: the list's `q` finds them (in any case)
        found = alice.get("/api/sessions", params={"q": "SINGLE-USER"}).json()["sessions"]
        assert [r["session_id"] for r in found] == [old["session_id"]]
        assert bob.get("/api/sessions").json() == {"sessions": []}
        refused = bob.get("/api/session", params={"session_id": old["session_id"]})
        assert refused.status_code == 404 and refused.json()["code"] == "session_not_found"
        alice.close()
        bob.close()

    # Back in the single-user mode for a while: everything is visible, as before accounts,
    # and a session made then has no owner...
    with running_server(data) as srv, srv.client() as anyone:
        assert len(anyone.get("/api/sessions").json()["sessions"]) == 2
        later = new_session(anyone, "made without accounts")
    # ...until the next start with accounts gives it to the first admin.
    with running_server(data, "--auth", "accounts") as srv:
        alice, bob = sign_in(srv, "alice"), sign_in(srv, "bob")
        assert later in alice.get("/api/sessions").text
        assert later not in bob.get("/api/sessions").text
        alice.close()
        bob.close()


def test_a_second_admin_claims_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURE, data)
    add_user(data, "alice", admin=True)
    second = tether_users(data, "add", "carol", "--admin", password="carol-pass-333")
    assert second.returncode == 0 and "owns" not in second.stdout
    with running_server(data, "--auth", "accounts") as srv:
        carol = sign_in(srv, "carol")
        assert carol.get("/api/sessions").json() == {"sessions": []}
        carol.close()
