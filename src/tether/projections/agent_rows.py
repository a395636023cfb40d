"""Transcript rows for turns another client of the agent wrote (`agent.imported`).

Hermes Agent keeps its own history (`state.db`); its CLI can add turns to a session Tether
also drives. The runtime reconciles those rows (contract invariant 5) and the log records
what it found: each turn's rows as the user should see them and, separately, the messages
the model should get. This module turns one recorded turn into transcript rows: a user row
and an assistant row whose timeline is built like a live run's (text, reasoning, tool
calls), so an imported turn looks like any other. The model messages ride along privately
(`agent_context`) and are what the context projection uses for these rows, exactly as the
agent stored them.
"""

from __future__ import annotations

import json
from typing import Any

from tether.projections.timeline import timeline_view

IMPORTED_STATE = "completed"


def _images_note(count: int) -> str:
    if not count:
        return ""
    noun = "image" if count == 1 else "images"
    return f"\n\n[{count} {noun} sent from another client; not stored in Tether]"


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _timeline(rows: list[dict[str, Any]], turn_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = f"{turn_id}.{row['row_id']}"
        if row["role"] == "assistant":
            if row.get("reasoning"):
                items.append({"id": f"{key}.r", "type": "reasoning", "text": row["reasoning"]})
            if row.get("content"):
                items.append({"id": f"{key}.t", "type": "text", "text": row["content"]})
            for call in row.get("tool_calls") or []:
                item = {
                    "id": f"{turn_id}.tool.{call['id']}",
                    "type": "tool",
                    "call_id": call["id"],
                    "name": call.get("name", ""),
                    "args": _arguments(call.get("arguments")),
                    "result_preview": None,
                    "is_error": False,
                    "duration_ms": None,
                    "done": False,
                }
                tools[call["id"]] = item
                items.append(item)
        elif row["role"] == "tool":
            called = tools.get(row.get("tool_call_id") or "")
            if called is not None:
                result = row.get("content") or ""
                called.update(result=result, result_preview=result[:500], done=True)
    return items


def imported_rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The transcript rows of one imported turn (`entry` of an `agent.imported` event)."""
    turn_id = entry["turn_id"]
    rows = entry.get("rows") or []
    out: list[dict[str, Any]] = []
    user = rows[0] if rows and rows[0]["role"] == "user" else None
    if user is not None:
        out.append(
            {
                "id": turn_id,
                "role": "user",
                "turn_id": turn_id,
                "created_at": user["timestamp"],
                "content": (user.get("content") or "") + _images_note(user.get("images", 0)),
                "attachments": [],
                "origin": "agent",
            }
        )
    rest = rows[1:] if user is not None else rows
    if rest:
        timeline, answer = timeline_view(_timeline(rest, turn_id))
        out.append(
            {
                "id": f"{turn_id}.reply",
                "role": "assistant",
                "turn_id": turn_id,
                "created_at": rest[0]["timestamp"],
                "finished_at": rest[-1]["timestamp"],
                "content": answer,
                "state": IMPORTED_STATE,
                "stream_id": None,
                "timeline": timeline,
                "origin": "agent",
            }
        )
    # The model gets the agent's own messages, each with the row that shows it: the user's
    # message with the user row, the rest with the answer, so an answer a regenerate hid
    # (or an edit, with its message) leaves the context with its row (invariant 1).
    context = list(entry.get("context") or [])
    split = 1 if user is not None and context and context[0].get("role") == "user" else 0
    if len(out) == 2 and split:
        out[0]["agent_context"], out[1]["agent_context"] = context[:split], context[split:]
    elif out:  # one row shows the whole turn
        out[0]["agent_context"] = context
        for row in out[1:]:
            row["agent_context"] = []
    return out
