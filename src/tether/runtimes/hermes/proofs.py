"""The private `persist_user_timestamp` proofs (contract invariant 5).

A proof says: for this Tether turn (session, stream, turn) the sidecar confirmed that this
exact timestamp was passed to `run_conversation` as `persist_user_timestamp`, in this agent
session. Reconciliation may hide the agent's user row of that turn only with a proof that
still matches the stream, the source and the timestamp. Proofs live beside the Hermes home
(`tether-proofs.sqlite`), never in the event log's public payloads.

The same file keeps the two other private facts reconciliation needs: which agent sessions
each Tether session drives (`bindings`: its own, and the continuations its turns rotated
into), and which `state.db` rows each Tether turn wrote (`turn_rows`: the message ids from
the turn's start to its end in the agent's sessions), so that nothing Tether's log already
holds is imported twice, including the rows a compaction rewrote during a Tether turn.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SOURCE = "tether"


@dataclass(frozen=True)
class Proof:
    tether_session_id: str
    stream_id: str
    turn_id: str
    agent_session_id: str
    persist_user_timestamp: float
    source: str = SOURCE


class ProofStore:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("""CREATE TABLE IF NOT EXISTS proofs (
                tether_session_id TEXT NOT NULL, stream_id TEXT NOT NULL PRIMARY KEY,
                turn_id TEXT NOT NULL, agent_session_id TEXT NOT NULL,
                persist_user_timestamp REAL NOT NULL, source TEXT NOT NULL,
                recorded_at REAL NOT NULL)""")
            db.execute("CREATE INDEX IF NOT EXISTS proofs_agent ON proofs(agent_session_id)")
            db.execute("""CREATE TABLE IF NOT EXISTS bindings (
                agent_session_id TEXT NOT NULL PRIMARY KEY, tether_session_id TEXT NOT NULL,
                bound_at REAL NOT NULL)""")
            db.execute("""CREATE TABLE IF NOT EXISTS turn_rows (
                stream_id TEXT NOT NULL PRIMARY KEY, tether_session_id TEXT NOT NULL,
                after_id INTEGER NOT NULL, through_id INTEGER)""")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def record(self, proof: Proof) -> None:
        with self._lock, self._connect() as db:
            db.execute("INSERT OR REPLACE INTO proofs VALUES (?, ?, ?, ?, ?, ?, ?)", (
                proof.tether_session_id, proof.stream_id, proof.turn_id,
                proof.agent_session_id, proof.persist_user_timestamp, proof.source,
                time.time()))

    def for_sessions(self, agent_session_ids: list[str]) -> list[Proof]:
        if not agent_session_ids:
            return []
        marks = ",".join("?" * len(agent_session_ids))
        with self._lock, self._connect() as db:
            rows = db.execute(
                "SELECT tether_session_id, stream_id, turn_id, agent_session_id, "
                f"persist_user_timestamp, source FROM proofs WHERE agent_session_id IN ({marks})",
                agent_session_ids).fetchall()
        return [Proof(*row) for row in rows]

    def for_tether_session(self, tether_session_id: str) -> list[Proof]:
        with self._lock, self._connect() as db:
            rows = db.execute(
                "SELECT tether_session_id, stream_id, turn_id, agent_session_id, "
                "persist_user_timestamp, source FROM proofs WHERE tether_session_id = ?",
                (tether_session_id,)).fetchall()
        return [Proof(*row) for row in rows]

    # -- bindings -------------------------------------------------------------------------------
    def bind(self, tether_session_id: str, agent_session_id: str) -> bool:
        """Record that this Tether session drives this agent session. An agent session has
        one Tether session: the first binding stands. True when it is (now) this one's."""
        with self._lock, self._connect() as db:
            db.execute("INSERT OR IGNORE INTO bindings VALUES (?, ?, ?)",
                       (agent_session_id, tether_session_id, time.time()))
            row = db.execute("SELECT tether_session_id FROM bindings WHERE agent_session_id = ?",
                             (agent_session_id,)).fetchone()
        return row is not None and row[0] == tether_session_id

    def agent_sessions(self, tether_session_id: str) -> list[str]:
        """The agent sessions this Tether session drives, oldest binding first."""
        with self._lock, self._connect() as db:
            rows = db.execute("SELECT agent_session_id FROM bindings WHERE tether_session_id = ? "
                              "ORDER BY bound_at, rowid", (tether_session_id,)).fetchall()
        return [r[0] for r in rows]

    def tether_session_of(self, agent_session_id: str) -> str | None:
        with self._lock, self._connect() as db:
            row = db.execute("SELECT tether_session_id FROM bindings WHERE agent_session_id = ?",
                             (agent_session_id,)).fetchone()
        return row[0] if row else None

    def bindings(self) -> dict[str, list[str]]:
        """Every Tether session with its agent sessions."""
        with self._lock, self._connect() as db:
            rows = db.execute("SELECT tether_session_id, agent_session_id FROM bindings "
                              "ORDER BY bound_at, rowid").fetchall()
        out: dict[str, list[str]] = {}
        for tether_id, agent_id in rows:
            out.setdefault(tether_id, []).append(agent_id)
        return out

    # -- the rows each Tether turn wrote ----------------------------------------------------------
    def turn_started(self, tether_session_id: str, stream_id: str, after_id: int) -> None:
        with self._lock, self._connect() as db:
            db.execute("INSERT OR REPLACE INTO turn_rows VALUES (?, ?, ?, NULL)",
                       (stream_id, tether_session_id, after_id))

    def turn_ended(self, stream_id: str, through_id: int) -> None:
        with self._lock, self._connect() as db:
            db.execute("UPDATE turn_rows SET through_id = MAX(COALESCE(through_id, 0), ?) "
                       "WHERE stream_id = ?", (through_id, stream_id))

    def turn_ranges(self, tether_session_id: str) -> list[tuple[int, int]]:
        """`(after_id, through_id]` of every ended turn: rows Tether's log already holds."""
        with self._lock, self._connect() as db:
            rows = db.execute("SELECT after_id, through_id FROM turn_rows WHERE "
                              "tether_session_id = ? AND through_id IS NOT NULL",
                              (tether_session_id,)).fetchall()
        return [(int(a), int(b)) for a, b in rows]
