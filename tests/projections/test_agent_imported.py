"""Layers: visible transcript, model context and sidebar row, for `agent.imported` (turns
and compactions another client of the agent wrote). Contract invariant 1 (the model sees
what the user sees), invariant 4 (only real activity moves `updated_at`), invariant 5
(replay is idempotent) and invariant 6 (a summary enters only as agent-facing reference)."""

from __future__ import annotations

from typing import Any

from tether.events import Event
from tether.projections.sidebar import fold_row
from tether.projections.transcript import TranscriptFold

CLI_TURN = {
    "kind": "turn",
    "turn_id": "a_3",
    "rows": [
        {"row_id": 3, "role": "user", "content": "from the cli", "timestamp": 50.0, "images": 1},
        {
            "row_id": 4,
            "role": "assistant",
            "content": "Let me look.",
            "timestamp": 51.0,
            "reasoning": "list them",
            "tool_calls": [{"id": "c1", "name": "terminal", "arguments": '{"command": "ls"}'}],
        },
        {"row_id": 5, "role": "tool", "content": "a.txt", "timestamp": 52.0, "tool_call_id": "c1"},
        {"row_id": 6, "role": "assistant", "content": "One file.", "timestamp": 53.0},
    ],
    "context": [
        {"role": "user", "content": [{"type": "text", "text": "from the cli"}]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": ["..."]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "assistant", "content": "One file."},
    ],
}
COMPACTION = {
    "kind": "compaction",
    "summary": "[CONTEXT COMPACTION] they listed files",
    "context": [{"role": "assistant", "content": "One file."}],
}


def log(*entries_lists: list[dict[str, Any]]) -> list[Event]:
    events = [
        Event("s", 1, "session.created", 10.0, {"title": None}),
        Event(
            "s",
            2,
            "turn.submitted",
            20.0,
            {
                "turn_id": "u1",
                "stream_id": "r1",
                "text": "from tether",
                "attachments": [],
                "submitted_at": 20.0,
            },
            "r1",
            "u1",
        ),
        Event(
            "s",
            3,
            "run.finished",
            21.0,
            {"stream_id": "r1", "turn_id": "u1", "state": "completed"},
            "r1",
            "u1",
        ),
    ]
    for k, entries in enumerate(entries_lists):
        events.append(
            Event(
                "s",
                4 + k,
                "agent.imported",
                100.0 + k,
                {"source": "hermes", "watermark": 6 + k, "entries": entries},
            )
        )
    return events


def fold(events: list[Event]) -> tuple[TranscriptFold, dict[str, Any]]:
    transcript, row = TranscriptFold(), None
    for event in events:
        transcript.apply(event)
        row = fold_row(row, event)
    assert row is not None
    return transcript, row


def test_an_imported_turn_is_shown_like_a_run_and_sent_as_the_agent_stored_it() -> None:
    transcript, row = fold(log([CLI_TURN]))
    messages = transcript.view()["messages"]
    assert [(m["role"], m.get("origin")) for m in messages] == [
        ("user", None),
        ("assistant", None),
        ("user", "agent"),
        ("assistant", "agent"),
    ]
    user, reply = messages[2], messages[3]
    assert user["content"].startswith("from the cli") and "1 image" in user["content"]
    assert reply["content"] == "One file." and reply["state"] == "completed"
    assert [i["type"] for i in reply["timeline"]] == ["reasoning", "text", "tool", "text"]
    assert reply["timeline"][1]["interim"] is True  # progress before the tool
    tool = reply["timeline"][2]
    assert tool["args"] == {"command": "ls"} and tool["done"] and tool["result"] == "a.txt"
    assert all("agent_context" not in m for m in messages)  # model-facing only
    context = transcript.context()["context_messages"]
    assert context[0] == {"role": "user", "content": "from tether"}
    assert context[-4:] == CLI_TURN["context"]
    assert transcript.agent_watermark == 6
    # The sidebar: two more rows, activity at the time the CLI wrote them, not the import's.
    assert row["message_count"] == 4
    assert row["updated_at"] == row["last_message_at"] == 53.0


def test_a_compaction_elsewhere_restarts_the_context_but_not_the_display() -> None:
    transcript, _ = fold(log([CLI_TURN, COMPACTION]))
    assert len(transcript.view()["messages"]) == 4
    context = transcript.context()
    assert context["context_messages"][0]["role"] == "system"  # reference material (inv. 6)
    assert "they listed files" in context["context_messages"][0]["content"]
    assert context["context_messages"][1:] == COMPACTION["context"]
    assert [e["turn_id"] for e in context["excluded"]] == ["u1", "a_3"]
    # A Tether turn after it follows the compacted context.
    transcript.apply(
        Event(
            "s",
            5,
            "turn.submitted",
            200.0,
            {"turn_id": "u2", "stream_id": "r2", "text": "next", "attachments": []},
            "r2",
            "u2",
        )
    )
    assert transcript.context()["context_messages"][-1] == {"role": "user", "content": "next"}


def test_replay_is_idempotent_and_truncation_forgets_a_cut_compaction() -> None:
    events = log([CLI_TURN, COMPACTION])
    once, row_once = fold(events)
    twice, row_twice = fold(events + events)
    assert once.view() == twice.view() and row_once == row_twice
    once.apply(
        Event("s", 5, "transcript.truncated", 300.0, {"keep_count": 2, "transcript_generation": 1})
    )
    context = once.context()["context_messages"]
    assert all("listed files" not in str(m.get("content")) for m in context)  # cut away
    assert [m["content"] for m in context if m["role"] == "user"] == ["from tether"]
