"""The model context (`context_messages`) as a pure function of the transcript projection.

Contract invariant 1: every visible turn enters the context (partial output of a stopped,
failed or interrupted run included) unless it is listed in `excluded` with a reason the user
can read. Invariant 6: a compression summary enters only as agent-facing reference material
(a system message that says so), never as a user turn. Reasoning is display-only: providers
do not take it back as input.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from tether.events import summary_message
from tether.visible_text import shown_file_name

UNFINISHED_TOOL_RESULT = "(no result: the run ended before this tool finished)"
SUMMARIZED_REASON = (
    "Summarized by automatic context compression: the model gets the summary instead of "
    "this turn's full text."
)


def _user_message(row: dict[str, Any]) -> dict[str, Any]:
    """Attachments become `attachment` parts that the runtime resolves to image or text parts
    (the projection stays pure: it never reads the files), each named as the page shows it
    (`shown_file_name`: a log written before names were cleaned may hold one raw)."""
    attachments = row.get("attachments") or []
    if not attachments:
        return {"role": "user", "content": row.get("content", "")}
    text = row.get("content", "")
    # files alone (an image to describe): no empty text part, which some providers refuse
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
    parts.extend(
        {
            "type": "attachment",
            "attachment_id": a["id"],
            "name": shown_file_name(a["name"]),
            "mime": a["mime"],
        }
        for a in attachments
    )
    return {"role": "user", "content": parts}


def _assistant_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []

    def flush() -> None:
        if calls:
            out.append(
                {"role": "assistant", "content": "".join(text) or None, "tool_calls": list(calls)}
            )
            out.extend(results)
        elif text and "".join(text).strip():
            out.append({"role": "assistant", "content": "".join(text)})
        text.clear()
        calls.clear()
        results.clear()

    for item in row.get("timeline", []):
        kind = item["type"]
        if kind == "text":
            if calls:
                flush()
            text.append(item["text"])
        elif kind == "tool":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {
                        "name": item["name"],
                        "arguments": json.dumps(item.get("args") or {}),
                    },
                }
            )
            result = item.get("result")
            if result is None:
                result = item.get("result_preview")
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": UNFINISHED_TOOL_RESULT if not item.get("done") else (result or ""),
                }
            )
        elif kind == "steer" and not item.get("leftover"):
            flush()  # the user's words, seen by the agent at this step
            out.append({"role": "user", "content": item["text"]})
        elif kind == "notice":
            if calls:
                flush()
            text.append(f"\n\n[{item['text']}]" if text else f"[{item['text']}]")
    flush()
    return out


def _on_branch(
    index_of: dict[str, int],
    compressions: Sequence[dict[str, Any]],
    shown_runs: Collection[str] | None,
) -> list[dict[str, Any]]:
    """The compressions of the branch shown: those whose boundary turn is visible
    (`index_of`) and whose run is on the branch (`shown_runs`: the assistant rows visible
    and the runs still live). Any other one is ignored, and not counted: its summary may
    describe rows the user removed or another branch's, which must not reach the model."""
    return [
        c
        for c in compressions
        if c["boundary_turn_id"] in index_of
        and (shown_runs is None or c.get("stream_id") is None or c["stream_id"] in shown_runs)
    ]


def agent_system_message(agent_prompt: str, system_prompt: str | None) -> str:
    """The system message an agent with its own prompt sends (`agent.system_prompt`): its
    part, then the session's system prompt, as Hermes composes them."""
    return (agent_prompt + "\n\n" + system_prompt).strip() if system_prompt else agent_prompt


def context_messages(
    messages: list[dict[str, Any]],
    compressions: Sequence[dict[str, Any]] = (),
    handoff: dict[str, Any] | None = None,
    agent_compactions: Sequence[dict[str, Any]] = (),
    system_prompt: str | None = None,
    shown_runs: Collection[str] | None = None,
) -> dict[str, Any]:
    """`{context_messages, excluded, compressions, compressed_at}` for the visible `messages`,
    the session's compression passes, for a rotated child its parent's handoff, and the
    compactions another client of the agent did in place (`agent.imported`). The session's
    system prompt, when it has one, is the first message (invariant 1: shown as sent)."""
    index_of = {row["turn_id"]: i for i, row in enumerate(messages) if row["role"] == "user"}
    shown = _on_branch(index_of, compressions, shown_runs)
    compression = shown[-1] if shown else None  # the newest one is in effect
    start = index_of[compression["boundary_turn_id"]] if compression else 0
    summary = compression["summary"] if compression else (handoff or {}).get("summary")
    carried: list[dict[str, Any]] = []
    # The agent's own compaction wins when it came after Tether's.
    compaction = next((c for c in reversed(agent_compactions) if c["at"] >= start), None)
    if compaction is not None:
        start, summary, carried = compaction["at"], compaction["summary"], compaction["carried"]
    # Where the model's view of the transcript starts, for the page's divider (invariant 1:
    # the turns before it are excluded with a reason the user can read).
    compressed_at = None
    if compaction is None and compression is not None:
        compressed_at = {
            "turn_id": compression["boundary_turn_id"],
            "tokens_before": compression.get("tokens_before"),
            "tokens_after": compression.get("tokens_after"),
        }
    elif compaction is not None and start < len(messages):
        compressed_at = {
            "turn_id": messages[start]["turn_id"],
            "tokens_before": None,
            "tokens_after": None,
        }
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    if summary:
        out.append(summary_message(summary))
    out.extend(carried)
    excluded = [
        {"turn_id": row["turn_id"], "reason": SUMMARIZED_REASON}
        for row in messages[:start]
        if row["role"] == "user"
    ]
    for row in messages[start:]:
        if "agent_context" in row:  # a turn another client wrote: the agent's own messages
            out.extend(row["agent_context"])
        elif row["role"] == "user":
            out.append(_user_message(row))
        elif row["role"] == "assistant":
            out.extend(_assistant_messages(row))
    return {
        "context_messages": out,
        "excluded": excluded,
        "compressions": len(shown) + (1 if handoff else 0) + len(agent_compactions),
        "compressed_at": compressed_at,
    }
