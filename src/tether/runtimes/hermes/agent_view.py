"""What `state.db` holds for a Tether session that Tether's log does not (issue 7, items 3-4).

Another client of the same Hermes profile (its CLI, most often) can add turns to a session
Tether drives, compact it in place, or compress it into a continuation session. One pass,
for one Tether session, reads the rows after the session's watermark in the agent sessions
it is bound to and returns them as `AgentNews`, the payload of an `agent.imported` event:

- rows Tether's own turns wrote are skipped: inside a turn's range (`turn_rows`), the ids
  the turn's agent reported writing (`turn_writes`). Another client writing into the same
  agent session during a Tether turn writes other ids: those rows are imported like any
  (distinct ids stay separate, contract invariant 5). A range without that evidence (a turn
  recorded before it existed) is Tether's whole;
- a compaction batch (the rows Hermes writes in one call around its `[CONTEXT COMPACTION`
  summary, which it stamps one microsecond apart) becomes a `compaction` entry: context
  only, the display keeps what it showed;
- rows a compaction archived before Tether saw them are shown, outside the model context
  (the summary covers them);
- everything else goes through `reconcile()` (proofs hide Tether's own turns, native-image
  mirrors need all the evidence) and becomes `turn` entries: display rows plus the messages
  the model gets, as the agent stored them.

Plus the continuation: the newest authorized compression continuation of the newest bound
agent session (`lineage.continuation_of`), unless a Tether session already drives it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether.runtimes.base import AgentNews
from tether.runtimes.hermes.lineage import continuation_of, read_only
from tether.runtimes.hermes.proofs import ProofStore
from tether.runtimes.hermes.reconcile import (
    DEFAULT_LIMIT,
    IMAGE_PART_TYPES,
    Row,
    is_mirror,
    read_rows,
    reconcile,
    turns,
)

COMPACTION_PREFIX = "[CONTEXT COMPACTION"
BATCH_STEP = 1e-5  # seconds: Hermes steps a batch's stamps by 1e-6


def _is_summary(row: Row) -> bool:
    return isinstance(row.content, str) and row.content.startswith(COMPACTION_PREFIX)


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    """OpenAI-shaped tool calls as stored (`{id, type, function: {name, arguments}}`)."""
    calls = []
    for call in raw if isinstance(raw, list) else []:
        if isinstance(call, dict):
            function = call.get("function")
            if not isinstance(function, dict):
                function = {}
            calls.append(
                {
                    "id": str(call.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(function.get("name") or ""),
                        "arguments": function.get("arguments") or "{}",
                    },
                }
            )
    return calls


def _text_parts(parts: list[Any]) -> tuple[str, int]:
    texts = [
        str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
    ]
    images = sum(1 for p in parts if isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES)
    return "\n".join(texts), images


def _user_views(row: Row) -> tuple[dict[str, Any], Any]:
    """(display fields, model content) of a user row. A multipart value shows its text and
    counts its images; a scalar `[screenshot]` projection shows as rich only when the row's
    own multipart payload proves it (`is_mirror`), else exactly as written. The model gets
    the agent's expanded payload when there is one."""
    content, payload = row.content, row.api_content
    model = payload if payload not in (None, "") else content
    if isinstance(content, list):
        text, images = _text_parts(content)
        return {"content": text, "images": images}, model
    if isinstance(payload, list) and is_mirror(
        Row(row.role, payload, row.timestamp, row.session_id), row
    ):
        text, images = _text_parts(payload)
        return {"content": text, "images": images}, model
    return {"content": str(content or ""), "images": 0}, model


def _model_message(row: Row) -> dict[str, Any] | None:
    if row.role == "user":
        return {"role": "user", "content": _user_views(row)[1]}
    if row.role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": row.content or None}
        calls = _tool_calls(row.tool_calls)
        if calls:
            message["tool_calls"] = calls
        return message
    if row.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": row.tool_call_id or "",
            "content": str(row.content or ""),
        }
    return None  # system rows: the agent rebuilds its own prompt


def _display_row(row: Row) -> dict[str, Any] | None:
    base: dict[str, Any] = {"row_id": row.row_id, "role": row.role, "timestamp": row.timestamp}
    if row.role == "user":
        return {**base, **_user_views(row)[0]}
    if row.role == "assistant":
        return {
            **base,
            "content": str(row.content or ""),
            "reasoning": row.reasoning,
            "tool_calls": [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in _tool_calls(row.tool_calls)
            ],
        }
    if row.role == "tool":
        return {**base, "content": str(row.content or ""), "tool_call_id": row.tool_call_id}
    return None


def _turn_entry(rows: list[Row], *, in_context: bool) -> dict[str, Any] | None:
    shown = [d for d in (_display_row(r) for r in rows) if d is not None]
    if not shown:
        return None
    context = [m for m in (_model_message(r) for r in rows) if m is not None] if in_context else []
    return {"kind": "turn", "turn_id": f"a_{rows[0].row_id}", "rows": shown, "context": context}


def _same_write(earlier: Row, later: Row) -> bool:
    """Rows Hermes wrote in one `_insert_message_rows` call: same session, stamps one
    microsecond apart (it stamps the batch itself; separate writes are farther apart)."""
    return (
        earlier.session_id == later.session_id
        and 0 <= later.timestamp - earlier.timestamp <= BATCH_STEP
    )


def _compaction_batch(rows: list[Row], at: int) -> tuple[int, int]:
    """`[start, end)` of the rows written together with the summary at `at` (the compacted
    head and tail). A user row ending the batch with replies after it is the turn the
    compaction ran for (a preflight compaction): it starts the next turn instead."""
    start = at
    while start > 0 and _same_write(rows[start - 1], rows[start]):
        start -= 1
    end = at + 1
    while end < len(rows) and _same_write(rows[end - 1], rows[end]):
        end += 1
    if end - 1 > at and rows[end - 1].role == "user" and end < len(rows):
        end -= 1
    return start, end


def _entries(rows: list[Row], proofs: list, watermark: int) -> list[dict[str, Any]]:
    """Entries in the order the rows were written."""
    entries: list[tuple[int, dict[str, Any]]] = []
    archived = [r for r in rows if r.archived]
    for turn in turns(archived):  # summarized already: shown, not in the context
        entry = _turn_entry(turn, in_context=False)
        if entry is not None:
            entries.append((turn[0].row_id or 0, entry))
    live = [r for r in rows if not r.archived]
    plain: list[Row] = []
    index = 0
    while index < len(live):
        if not _is_summary(live[index]):
            plain.append(live[index])
            index += 1
            continue
        start, end = _compaction_batch(live, index)
        del plain[len(plain) - (index - start) :]  # rows before the summary in its batch
        carried = [
            m
            for m in (_model_message(r) for r in live[start:end] if r is not live[index])
            if m is not None
        ]
        entries.append(
            (
                live[index].row_id or 0,
                {"kind": "compaction", "summary": str(live[index].content), "context": carried},
            )
        )
        index = end
    result = reconcile(plain, proofs, watermark=watermark, limit=len(plain) or 1)
    for turn in turns(result.display):
        entry = _turn_entry(turn, in_context=True)
        if entry is not None:
            entries.append((turn[0].row_id or 0, entry))
    return [entry for _, entry in sorted(entries, key=lambda pair: pair[0])]


def agent_news(
    state_db: Path,
    ledger: ProofStore,
    session_id: str,
    watermark: int,
    profile: str | None,
    limit: int = DEFAULT_LIMIT,
    *,
    continued: Sequence[tuple[str, int]] = (),
) -> AgentNews:
    """One bounded, idempotent pass for one Tether session (nothing new when it drives no
    agent session), from the log's `watermark` or the ledger's `examined` mark, whichever is
    further. A pass that finds nothing to import moves that mark (no event is written for
    it); one that does returns entries and the watermark their event carries. The agent
    sessions of the sessions it `continued` (each with the watermark its final log ended
    at) are read too, after that watermark and their `examined` mark: another client may
    go on in them after the rotation. Row ids grow across `state.db`, so one watermark
    covers them all. Blocking: call it in a thread."""
    own = ledger.agent_sessions(session_id)
    ranges = ledger.turn_ranges(session_id)
    floors: dict[str, int] = {}  # an agent session of a rotated session: where its log ended
    for ancestor, ended_at in continued:
        for agent_id in ledger.agent_sessions(ancestor):
            floors[agent_id] = max(ended_at, ledger.examined(ancestor))
        ranges += ledger.turn_ranges(ancestor)  # its own turns' rows stay its own
    agents = [*floors, *own]
    if not agents:
        return AgentNews(watermark)
    start = max(watermark, ledger.examined(session_id))
    rows = read_rows(state_db, agents, after_id=start, limit=limit, archived=True, floors=floors)
    next_watermark = max([start, *(r.row_id or 0 for r in rows)])
    foreign = [r for r in rows if not any(turn.owns(r.row_id or 0) for turn in ranges)]
    # A turn whose rows are known by id needs no timestamp proof: its rows are gone already,
    # and another client's row at the same timestamp must not pass for it.
    by_id = {turn.stream_id for turn in ranges if turn.written is not None}
    proofs = [p for p in ledger.for_sessions(agents) if p.stream_id not in by_id]
    entries = _entries(foreign, proofs, start) if foreign else []
    if not entries and next_watermark > start:
        ledger.examined_through(session_id, next_watermark)
    continuation = continuation_of(state_db, own[-1], profile) if own else None
    if continuation is not None and ledger.tether_session_of(continuation) == session_id:
        continuation = None  # Tether's own turn rotated into it: the same conversation
    return AgentNews(next_watermark, entries, continuation, more=len(rows) >= limit)


def changes(state_db: Path, bindings: dict[str, list[str]], seen: dict[str, tuple]) -> list[str]:
    """The Tether sessions whose agent sessions gained rows or lineage children since the
    fingerprints in `seen` (updated in place). Cheap when nothing moved: two aggregate
    reads. Blocking: call it in a thread."""
    with read_only(state_db) as db:
        if db is None:
            return []
        try:
            overall = (
                db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()
                + db.execute(
                    "SELECT COUNT(*), COALESCE(MAX(started_at), 0), "
                    "COALESCE(MAX(ended_at), 0) FROM sessions"
                ).fetchone()
            )
            # A newly bound session (a continuation, an adopted CLI session) gets its first
            # look even when state.db itself did not move since the last call.
            if seen.get("") == overall and all(tether_id in seen for tether_id in bindings):
                return []
            seen[""] = overall
            changed = []
            for tether_id, agents in bindings.items():
                marks = ",".join("?" * len(agents))
                fingerprint = (
                    db.execute(
                        f"SELECT COALESCE(MAX(id), 0) FROM messages WHERE session_id IN ({marks})",
                        agents,
                    ).fetchone()
                    + db.execute(
                        f"SELECT COUNT(*), COALESCE(MAX(ended_at), 0) FROM sessions WHERE "
                        f"parent_session_id IN ({marks}) OR id IN ({marks})",
                        [*agents, *agents],
                    ).fetchone()
                )
                if seen.get(tether_id) != fingerprint:
                    seen[tether_id] = fingerprint
                    changed.append(tether_id)
            return changed
        except sqlite3.Error:
            return []


# Sources of sessions a person started in another Hermes client (its CLI and TUI): shown in
# Tether too. Gateway chats, cron jobs, delegated agents and Tether's own are not.
INTERACTIVE_SOURCES = ("cli", "tui")
DISCOVER_LIMIT = 50


def started_elsewhere(
    state_db: Path, known: set[str], profile: str | None, limit: int = DISCOVER_LIMIT
) -> list[dict[str, Any]]:
    """Root sessions (no parent) of the profile that a person started in the CLI or TUI
    and that no Tether session drives yet, oldest first: `{agent_session_id, title,
    started_at, archived}`. Their compression continuations follow through the lineage, as
    for any session. `archived`: Hermes hides the session from its lists (a soft hide, its
    messages kept), so it is adopted archived, not shown as an active conversation.
    Blocking: call it in a thread."""
    marks = ",".join("?" * len(INTERACTIVE_SOURCES))
    with read_only(state_db) as db:
        if db is None:
            return []
        try:
            rows = db.execute(
                "SELECT id, title, CAST(started_at AS REAL), profile_name, model_config, "
                "archived "
                "FROM sessions "
                f"WHERE parent_session_id IS NULL AND source IN ({marks}) "
                "ORDER BY CAST(started_at AS REAL), id",
                INTERACTIVE_SOURCES,
            ).fetchall()
        except sqlite3.Error:
            return []
    found = []
    for agent_id, title, started_at, profile_name, model_config, archived in rows:
        if agent_id in known or (profile_name or None) != (profile or None):
            continue
        try:
            config = json.loads(model_config or "{}")
        except ValueError:
            config = {}
        if isinstance(config, dict) and (
            config.get("_delegate_from") or config.get("_branched_from")
        ):
            continue
        found.append(
            {
                "agent_session_id": agent_id,
                "title": title or None,
                "started_at": float(started_at or 0),
                "archived": bool(archived),
            }
        )
        if len(found) >= limit:
            break
    return found
