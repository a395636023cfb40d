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
And how far a sync pass examined each session's agent rows without finding anything to
import (`examined`): Tether's own turns' rows, mostly. The log's `agent.imported` carries the
watermark of every pass that imported something; a pass that found nothing writes no event
and moves this private mark instead, which lives beside the facts that made those rows
nothing to import and survives a restart with them (the next pass starts after the greater
of the two). Within a turn's range, the rows the turn's agent itself wrote (`turn_writes`:
the ids its `SessionDB` returned, reported by the sidecar) are the evidence: another client
writing into the same agent session meanwhile writes rows with other ids, not Tether's.
"""

from __future__ import annotations

import json
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


@dataclass(frozen=True)
class TurnRange:
    """The `state.db` rows written while one Tether turn ran: `(after_id, through_id]`, and
    of those the ids the turn's own agent wrote (None: not known, the whole range is its)."""

    stream_id: str
    after_id: int
    through_id: int
    written: frozenset[int] | None = None

    def owns(self, row_id: int) -> bool:
        """Is this row Tether's own turn's? Only when the evidence says so."""
        if not self.after_id < row_id <= self.through_id:
            return False
        return self.written is None or row_id in self.written


_PROOF_COLUMNS = (
    "tether_session_id, stream_id, turn_id, agent_session_id, persist_user_timestamp, source"
)


class ProofStore:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        # One connection for the store's life, used from worker threads one at a time (the
        # lock): no connect and journal-mode pragma per call on a turn's path.
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        had_adopted = bool(
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'adopted'"
            ).fetchall()
        )
        self._db.executescript("""
            CREATE TABLE IF NOT EXISTS proofs (
                tether_session_id TEXT NOT NULL, stream_id TEXT NOT NULL PRIMARY KEY,
                turn_id TEXT NOT NULL, agent_session_id TEXT NOT NULL,
                persist_user_timestamp REAL NOT NULL, source TEXT NOT NULL,
                recorded_at REAL NOT NULL);
            CREATE INDEX IF NOT EXISTS proofs_agent ON proofs(agent_session_id);
            CREATE TABLE IF NOT EXISTS bindings (
                agent_session_id TEXT NOT NULL PRIMARY KEY, tether_session_id TEXT NOT NULL,
                bound_at REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS turn_rows (
                stream_id TEXT NOT NULL PRIMARY KEY, tether_session_id TEXT NOT NULL,
                after_id INTEGER NOT NULL, through_id INTEGER);
            CREATE TABLE IF NOT EXISTS turn_writes (
                stream_id TEXT NOT NULL PRIMARY KEY, row_ids TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS examined (
                tether_session_id TEXT NOT NULL PRIMARY KEY, through_id INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS adopted (agent_session_id TEXT NOT NULL PRIMARY KEY);
        """)
        if not had_adopted:  # a ledger from before: its adoptions were all completed
            self._db.execute("INSERT OR IGNORE INTO adopted SELECT agent_session_id FROM bindings")

    def _run(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def record(self, proof: Proof) -> None:
        self._run(
            "INSERT OR REPLACE INTO proofs VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                proof.tether_session_id,
                proof.stream_id,
                proof.turn_id,
                proof.agent_session_id,
                proof.persist_user_timestamp,
                proof.source,
                time.time(),
            ),
        )

    def for_sessions(self, agent_session_ids: list[str]) -> list[Proof]:
        if not agent_session_ids:
            return []
        marks = ",".join("?" * len(agent_session_ids))
        return [
            Proof(*row)
            for row in self._run(
                f"SELECT {_PROOF_COLUMNS} FROM proofs WHERE agent_session_id IN ({marks})",
                agent_session_ids,
            )
        ]

    # -- bindings -------------------------------------------------------------------------------
    def bind(self, tether_session_id: str, agent_session_id: str) -> bool:
        """Record that this Tether session drives this agent session. An agent session has
        one Tether session: the first binding stands. True when it is (now) this one's."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?)",
                (agent_session_id, tether_session_id, time.time()),
            )
        return self.tether_session_of(agent_session_id) == tether_session_id

    def adopted(self, agent_session_id: str) -> None:
        """The Tether session made for this agent session (started in the CLI) exists: from
        now on the agent session counts as driven by Tether even once that session is
        deleted, so a deletion is not undone by the next pass adopting it again."""
        self._run("INSERT OR IGNORE INTO adopted VALUES (?)", (agent_session_id,))

    def adoptions(self) -> set[str]:
        return {r[0] for r in self._run("SELECT agent_session_id FROM adopted")}

    @property
    def generation(self) -> int:
        """Moves with every new binding, whichever process made it: replicas sharing a Hermes
        home share this ledger, and each one's sync poll must see the others' bindings
        (watch.py: the poll's first question). Bindings are only ever added, so the highest
        rowid is their version, read in O(1)."""
        return self._run("SELECT COALESCE(MAX(rowid), 0) FROM bindings")[0][0]

    def agent_sessions(self, tether_session_id: str) -> list[str]:
        """The agent sessions this Tether session drives, oldest binding first."""
        return [
            r[0]
            for r in self._run(
                "SELECT agent_session_id FROM bindings WHERE tether_session_id = ? "
                "ORDER BY bound_at, rowid",
                (tether_session_id,),
            )
        ]

    def tether_session_of(self, agent_session_id: str) -> str | None:
        rows = self._run(
            "SELECT tether_session_id FROM bindings WHERE agent_session_id = ?", (agent_session_id,)
        )
        return rows[0][0] if rows else None

    def bindings(self) -> dict[str, list[str]]:
        """Every Tether session with its agent sessions."""
        out: dict[str, list[str]] = {}
        for tether_id, agent_id in self._run(
            "SELECT tether_session_id, agent_session_id FROM bindings ORDER BY bound_at, rowid"
        ):
            out.setdefault(tether_id, []).append(agent_id)
        return out

    # -- the rows each Tether turn wrote ----------------------------------------------------------
    def turn_started(self, tether_session_id: str, stream_id: str, after_id: int) -> None:
        self._run(
            "INSERT OR REPLACE INTO turn_rows VALUES (?, ?, ?, NULL)",
            (stream_id, tether_session_id, after_id),
        )

    def turn_ended(self, stream_id: str, through_id: int, written: list[int] | None = None) -> None:
        """The turn is done: its range ends at `through_id`; `written` are the row ids its
        agent wrote (None when the sidecar could not say: the whole range is then the
        turn's, as before this evidence existed)."""
        self._run(
            "UPDATE turn_rows SET through_id = MAX(COALESCE(through_id, 0), ?) WHERE stream_id = ?",
            (through_id, stream_id),
        )
        if written is not None:
            self._run(
                "INSERT OR REPLACE INTO turn_writes VALUES (?, ?)",
                (stream_id, json.dumps(sorted(set(written)))),
            )

    # -- how far passes looked without importing anything ------------------------------------
    def examined(self, tether_session_id: str) -> int:
        rows = self._run(
            "SELECT through_id FROM examined WHERE tether_session_id = ?", (tether_session_id,)
        )
        return int(rows[0][0]) if rows else 0

    def examined_through(self, tether_session_id: str, through_id: int) -> None:
        """Every agent row of this session up to `through_id` holds nothing to import."""
        self._run(
            "INSERT INTO examined VALUES (?, ?) ON CONFLICT(tether_session_id) DO UPDATE "
            "SET through_id = MAX(through_id, excluded.through_id)",
            (tether_session_id, through_id),
        )

    def turn_ranges(self, tether_session_id: str) -> list[TurnRange]:
        """Every ended turn: `(after_id, through_id]` and the rows its agent wrote in it."""
        return [
            TurnRange(stream, int(a), int(b), None if ids is None else frozenset(json.loads(ids)))
            for stream, a, b, ids in self._run(
                "SELECT r.stream_id, r.after_id, r.through_id, w.row_ids FROM turn_rows r "
                "LEFT JOIN turn_writes w ON w.stream_id = r.stream_id "
                "WHERE r.tether_session_id = ? AND r.through_id IS NOT NULL",
                (tether_session_id,),
            )
        ]
