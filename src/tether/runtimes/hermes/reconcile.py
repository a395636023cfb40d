"""Reconciliation of Hermes `state.db` rows into Tether's view (contract invariant 5).

Pure functions over rows read from `state.db` (`read_rows`: read-only, stdlib `sqlite3`) and
Tether's private proofs (`proofs.py`). What they decide:

- **The agent's copy of a Tether turn is hidden** only with a proof: a proof whose agent
  session, source (`tether`) and exact `persist_user_timestamp` equal the user row's, and
  that row alone in its (session, timestamp) bucket. The row's text is never evidence. The
  user row and the assistant/tool rows of its turn are hidden from display (Tether's log
  already holds that turn). Several user rows sharing a proven timestamp form an ambiguous
  bucket: its rows are all kept, in the display and the model context (no durable row
  identity proves which one is Tether's). The contract also asks to omit such a bucket
  from display while the proven turn is active; Tether never reconciles then at all (no
  sync pass runs while a turn is open: `runs/agent_sync.py`, `HermesRuntime.agent_news`).
- **Native-image mirrors**: a rich multipart value and a scalar one that replaces each
  image part with `[screenshot]` are one message only with all the evidence (`is_mirror`);
  `agent_view` then shows the rich form and sends the agent's expanded payload. Anything
  missing or contradictory shows the row as written. Literal `[screenshot]` text alone
  proves nothing.
- **Bounded and idempotent**: a pass reads at most `limit` rows after a watermark (the
  highest row id seen) and returns the next watermark; the same input gives the same output,
  and a second pass from the returned watermark imports nothing already imported.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.runtimes.hermes.lineage import read_only
from tether.runtimes.hermes.proofs import SOURCE, Proof

IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
SCREENSHOT = "[screenshot]"
DEFAULT_LIMIT = 2000


@dataclass(frozen=True)
class Row:
    """One message row: from state.db (`row_id` set) or from Tether's side (`row_id` None
    unless it carries a durable agent row id)."""

    role: str
    content: Any
    timestamp: float
    session_id: str = ""
    row_id: int | None = None
    api_content: Any = None
    tool_calls: Any = None
    tool_call_id: str | None = None
    provider: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    reasoning: str | None = None
    archived: bool = False  # soft-archived by a compaction (`active = 0, compacted = 1`)


def _loads(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# SQLite keeps whatever type a writer gives a value (state.db is another program's file):
# content as bytes reads as text, a time that is no number as 0, never a failed pass.
_TEXT = "CASE WHEN typeof({0}) = 'blob' THEN CAST({0} AS TEXT) ELSE {0} END"


def read_rows(
    db_path: Path,
    session_ids: list[str],
    after_id: int = 0,
    limit: int = DEFAULT_LIMIT,
    *,
    archived: bool = False,
    floors: dict[str, int] | None = None,
) -> list[Row]:
    """Rows of these agent sessions with id > after_id, oldest first, at most limit: the
    active ones and, with `archived`, those a compaction soft-archived (never the rows an
    undo removed). `floors`: for some of the sessions, a higher id to start after."""
    if not session_ids:
        return []
    marks = ",".join("?" * len(session_ids))
    live = "(active = 1 OR compacted = 1)" if archived else "active = 1"
    floors = floors or {}
    above = "".join(" AND NOT (session_id = ? AND id <= ?)" for _ in floors)
    with read_only(db_path) as db:
        if db is None:
            return []
        try:
            rows = db.execute(
                f"SELECT id, session_id, role, {_TEXT.format('content')}, api_content, "
                "tool_calls, tool_call_id, CAST(timestamp AS REAL), reasoning, active "
                f"FROM messages WHERE session_id IN ({marks}) "
                f"AND id > ?{above} AND {live} ORDER BY id LIMIT ?",
                [*session_ids, after_id, *(v for pair in floors.items() for v in pair), limit],
            ).fetchall()
        except sqlite3.Error:
            return []
    return [
        Row(
            role=r[2],
            content=r[3],
            timestamp=float(r[7]),
            session_id=r[1],
            row_id=r[0],
            api_content=_loads(r[4]),
            tool_calls=_loads(r[5]),
            tool_call_id=r[6],
            reasoning=r[8] or None,
            archived=not r[9],
        )
        for r in rows
    ]


def max_row_id(db_path: Path) -> int:
    """The newest message row id in `state.db` (0 when there is none yet)."""
    with read_only(db_path) as db:
        if db is None:
            return 0
        try:
            return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0])
        except sqlite3.Error:
            return 0


# -- native-image mirrors -----------------------------------------------------------------------
def scalar_projection(parts: Any) -> str | None:
    """Hermes' scalar form of a multipart value (text parts, each image as `[screenshot]`,
    one per line), or None unless it holds non-empty text and a recognized image part."""
    if not isinstance(parts, list):
        return None
    texts, has_text, has_image = [], False, False
    for part in parts:
        if not isinstance(part, dict):
            return None
        if part.get("type") == "text":
            value = str(part.get("text", ""))
            has_text = has_text or bool(value.strip())
            texts.append(value)
        elif part.get("type") in IMAGE_PART_TYPES:
            has_image = True
            texts.append(SCREENSHOT)
    return "\n".join(texts) if has_text and has_image else None


def _rich_value(row: Row) -> Any:
    return row.content if isinstance(row.content, list) else row.api_content


def is_mirror(rich: Row, scalar: Row) -> bool:
    """All of the contract's evidence, or False."""
    projection = scalar_projection(_rich_value(rich))
    if projection is None or not isinstance(scalar.content, str):
        return False
    if scalar.content != projection:  # exact: the marker text alone is not evidence
        return False
    if rich.role != scalar.role or (rich.tool_call_id or None) != (scalar.tool_call_id or None):
        return False
    if bool(rich.tool_calls) != bool(scalar.tool_calls):
        return False
    if rich.timestamp != scalar.timestamp:
        return False
    if rich.row_id is not None and scalar.row_id is not None and rich.row_id != scalar.row_id:
        return False
    for key in set(rich.provider) & set(scalar.provider):
        if rich.provider[key] != scalar.provider[key]:
            return False
    return True


# -- proofs and foreign turns -------------------------------------------------------------------
@dataclass
class Reconciled:
    display: list[Row]  # foreign rows to show, in order
    context: list[Row]  # every examined row of foreign or ambiguous turns, in order
    hidden: list[int]  # row ids of Tether's own (proven) turns
    watermark: int


def turns(rows: list[Row]) -> list[list[Row]]:
    """Rows split at each user row (per agent session), oldest first."""
    turns: list[list[Row]] = []
    current: dict[str, list[Row]] = {}
    for row in rows:
        if row.role == "user" or row.session_id not in current:
            current[row.session_id] = [row]
            turns.append(current[row.session_id])
        else:
            current[row.session_id].append(row)
    return turns


def reconcile(
    rows: list[Row],
    proofs: list[Proof],
    *,
    watermark: int = 0,
    limit: int = DEFAULT_LIMIT,
) -> Reconciled:
    """Decide, for the rows after `watermark` (at most `limit`), which are Tether's own turns
    (hidden) and which are foreign (display)."""
    fresh = sorted((r for r in rows if (r.row_id or 0) > watermark), key=lambda r: r.row_id or 0)[
        :limit
    ]
    buckets: dict[tuple[str, float], int] = defaultdict(int)
    for row in rows:
        if row.role == "user":
            buckets[(row.session_id, row.timestamp)] += 1
    proven = defaultdict(list)
    for proof in proofs:
        if proof.source == SOURCE:
            proven[(proof.agent_session_id, proof.persist_user_timestamp)].append(proof)
    out = Reconciled([], [], [], max([watermark, *(r.row_id or 0 for r in fresh)]))
    for turn in turns(fresh):
        head = turn[0]
        key = (head.session_id, head.timestamp)
        matching = proven.get(key, []) if head.role == "user" else []
        ids = [r.row_id for r in turn if r.row_id is not None]
        if matching and buckets[key] == 1:
            out.hidden.extend(ids)
            continue
        out.context.extend(turn)
        out.display.extend(turn)
    return out
