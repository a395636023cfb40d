"""Runtime events to log drafts for one run (docs/architecture.md §1: normalise once, at entry).

- Reasoning and text deltas get item ids; a new item starts whenever the kind changes or a
  tool ran in between, so interim progress stays its own visible timeline row.
- Consecutive deltas of one item are merged (coalescing) when drafts are taken together.
- Tool calls are paired by call id: a completion without a start gets its start first, a
  repeated start is dropped.
- An echo between reasoning and visible progress (either direction) is stripped from the
  reasoning copy with `reasoning.trimmed`, found through the incremental folded index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether import events as ev
from tether.ingest.echo import CompactEchoIndex, fold
from tether.log import Draft
from tether.runtimes.base import (
    AgentSystemPrompt,
    AnswerFinished,
    ApprovalRequested,
    ApprovalResolved,
    ClarifyRequested,
    ClarifyResolved,
    CompressionCompleted,
    CompressionStarted,
    Finished,
    ReasoningDelta,
    RuntimeEvent,
    TextDelta,
    ToolCompleted,
    ToolStarted,
    Usage,
)

RESULT_PREVIEW_CHARS = 2000
# The contract's echo rule (a whitespace-insensitive suffix match) has no minimum, and neither
# has Tether's: a candidate of any length is an echo. Below this many folded characters the
# folded match alone is weak evidence (it ignores word boundaries: "done." folds into the tail
# of "undone."), so a short candidate must also repeat the reasoning's tail exactly, whitespace
# included, as a whole segment (`CompactEchoIndex.repeats_exactly`): "Done." after "...Done."
# is stripped, "done." after "undone." and "On it.." after "Onit.." are not. At 8 characters
# and more the folded match stands on its own, as the contract describes it.
SHORT_ECHO_CHARS = 8


@dataclass(frozen=True, slots=True)
class SteerDelivered:
    """The runtime drained these steers at its current step (engine-side inbox item)."""

    steer_ids: list[str]


RESULT_MAX_CHARS = 100_000


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Normalizer:
    def __init__(self, stream_id: str, turn_id: str):
        self.stream_id = stream_id
        self.turn_id = turn_id
        self._items = 0
        self._delta_kind: str | None = None
        self._item_id: str | None = None
        self._tools: dict[str, str] = {}  # call_id -> "started" | "completed"
        self._reasoning: tuple[str, CompactEchoIndex] | None = None  # the latest reasoning item
        self._text: list[str] = []
        self._last_text: str | None = None
        self.usage: dict[str, int] | None = None
        self.finished: Finished | None = None
        self.finish_reason: str | None = None
        self.compressed = False
        self._questions: list[str] = []  # clarify questions asked and not yet resolved

    def _draft(self, type_: str, data: dict[str, Any]) -> Draft:
        return Draft(
            type_,
            {"stream_id": self.stream_id, **data},
            stream_id=self.stream_id,
            turn_id=self.turn_id,
        )

    def feed(self, event: RuntimeEvent) -> list[Draft]:
        if isinstance(event, ReasoningDelta | TextDelta):
            if not event.text:
                return []
            kind = ev.REASONING_DELTA if isinstance(event, ReasoningDelta) else ev.TEXT_DELTA
            out: list[Draft] = []
            if kind != self._delta_kind:
                out = self.end_item()
                self._items += 1
                self._delta_kind = kind
                self._item_id = f"{'r' if kind == ev.REASONING_DELTA else 't'}{self._items}"
                if kind == ev.REASONING_DELTA:
                    self._reasoning = (self._item_id, CompactEchoIndex())
                else:
                    self._text = []
            if kind == ev.REASONING_DELTA:
                assert self._reasoning is not None  # begun with this item, above
                self._reasoning[1].append(event.text)
            else:
                self._text.append(event.text)
            out.append(self._draft(kind, {"item_id": self._item_id, "text": event.text}))
            return out
        return self.end_item() + self._feed_other(event)

    def end_item(self) -> list[Draft]:
        """The current text or reasoning item is complete: strip an echo between it and the
        reasoning, once, here where output enters the log (contract invariant 5)."""
        kind, self._delta_kind = self._delta_kind, None
        if kind == ev.TEXT_DELTA:
            self._last_text = "".join(self._text)
            return self._strip_echo(self._last_text)  # progress repeating the reasoning's tail
        if kind == ev.REASONING_DELTA and self._last_text is not None:
            text, self._last_text = self._last_text, None
            return self._strip_echo(text)  # reasoning echoing the progress just shown
        return []

    def _strip_echo(self, candidate: str) -> list[Draft]:
        if self._reasoning is None:
            return []
        item_id, index = self._reasoning
        cut = index.probe(candidate)
        if cut is None:
            return []
        if len(fold(candidate)) < SHORT_ECHO_CHARS and not index.repeats_exactly(candidate, cut):
            return []
        index.truncate(cut)
        return [self._draft(ev.REASONING_TRIMMED, {"item_id": item_id, "length": cut})]

    def _feed_other(self, event: RuntimeEvent) -> list[Draft]:
        if isinstance(event, ToolStarted):
            if event.call_id in self._tools:
                return []
            self._tools[event.call_id] = "started"
            return [
                self._draft(
                    ev.TOOL_STARTED,
                    {"call_id": event.call_id, "name": event.name, "args": event.args},
                )
            ]
        if isinstance(event, ToolCompleted):
            out = []
            if event.call_id not in self._tools:
                out.append(
                    self._draft(
                        ev.TOOL_STARTED, {"call_id": event.call_id, "name": event.name, "args": {}}
                    )
                )
            elif self._tools[event.call_id] == "completed":
                return []
            self._tools[event.call_id] = "completed"
            out.append(
                self._draft(
                    ev.TOOL_COMPLETED,
                    {
                        "call_id": event.call_id,
                        "name": event.name,
                        "result_preview": _clip(event.result, RESULT_PREVIEW_CHARS),
                        "result": _clip(event.result, RESULT_MAX_CHARS),
                        "is_error": event.is_error,
                        "duration_ms": event.duration_ms,
                    },
                )
            )
            return out
        if isinstance(event, ApprovalRequested):
            return [
                self._draft(
                    ev.APPROVAL_REQUESTED,
                    {
                        "approval_id": event.approval_id,
                        "command": _clip(event.command, RESULT_PREVIEW_CHARS),
                        "description": event.description,
                        "choices": list(event.choices),
                    },
                )
            ]
        if isinstance(event, ApprovalResolved):
            return [
                self._draft(
                    ev.APPROVAL_RESOLVED,
                    {
                        "approval_id": event.approval_id,
                        "choice": event.choice,
                        "reason": event.reason,
                    },
                )
            ]
        if isinstance(event, ClarifyRequested):
            self._questions.append(event.question_id)
            return [
                self._draft(
                    ev.CLARIFY_REQUESTED,
                    {
                        "question_id": event.question_id,
                        "question": event.question,
                        "choices": list(event.choices),
                    },
                )
            ]
        if isinstance(event, ClarifyResolved):
            if event.question_id not in self._questions:
                return []  # answered once already (or never asked in this run)
            self._questions.remove(event.question_id)
            return [self._resolved(event.question_id, event.text, event.reason)]
        if isinstance(event, SteerDelivered):
            return [self._draft(ev.STEER_DELIVERED, {"steer_ids": event.steer_ids})]
        if isinstance(event, CompressionStarted):
            return [self._draft(ev.COMPRESSION_STARTED, {"pass_id": event.pass_id})]
        if isinstance(event, CompressionCompleted):
            self.compressed = True
            return [
                self._draft(
                    ev.COMPRESSION_COMPLETED,
                    {
                        "pass_id": event.pass_id,
                        "tokens_before": event.tokens_before,
                        "tokens_after": event.tokens_after,
                        # agent-facing handoff material: folded into the model context only
                        "summary": event.summary,
                        "boundary_turn_id": event.boundary_turn_id,
                    },
                )
            ]
        if isinstance(event, AgentSystemPrompt):
            return [self._draft(ev.AGENT_SYSTEM_PROMPT, {"text": event.text})]
        if isinstance(event, Usage):
            self.usage = {
                "prompt_tokens": event.prompt_tokens,
                "completion_tokens": event.completion_tokens,
            }
            return []
        if isinstance(event, Finished):
            self.finished = event
            return []
        if isinstance(event, AnswerFinished):
            self.finish_reason = event.finish_reason
            return []
        raise TypeError(f"not a runtime event: {event!r}")

    def _resolved(self, question_id: str, text: str, reason: str) -> Draft:
        return self._draft(
            ev.CLARIFY_RESOLVED, {"question_id": question_id, "text": text, "reason": reason}
        )

    def open_questions_stopped(self) -> list[Draft]:
        """The run ends: every question still open is resolved `stopped` (nobody answered),
        so no tab keeps offering an answer nobody can take."""
        drafts = [self._resolved(q, "", "stopped") for q in self._questions]
        self._questions.clear()
        return drafts

    def started(self, runtime: str, model: str) -> Draft:
        return self._draft(
            ev.RUN_STARTED, {"turn_id": self.turn_id, "runtime": runtime, "model": model}
        )

    def finish(self, state: str, **extra: Any) -> Draft:
        data: dict[str, Any] = {"turn_id": self.turn_id, "state": state}
        if self.usage is not None:
            data["usage"] = self.usage
        if self.finish_reason is not None:
            data["finish_reason"] = self.finish_reason
        data.update({k: v for k, v in extra.items() if v is not None})
        return self._draft(ev.RUN_FINISHED, data)


def coalesce(drafts: list[Draft]) -> list[Draft]:
    """Merge adjacent deltas of the same item: their concatenation is the text (docs/api.md §6)."""
    out: list[Draft] = []
    for draft in drafts:
        prev = out[-1] if out else None
        if (
            prev is not None
            and draft.type in (ev.TEXT_DELTA, ev.REASONING_DELTA)
            and prev.type == draft.type
            and prev.data.get("item_id") == draft.data.get("item_id")
        ):
            merged = {**prev.data, "text": prev.data["text"] + draft.data["text"]}
            out[-1] = Draft(prev.type, merged, stream_id=prev.stream_id, turn_id=prev.turn_id)
        else:
            out.append(draft)
    return out
