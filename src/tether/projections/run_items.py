"""A run's live scene and the folds of its timeline items (docs/api.md §5): text and
reasoning deltas, tools, compression passes, approval prompts, clarify questions and steers.
The transcript fold (projections/transcript.py) hands each such event of a run it shows live
to `ITEM_FOLDS` and settles the scene into the run's assistant row at `run.finished`; the
page's `web/js/reducer_items.js` mirrors these folds. Item ids are `<stream_id>.<kind>.<id>`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether import events as ev
from tether.events import Event


@dataclass
class RunScene:
    stream_id: str
    turn_id: str
    started_at: float
    phase: str = "starting"
    runtime: str | None = None
    model: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    by_id: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending_steers: dict[str, str] = field(default_factory=dict)
    # The prompts (their item ids) whose answer is recorded: they take no other (never shown).
    answered: set[str] = field(default_factory=set)

    def item(self, item_id: str, make: dict[str, Any]) -> dict[str, Any]:
        found = self.by_id.get(item_id)
        if found is None:
            found = {"id": item_id, **make}
            self.items.append(found)
            self.by_id[item_id] = found
        return found


def settle_steer(scene: RunScene, steer_id: str, *, leftover: bool) -> None:
    """Delivered: a timeline row where the agent took it. Leftover: a row saying it was not
    delivered (its text goes back to the composer); never in the model context."""
    text = scene.pending_steers.pop(steer_id, None)
    if text is not None:
        scene.item(
            f"{scene.stream_id}.steer.{steer_id}",
            {"type": "steer", "text": text, "leftover": leftover},
        )


def _strings(values: Any) -> list[str]:
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def _offered(choices: Any) -> list[str]:
    """An approval prompt's answers; a prompt recorded before choices existed offered two."""
    return _strings(choices) or ["once", "deny"]


def _delta(scene: RunScene, event: Event) -> None:
    kind = "reasoning" if event.type == ev.REASONING_DELTA else "text"
    item = scene.item(f"{scene.stream_id}.{event.data['item_id']}", {"type": kind, "text": ""})
    item["text"] += event.data.get("text", "")


def _tool_started(scene: RunScene, event: Event) -> None:
    data = event.data
    scene.item(
        f"{scene.stream_id}.tool.{data['call_id']}",
        {
            "type": "tool",
            "call_id": data["call_id"],
            "name": data.get("name", ""),
            "args": data.get("args"),
            "result_preview": None,
            "is_error": False,
            "duration_ms": None,
            "done": False,
        },
    )


def _tool_completed(scene: RunScene, event: Event) -> None:
    data = event.data
    item = scene.item(
        f"{scene.stream_id}.tool.{data['call_id']}",
        {
            "type": "tool",
            "call_id": data["call_id"],
            "name": data.get("name", ""),
            "args": None,
        },
    )
    item.update(
        result_preview=data.get("result_preview"),
        result=data.get("result"),
        is_error=bool(data.get("is_error")),
        duration_ms=data.get("duration_ms"),
        done=True,
    )


def _compression(scene: RunScene, event: Event) -> None:
    """The divider the page shows while a pass runs; its summary is the transcript fold's
    (agent-facing, invariant 6)."""
    data = event.data
    item = scene.item(
        f"{scene.stream_id}.compression.{data['pass_id']}",
        {"type": "compression", "pass_id": data["pass_id"], "done": False},
    )
    if event.type == ev.COMPRESSION_COMPLETED:
        item.update(
            done=True,
            tokens_before=data.get("tokens_before"),
            tokens_after=data.get("tokens_after"),
        )


def _approval(scene: RunScene, event: Event) -> None:
    """The agent asked before running a flagged command; the item shows the question and,
    once known, the answer (the tool result says what happened next)."""
    data = event.data
    asked = data if event.type == ev.APPROVAL_REQUESTED else {}  # an answer asks nothing
    item = scene.item(
        f"{scene.stream_id}.approval.{data['approval_id']}",
        {
            "type": "approval",
            "approval_id": data["approval_id"],
            "command": asked.get("command", ""),
            "description": asked.get("description", ""),
            "choices": _offered(asked.get("choices")),
            "choice": None,
            "reason": None,
        },
    )
    if event.type == ev.APPROVAL_RESOLVED:
        item.update(choice=data.get("choice"), reason=data.get("reason"))


def _clarify(scene: RunScene, event: Event) -> None:
    """The agent asked the user a question; the item shows it, its choices and, once
    known, the answer (or that nobody gave one)."""
    data = event.data
    asked = data if event.type == ev.CLARIFY_REQUESTED else {}  # an answer asks nothing
    item = scene.item(
        f"{scene.stream_id}.clarify.{data['question_id']}",
        {
            "type": "clarify",
            "question_id": data["question_id"],
            "question": asked.get("question", ""),
            "choices": _strings(asked.get("choices")),
            "text": None,
            "reason": None,
        },
    )
    if event.type == ev.CLARIFY_RESOLVED:
        item.update(text=data.get("text"), reason=data.get("reason"))


def _answered(scene: RunScene, event: Event) -> None:
    """An answer recorded for the replica that runs the stream (runs/controls.py): what
    the agent got is its `approval.resolved` / `clarify.resolved`, shown above."""
    data = event.data
    if event.type == ev.APPROVAL_ANSWERED:
        scene.answered.add(f"{scene.stream_id}.approval.{data['approval_id']}")
    else:
        scene.answered.add(f"{scene.stream_id}.clarify.{data['question_id']}")


def _reasoning_trimmed(scene: RunScene, event: Event) -> None:
    item = scene.by_id.get(f"{scene.stream_id}.{event.data['item_id']}")
    if item is not None:
        item["text"] = item["text"][: event.data["length"]]


def _steer_accepted(scene: RunScene, event: Event) -> None:
    """Accepted steers wait beside the timeline until the agent takes them in."""
    scene.pending_steers[event.data["steer_id"]] = event.data.get("text", "")


def _steer_settled(scene: RunScene, event: Event) -> None:
    """Delivered: a timeline row where the agent took it. Leftover: a row saying it was
    not delivered (its text goes back to the composer); never in the model context."""
    for steer_id in event.data.get("steer_ids", []):
        settle_steer(scene, steer_id, leftover=event.type == ev.STEER_LEFTOVER)


ITEM_FOLDS: dict[str, Callable[[RunScene, Event], None]] = {
    ev.REASONING_DELTA: _delta,
    ev.TEXT_DELTA: _delta,
    ev.REASONING_TRIMMED: _reasoning_trimmed,
    ev.TOOL_STARTED: _tool_started,
    ev.TOOL_COMPLETED: _tool_completed,
    ev.COMPRESSION_STARTED: _compression,
    ev.COMPRESSION_COMPLETED: _compression,
    ev.APPROVAL_REQUESTED: _approval,
    ev.APPROVAL_RESOLVED: _approval,
    ev.APPROVAL_ANSWERED: _answered,
    ev.CLARIFY_REQUESTED: _clarify,
    ev.CLARIFY_RESOLVED: _clarify,
    ev.CLARIFY_ANSWERED: _answered,
    ev.STEER_ACCEPTED: _steer_accepted,
    ev.STEER_DELIVERED: _steer_settled,
    ev.STEER_LEFTOVER: _steer_settled,
}
