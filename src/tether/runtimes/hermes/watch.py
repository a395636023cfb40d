"""Has anything the sync poll cares about moved? Asked at the cost of one pragma (issue 18).

Every `--agent-sync-seconds` the agent sync asks which Tether sessions' agent rows moved and
whether a person started a session in the CLI. Most passes find nothing, and a pass that
reads `state.db`'s sessions table and every binding costs O(sessions). `AgentWatch` answers
"nothing moved" first, from:

- `PRAGMA data_version` on a read-only connection kept open on `state.db`: SQLite changes it
  whenever another connection (hermes-agent, its CLI) commits, and only then;
- the file's identity (device, inode), so a `state.db` replaced by a restore is reopened;
- the ledger's binding generation (`ProofStore.generation`, one O(1) read of the ledger):
  Tether binding a session (a continuation, an adopted CLI session), on this replica or on
  another sharing the Hermes home, gives it a first look though `state.db` is unchanged.

The bindings are read from the ledger only when their generation moved. Only when something
moved does a pass read further (`agent_view.changes`, `agent_view.started_elsewhere`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.runtimes.hermes.agent_view import changes, started_elsewhere
from tether.runtimes.hermes.proofs import ProofStore

Version = tuple[int, int, int, int]  # (st_dev, st_ino, data_version, binding generation)


class AgentWatch:
    """Blocking: call its methods in a thread (one at a time: they share a connection)."""

    def __init__(self, state_db: Path, proofs: ProofStore, profile: str | None):
        self.state_db = state_db
        self.proofs = proofs
        self.profile = profile
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._file: tuple[int, int] | None = None
        self._bindings: dict[str, list[str]] = {}
        self._bindings_generation = -1
        self._fingerprints: dict[str, tuple] = {}
        self._looked: dict[str, Version | None] = {}  # what each question last saw

    def _version(self) -> Version | None:
        """None without a `state.db` (or while it cannot be read)."""
        try:
            stat = os.stat(self.state_db)
        except OSError:
            self._close()
            return None
        identity = (stat.st_dev, stat.st_ino)
        if self._db is None or self._file != identity:
            self._close()
            self._db = sqlite3.connect(
                f"file:{self.state_db}?mode=ro", uri=True, timeout=5, check_same_thread=False
            )
            self._file = identity
        try:
            (data_version,) = self._db.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error:
            self._close()
            return None
        return (*identity, int(data_version), self.proofs.generation)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
        self._db = None
        self._file = None

    def _moved(self, question: str) -> tuple[bool, Version | None]:
        """Whether `question` must be answered anew, and the version to record then."""
        version = self._version()
        return not (question in self._looked and self._looked[question] == version), version

    def bindings(self) -> dict[str, list[str]]:
        """Every Tether session with its agent sessions, read again only once they changed."""
        generation = self.proofs.generation
        if generation != self._bindings_generation:
            self._bindings = self.proofs.bindings()
            self._bindings_generation = generation
        return self._bindings

    def changed(self) -> list[str]:
        """The Tether sessions whose agent rows or lineage moved since the last call."""
        with self._lock:
            moved, version = self._moved("changed")
            if not moved:
                return []
            found = changes(self.state_db, self.bindings(), self._fingerprints)
            self._looked["changed"] = version  # read before the look: later commits count
            return found

    def started_elsewhere(self, exists: Callable[[str], bool]) -> list[dict[str, Any]]:
        """Sessions a person started in the CLI/TUI that no existing Tether session drives
        and that were never adopted (one deleted in Tether stays deleted; one bound by a
        pass that crashed before it created the session is completed), when `state.db` or
        the bindings moved since the last call."""
        with self._lock:
            moved, version = self._moved("started_elsewhere")
            if not moved:
                return []
            known = self.proofs.adoptions() | {
                agent
                for tether_id, agents in self.bindings().items()
                if exists(tether_id)
                for agent in agents
            }
            found = started_elsewhere(self.state_db, known, self.profile)
            self._looked["started_elsewhere"] = version
            return found

    def look_again(self) -> None:
        """A pass failed after asking: the next one asks anew."""
        with self._lock:
            self._looked.clear()

    def close(self) -> None:
        with self._lock:
            self._close()
