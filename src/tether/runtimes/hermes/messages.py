"""Tether's projected model context → what `run_conversation` takes.

`TurnInput.messages` ends with the current user turn (contract invariant 1). The history
before it becomes `conversation_history`; the turn itself becomes `user_message`, with its
attachments resolved (images as data URLs, text files inline), and `persist_user_message` is
its plain text. The session's system prompt (the context's first message when set) is left
out: it goes to the agent as `ephemeral_system_prompt`, which Hermes appends to its own system
prompt at every request without storing it. A compression summary (a system message in
Tether's context) goes to the agent as a user-role message that keeps its "reference
material" wording: Hermes keeps its own summaries in user-role messages too.
"""

from __future__ import annotations

from typing import Any

from tether.runtimes.attachments import expand_part
from tether.runtimes.base import AttachmentRef, TurnInput

HISTORY_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def _content(content: Any, attachments: dict[str, AttachmentRef]) -> Any:
    """Attachment parts resolved; a list of only text parts becomes one string."""
    if not isinstance(content, list):
        return content if content is not None else ""
    parts = [expand_part(p, attachments) for p in content]
    if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return "\n\n".join(p.get("text", "") for p in parts if p.get("text"))
    return parts


def plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and p.get("text")
        )
    return ""


def split_turn(turn: TurnInput) -> tuple[list[dict[str, Any]], Any, str]:
    """`(conversation_history, user_message, persist_user_message)` (reads attachment files:
    call it in a thread)."""
    messages = turn.messages
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    if last_user < 0:
        raise ValueError("the model context has no user turn")
    head = messages[:last_user]
    if turn.system_prompt and head and head[0] == {"role": "system", "content": turn.system_prompt}:
        head = head[1:]
    history: list[dict[str, Any]] = []
    for message in head:
        row = {k: message[k] for k in HISTORY_KEYS if k in message}
        if row.get("role") == "system":
            row = {"role": "user", "content": plain_text(row.get("content"))}
        elif row.get("role") == "user":
            row["content"] = _content(row.get("content"), turn.attachments)
        history.append(row)
    current = messages[last_user]
    user_message = _content(current.get("content"), turn.attachments)
    return history, user_message, plain_text(current.get("content"))
