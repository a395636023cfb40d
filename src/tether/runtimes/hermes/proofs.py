"""The private `persist_user_timestamp` proofs (contract invariant 5).

A proof says: for this Tether turn (session, stream, turn) the sidecar confirmed that this
exact timestamp was passed to `run_conversation` as `persist_user_timestamp`, in this agent
session. Reconciliation may hide the agent's user row of that turn only with a proof that
still matches the stream, the source and the timestamp. Proofs live beside the Hermes home
(`tether-proofs.sqlite`), never in the event log's public payloads.
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
