"""A run's timeline items as the page shows them: text that something later followed is
interim progress, the trailing text is the answer. Shared by live runs and imported turns."""

from __future__ import annotations

from typing import Any

_BARRIER_TYPES = {"tool", "compression", "steer"}


def _is_barrier(item: dict[str, Any]) -> bool:
    """Something the agent did after a text, which makes that text interim progress. A steer
    that was never delivered is not: the agent never saw it."""
    return item["type"] in _BARRIER_TYPES and not item.get("leftover")


def timeline_view(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Copy the items, marking text that something later followed as interim progress; the
    trailing text is the answer. Returns (timeline, final answer text)."""
    last_barrier = max((i for i, it in enumerate(items) if _is_barrier(it)), default=-1)
    timeline, answer = [], []
    for index, item in enumerate(items):
        copy = dict(item)
        if copy["type"] == "text":
            copy["interim"] = index < last_barrier
            if not copy["interim"]:
                answer.append(copy["text"])
        timeline.append(copy)
    return timeline, "".join(answer)
