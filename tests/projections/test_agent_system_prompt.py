"""Layer: the model context (`GET /api/session/context`) for `agent.system_prompt`, the part of
the system message an agent puts before the session's own (Hermes). Contract invariant 1: the
context view opens with the whole system message the model gets, while the runtime's input
leaves the agent's part out (the agent adds it itself); invariant 4: recording it is no
activity (the sidebar row does not move)."""

from __future__ import annotations

from typing import Any

from tether.events import Event
from tether.projections.sidebar import fold_row
from tether.sessions.folds import SessionFold

OWN = "You are Hermes Agent.\n\nTools: terminal."


def turn(seq: int, n: int, runtime: str, *, prompt: str | None = OWN) -> list[Event]:
    """Turn `n` at `seq`: submitted, started by `runtime`, the agent's prompt when given,
    an answer, finished."""
    stream, turn_id = f"r{n}", f"u{n}"

    def event(offset: int, type_: str, data: dict[str, Any]) -> Event:
        return Event("s", seq + offset, type_, float(seq + offset), data, stream, turn_id)

    submitted = {"turn_id": turn_id, "stream_id": stream, "text": f"question {n}"}
    out = [
        event(0, "turn.submitted", {**submitted, "attachments": [], "submitted_at": 1.0}),
        event(1, "run.started", {"turn_id": turn_id, "runtime": runtime, "model": "m"}),
    ]
    if prompt is not None:
        out.append(event(2, "agent.system_prompt", {"stream_id": stream, "text": prompt}))
    delta = {"stream_id": stream, "item_id": "t", "text": f"answer {n}"}
    out.append(event(3, "text.delta", delta))
    finished = {"stream_id": stream, "turn_id": turn_id, "state": "completed"}
    out.append(event(4, "run.finished", finished))
    return out


def folded(*events: Event) -> SessionFold:
    fold = SessionFold()
    fold.apply(Event("s", 1, "session.created", 0.0, {"title": None}))
    for event in events:
        fold.apply(event)
    return fold


def test_the_view_opens_with_the_agents_part_then_the_sessions_prompt() -> None:
    fold = folded(*turn(2, 1, "hermes"))
    shown = fold.context("Answer in haiku.", "hermes")["context_messages"]
    assert shown[0] == {"role": "system", "content": OWN + "\n\nAnswer in haiku."}
    assert [m["role"] for m in shown] == ["system", "user", "assistant"]
    # Without a session prompt the agent's part alone, as Hermes sends it.
    assert fold.context(None, "hermes")["context_messages"][0] == {"role": "system", "content": OWN}
    # What the runtime gets leaves the agent's part out: the agent adds it itself.
    given = fold.transcript.context("Answer in haiku.")["context_messages"]
    assert given[0] == {"role": "system", "content": "Answer in haiku."}
    assert fold.transcript.context(None)["context_messages"][0]["role"] == "user"


def test_the_latest_part_recorded_is_shown_and_a_run_of_another_runtime_drops_it() -> None:
    changed = "You are Hermes Agent.\n\nTools: terminal, browser."
    fold = folded(*turn(2, 1, "hermes"), *turn(7, 2, "hermes", prompt=changed))
    assert fold.context(None, "hermes")["context_messages"][0]["content"] == changed
    fold = folded(*turn(2, 1, "hermes"), *turn(7, 2, "hermes", prompt=None))
    assert fold.context(None, "hermes")["context_messages"][0]["content"] == OWN  # unchanged: kept
    fold = folded(*turn(2, 1, "hermes"), *turn(7, 2, "openai", prompt=None))
    assert fold.context(None, "openai")["context_messages"][0]["role"] == "user"


def test_a_server_running_another_runtime_shows_none_of_the_agents_part() -> None:
    """Restarted with another `--runtime` before any run of it: that runtime sends none of
    Hermes' part, so the view shows the session's prompt alone, as the model will get it;
    back on Hermes, the part recorded is shown again."""
    fold = folded(*turn(2, 1, "hermes"))
    shown = fold.context("Answer in haiku.", "openai")["context_messages"]
    assert shown[0] == {"role": "system", "content": "Answer in haiku."}
    assert fold.context(None, "openai")["context_messages"][0]["role"] == "user"
    assert fold.context(None, "hermes")["context_messages"][0] == {"role": "system", "content": OWN}


def test_recording_the_agents_part_does_not_move_the_sidebar_row() -> None:
    submitted, started, recorded = turn(2, 1, "hermes")[:3]
    assert recorded.type == "agent.system_prompt" and recorded.at > started.at
    before = fold_row(fold_row(None, submitted), started)
    after = fold_row(before, recorded)
    assert {k: v for k, v in after.items() if k != "last_seq"} == {
        k: v for k, v in before.items() if k != "last_seq"
    }
