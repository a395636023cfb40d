"""Inactive compression continuation recovery from the agent profile's `state.db` lineage.

The Hermes profile's SQLite lineage owns the canonical continuation, also when the agent's
CLI compressed a session behind Tether's back. This module only reads `state.db` (stdlib
`sqlite3`, read-only URI; no Hermes import) and answers: does this agent session continue in
another one?

A continuation edge parent → child is authorized only when all hold:

- the parent ended with `end_reason = 'compression'` and the child started at or after the
  parent's `ended_at` (Hermes' own edge definition);
- the child belongs to the same profile (`profile_name` equal, NULL meaning the default
  profile): a foreign-profile row never authorizes;
- the child is not a delegated/tool child (`model_config._delegate_from`, or a `tool` /
  `delegate` / `subagent` source) and not a branch (`model_config._branched_from`);
- the child is live, or was closed automatically (`idle_timeout`, and `agent_close` /
  `ws_orphan_reap`, which Hermes itself reopens). A child that ended for an explicit reason
  (`cli_close`, `branched`, `session_reset`, ...) or an unknown one does not authorize; a
  child that itself ended by `compression` is followed to its own child.

Reading never reopens a session, and never copies ancestor history into a model context.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MAX_HOPS = 32
# Closures no one chose: the contract's `idle_timeout`, and the two that hermes-agent itself
# treats as resumable (`hermes_state`: a process closing its agent, a reaped websocket).
AUTOMATIC_CLOSURES = frozenset({"idle_timeout", "agent_close", "ws_orphan_reap"})
DELEGATED_SOURCES = frozenset({"tool", "delegate", "delegation", "subagent"})


@dataclass(frozen=True)
class SessionRow:
    id: str
    source: str | None
    parent_session_id: str | None
    started_at: float
    ended_at: float | None
    end_reason: str | None
    profile_name: str | None
    model_config: str | None

    @property
    def config(self) -> dict:
        try:
            value = json.loads(self.model_config or "{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@contextmanager
def read_only(db_path: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection, or None when there is no state.db yet. `state.db` is another
    program's file: text that is not UTF-8 reads with U+FFFD in place of the bad bytes, since
    sqlite3's strict decoding would fail the whole query, and a pass would see nothing of
    the session (or of every CLI session) around that one value."""
    if not db_path.exists():
        yield None
        return
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    db.text_factory = _lenient_text
    try:
        yield db
    finally:
        db.close()


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


_COLUMNS = (  # times as numbers, whatever type a writer gave them (reconcile.read_rows)
    "id, source, parent_session_id, CAST(started_at AS REAL), CAST(ended_at AS REAL), "
    "end_reason, profile_name, model_config"
)


def session_row(db: sqlite3.Connection, session_id: str) -> SessionRow | None:
    row = db.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return SessionRow(*row) if row else None


def children(db: sqlite3.Connection, session_id: str) -> list[SessionRow]:
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM sessions WHERE parent_session_id = ? "
        "ORDER BY CAST(started_at AS REAL), id",
        (session_id,),
    ).fetchall()
    return [SessionRow(*row) for row in rows]


def _same_profile(parent: SessionRow, child: SessionRow, profile: str | None) -> bool:
    want = profile if profile is not None else parent.profile_name
    return (child.profile_name or None) == (want or None)


def is_continuation_edge(parent: SessionRow, child: SessionRow, profile: str | None) -> bool:
    """The structural edge: compression parent, same profile, not delegated, not a branch."""
    if parent.end_reason != "compression" or parent.ended_at is None:
        return False
    if child.started_at < parent.ended_at:
        return False
    if not _same_profile(parent, child, profile):
        return False
    config = child.config
    if config.get("_delegate_from") or config.get("_branched_from"):
        return False
    return (child.source or "").lower() not in DELEGATED_SOURCES


def continuation_of(db_path: Path, session_id: str, profile: str | None = None) -> str | None:
    """The newest authorized continuation of `session_id`, or None (no compression, or the
    lineage does not authorize one). Bounded: at most MAX_HOPS edges are followed."""
    with read_only(db_path) as db:
        if db is None:
            return None
        try:
            current = session_row(db, session_id)
        except sqlite3.Error:
            return None
        found: str | None = None
        seen = {session_id}
        for _ in range(MAX_HOPS):
            if current is None:
                break
            edges = [
                c
                for c in children(db, current.id)
                if c.id not in seen and is_continuation_edge(current, c, profile)
            ]
            if len(edges) != 1:  # none, or ambiguous: authorize nothing further
                break
            child = edges[0]
            seen.add(child.id)
            if child.end_reason is None or child.end_reason in AUTOMATIC_CLOSURES:
                found = child.id
                current = child
                continue
            if child.end_reason == "compression":  # compressed again: follow it
                current = child
                continue
            break  # an explicit or unknown terminal reason: not a continuation
        return found


def live_tip(db_path: Path, session_id: str, profile: str | None = None) -> str:
    """The agent session a new sidecar should continue: the newest continuation, else the
    session itself."""
    return continuation_of(db_path, session_id, profile) or session_id
