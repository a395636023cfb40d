"""The event vocabulary of docs/api.md §6 and the envelope every layer speaks.

The log stores these; every projection folds them; the SSE stream sends them verbatim.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

SESSION_CREATED = "session.created"
SESSION_UPDATED = "session.updated"
SESSION_ROTATED = "session.rotated"
TURN_SUBMITTED = "turn.submitted"
RUN_STARTED = "run.started"
REASONING_DELTA = "reasoning.delta"
REASONING_TRIMMED = "reasoning.trimmed"  # extension: an echo stripped from a reasoning item
TEXT_DELTA = "text.delta"
TOOL_STARTED = "tool.started"
TOOL_COMPLETED = "tool.completed"
COMPRESSION_STARTED = "compression.started"
COMPRESSION_COMPLETED = "compression.completed"
RUN_CANCEL_REQUESTED = "run.cancel_requested"
STEER_ACCEPTED = "steer.accepted"
STEER_DELIVERED = "steer.delivered"  # extension: where the agent took the steer in
STEER_LEFTOVER = "steer.leftover"
# extensions: the agent asked before running something flagged dangerous, and the answer
APPROVAL_REQUESTED = "approval.requested"
APPROVAL_RESOLVED = "approval.resolved"
# extensions: the agent asked the user a question (Hermes' clarify tool), and the answer
CLARIFY_REQUESTED = "clarify.requested"
CLARIFY_RESOLVED = "clarify.resolved"
QUEUE_ADDED = "queue.added"
QUEUE_UPDATED = "queue.updated"
QUEUE_REMOVED = "queue.removed"
RUN_FINISHED = "run.finished"
TRANSCRIPT_TRUNCATED = "transcript.truncated"
# extension (docs/api.md §10): another branch of the transcript is shown from a fork on.
BRANCH_SWITCHED = "branch.switched"
# extension: what another client of the agent wrote into the agent's own store (Hermes
# state.db), reconciled into this session: turns to show, and a compaction done elsewhere.
AGENT_IMPORTED = "agent.imported"

# Terminal states of a run (docs/api.md §4): every run ends in exactly one of these.
RUN_STATES = (
    "completed",
    "cancelled",
    "interrupted",
    "error",
    "tool_limit_reached",
    "compression_exhausted",
)


# How a compression summary is framed in a model context (contract invariant 6): reference
# material for the agent, never a request from the user. Runtimes and the context projection
# both use it, so what the model saw mid-turn and what the next turn gets read the same.
SUMMARY_PREFIX = (
    "Summary of the earlier conversation (automatic context compression; reference material "
    "for you, not a new request from the user):\n\n"
)


def summary_message(summary: str) -> dict[str, Any]:
    return {"role": "system", "content": SUMMARY_PREFIX + summary}


def new_id(prefix: str) -> str:
    """Opaque, URL-safe and unguessable; the prefix only helps a human reading logs."""
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class Event:
    """One durable entry of a session's log. `seq` is its position: 1, 2, 3, ... per session."""

    session_id: str
    seq: int
    type: str
    at: float
    data: dict[str, Any] = field(default_factory=dict)
    stream_id: str | None = None
    turn_id: str | None = None

    def envelope(self) -> dict[str, Any]:
        env: dict[str, Any] = {
            "seq": self.seq,
            "session_id": self.session_id,
            "type": self.type,
            "at": self.at,
        }
        if self.stream_id is not None:
            env["stream_id"] = self.stream_id
        if self.turn_id is not None:
            env["turn_id"] = self.turn_id
        env["data"] = self.data
        return env

    @classmethod
    def from_envelope(cls, env: dict[str, Any]) -> Event:
        return cls(
            session_id=env["session_id"],
            seq=env["seq"],
            type=env["type"],
            at=env["at"],
            data=env.get("data") or {},
            stream_id=env.get("stream_id"),
            turn_id=env.get("turn_id"),
        )
