"""Layer: agent-store reconciliation (contract invariant 5 and "Inactive compression
continuation recovery"): what one pass over a real `state.db` (written by hermes-agent's own
`SessionDB`) brings into a Tether session."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from statedb import write_state

from tether.runtimes.base import AgentNews
from tether.runtimes.hermes.agent_view import agent_news, changes, started_elsewhere
from tether.runtimes.hermes.proofs import Proof, ProofStore

pytestmark = pytest.mark.slow

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
}
SUMMARY = "[CONTEXT COMPACTION — REFERENCE ONLY] Earlier turns were compacted: they listed files."


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "hermes-home"


@pytest.fixture
def ledger(home: Path) -> ProofStore:
    return ProofStore(home / "tether-proofs.sqlite")


def tether_turn(ledger: ProofStore, stream: str, after: int, through: int, ts: float) -> None:
    """What the Tether side records around one of its turns in agent session a1."""
    ledger.bind("s_t", "a1")
    ledger.turn_started("s_t", stream, after)
    ledger.record(Proof("s_t", stream, f"u_{stream}", "a1", ts))
    ledger.turn_ended(stream, through)


def test_a_cli_turn_is_imported_and_tethers_own_is_not(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "tether", {}],
            ["append", "a1", "user", "from tether", {"timestamp": 1000.0}],
            ["append", "a1", "assistant", "answer to tether", {}],
            ["append", "a1", "user", "from the cli", {}],
            [
                "append",
                "a1",
                "assistant",
                "Let me look.",
                {"tool_calls": [CALL], "reasoning": "list them"},
            ],
            ["append", "a1", "tool", "a.txt\nb.txt", {"tool_call_id": "c1"}],
            ["append", "a1", "assistant", "Two files.", {}],
        ],
    )
    tether_turn(ledger, "r1", 0, 2, 1000.0)
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None and news.continuation is None and news.watermark == 6
    [entry] = news.entries
    assert entry["kind"] == "turn" and entry["turn_id"] == "a_3"
    assert [(r["role"], r["content"]) for r in entry["rows"]] == [
        ("user", "from the cli"),
        ("assistant", "Let me look."),
        ("tool", "a.txt\nb.txt"),
        ("assistant", "Two files."),
    ]
    assert entry["rows"][1]["reasoning"] == "list them"
    assert entry["rows"][1]["tool_calls"] == [
        {"id": "c1", "name": "terminal", "arguments": '{"command": "ls"}'}
    ]
    assert entry["context"] == [
        {"role": "user", "content": "from the cli"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "Two files."},
    ]
    again = agent_news(db, ledger, "s_t", news.watermark, None)  # bounded, idempotent
    assert again is not None and again.entries == [] and again.watermark == 6


def test_rows_a_tether_turn_wrote_are_never_imported(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    """A compaction during Tether's own turn rewrites rows no proof covers: the turn's row
    range keeps them out (Tether's log holds that turn and its compression already)."""
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "tether", {}],
            ["append", "a1", "user", "old question", {"timestamp": 900.0}],
            ["append", "a1", "user", "from tether", {"timestamp": 1000.0}],
            [
                "compact",
                "a1",
                [
                    {"role": "user", "content": SUMMARY},
                    {"role": "user", "content": "from tether", "timestamp": 1000.0},
                ],
            ],
            ["append", "a1", "assistant", "answer", {}],
        ],
    )
    tether_turn(ledger, "r1", 1, 5, 1000.0)
    ledger.turn_started("s_t", "r0", 0)  # the turn before: its row is Tether's too
    ledger.turn_ended("r0", 1)
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None and news.entries == [] and news.watermark == 5


def test_a_turn_another_client_wrote_during_a_tether_turn_is_kept(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    """Invariant 5: inside a Tether turn's range, only the rows its agent wrote are its. A
    CLI writing into the same agent session meanwhile (its rows interleaved with Tether's)
    keeps its turns, one with the same text as Tether's included: text is never evidence."""
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "tether", {}],
            ["append", "a1", "user", "from tether", {"timestamp": 1000.0}],  # Tether: 1
            ["append", "a1", "user", "from the cli", {"timestamp": 1000.5}],
            ["append", "a1", "assistant", "answer to the cli", {}],
            ["append", "a1", "user", "from tether", {"timestamp": 1001.0}],  # same text, CLI
            ["append", "a1", "assistant", "echoing you", {}],
            ["append", "a1", "assistant", "answer to tether", {}],  # Tether: 6
        ],
    )
    ledger.bind("s_t", "a1")
    ledger.turn_started("s_t", "r1", 0)
    ledger.record(Proof("s_t", "r1", "u_r1", "a1", 1000.0))
    ledger.turn_ended("r1", 6, [1, 6])
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None and news.watermark == 6
    assert [[(r["role"], r["content"]) for r in e["rows"]] for e in news.entries] == [
        [("user", "from the cli"), ("assistant", "answer to the cli")],
        [("user", "from tether"), ("assistant", "echoing you")],
    ]
    assert [e["context"][0] for e in news.entries] == [
        {"role": "user", "content": "from the cli"},
        {"role": "user", "content": "from tether"},
    ]
    assert [r["timestamp"] for r in news.entries[1]["rows"]][:1] == [1001.0]
    again = agent_news(db, ledger, "s_t", news.watermark, None)
    assert again is not None and again.entries == []


def test_a_pass_that_imports_nothing_keeps_its_place_across_a_restart(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    """A pass over Tether's own rows writes no event, so the log's watermark stays put; the
    ledger's `examined` mark moves instead, and a new ledger on the same file (a restart)
    starts there. Without it a bounded pass would re-read the same rows for ever."""
    ops: list = [["create", "a1", "tether", {}]]
    for n in range(3):
        ops += [
            ["append", "a1", "user", f"tether {n}", {"timestamp": 1000.0 + n}],
            ["append", "a1", "assistant", f"answer {n}", {}],
        ]
    ops += [["append", "a1", "user", "from the cli", {}], ["append", "a1", "assistant", "ok", {}]]
    db = write_state(hermes_python, home, ops)
    for n in range(3):
        tether_turn(ledger, f"r{n}", 2 * n, 2 * n + 2, 1000.0 + n)
    first = agent_news(db, ledger, "s_t", 0, None, limit=2)
    assert first is not None and (first.entries, first.watermark) == ([], 2)
    log_watermark = 0  # no entries, so no agent.imported: the log's watermark does not move
    marks = []
    for _ in range(3):
        restarted = ProofStore(home / "tether-proofs.sqlite")
        news = agent_news(db, restarted, "s_t", log_watermark, None, limit=2)
        assert news is not None
        marks.append(news.watermark)
    assert marks == [4, 6, 8]
    assert [[r["content"] for r in e["rows"]] for e in news.entries] == [["from the cli", "ok"]]
    log_watermark = news.watermark  # this one is an event
    again = agent_news(db, ProofStore(home / "tether-proofs.sqlite"), "s_t", log_watermark, None)
    assert again is not None and (again.entries, again.watermark) == ([], 8)


def test_without_a_turn_range_the_proof_alone_hides_tethers_turn(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "tether", {}],
            ["append", "a1", "user", "from tether", {"timestamp": 1000.0}],
            ["append", "a1", "assistant", "answer", {}],
            ["append", "a1", "user", "same text, other turn", {"timestamp": 1000.5}],
        ],
    )
    ledger.bind("s_t", "a1")  # the server died mid-turn: no range, but the proof stands
    ledger.record(Proof("s_t", "r1", "u_1", "a1", 1000.0))
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None
    assert [[r["content"] for r in e["rows"]] for e in news.entries] == [["same text, other turn"]]


def test_native_image_mirror_needs_the_rows_own_evidence(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    rich = [{"type": "text", "text": "what is this"}, IMAGE]
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "cli", {}],
            [
                "append",
                "a1",
                "user",
                "what is this\n[screenshot]",
                {"api_content": json.dumps(rich)},
            ],
            ["append", "a1", "assistant", "a cat", {}],
            ["append", "a1", "user", "look\n[screenshot]", {}],  # typed: the marker proves nothing
            ["append", "a1", "assistant", "at what?", {}],
        ],
    )
    ledger.bind("s_t", "a1")
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None
    first, second = news.entries
    assert first["rows"][0] | {"row_id": 0, "timestamp": 0} == {
        "row_id": 0,
        "timestamp": 0,
        "role": "user",
        "content": "what is this",
        "images": 1,
    }
    assert first["context"][0] == {"role": "user", "content": rich}  # the expanded payload
    assert second["rows"][0]["content"] == "look\n[screenshot]"
    assert second["rows"][0]["images"] == 0
    assert second["context"][0] == {"role": "user", "content": "look\n[screenshot]"}


def test_an_in_place_compaction_elsewhere_restarts_the_context(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "cli", {}],
            ["append", "a1", "user", "list files", {}],
            ["append", "a1", "assistant", "a.txt", {}],
        ],
    )
    ledger.bind("s_t", "a1")
    first = agent_news(db, ledger, "s_t", 0, None)
    assert first is not None and first.watermark == 2 and len(first.entries) == 1
    write_state(
        hermes_python,
        home,
        [
            ["append", "a1", "user", "and b?", {}],  # never seen by Tether before the compaction
            ["append", "a1", "assistant", "no b.", {}],
            [
                "compact",
                "a1",
                [
                    {"role": "user", "content": "list files"},
                    {"role": "user", "content": SUMMARY},
                    {"role": "assistant", "content": "no b."},
                ],
            ],
            ["sleep", 0.05],
            ["append", "a1", "user", "after the compaction", {}],
            ["append", "a1", "assistant", "noted", {}],
        ],
    )
    news = agent_news(db, ledger, "s_t", first.watermark, None)
    assert news is not None
    kinds = [e["kind"] for e in news.entries]
    assert kinds == ["turn", "compaction", "turn"]
    unseen, compaction, after = news.entries
    assert [r["content"] for r in unseen["rows"]] == ["and b?", "no b."]
    assert unseen["context"] == []  # summarized: shown, not sent again
    assert compaction["summary"] == SUMMARY
    assert compaction["context"] == [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "no b."},
    ]
    assert [r["content"] for r in after["rows"]] == ["after the compaction", "noted"]
    assert after["context"][0] == {"role": "user", "content": "after the compaction"}


def test_a_compression_continuation_is_offered_unless_tethers_own(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "tether", {}],
            ["append", "a1", "user", "hi", {}],
            ["end", "a1", "compression"],
            ["sleep", 0.01],
            ["create", "c1", "cli", {"parent_session_id": "a1"}],
        ],
    )
    ledger.bind("s_t", "a1")
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None and news.continuation == "c1"
    ledger.bind("s_t", "c1")  # Tether's own turn rotated into it: the same conversation
    news = agent_news(db, ledger, "s_t", 0, None)
    assert news is not None and news.continuation is None
    # A session that drives no agent session has nothing new, and that is an answer.
    assert agent_news(db, ledger, "s_unbound", 7, None) == AgentNews(7)


def test_changes_name_only_the_sessions_that_moved(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "cli", {}],
            ["create", "b1", "cli", {}],
            ["append", "a1", "user", "one", {}],
        ],
    )
    bindings = {"s_a": ["a1"], "s_b": ["b1"]}
    seen: dict[str, tuple] = {}
    assert sorted(changes(db, bindings, seen)) == ["s_a", "s_b"]  # first look: everything
    assert changes(db, bindings, seen) == []
    write_state(hermes_python, home, [["append", "b1", "user", "two", {}]])
    assert changes(db, bindings, seen) == ["s_b"]
    bindings["s_c"] = ["a1"]  # newly bound, state.db unchanged: still worth a first look
    assert changes(db, bindings, seen) == ["s_c"]
    assert changes(db, bindings, seen) == []


def test_sessions_a_person_started_in_the_cli_are_found_once(
    hermes_python: Path, home: Path
) -> None:
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "cli1", "cli", {}],
            ["create", "tui1", "tui", {}],
            ["create", "own", "tether", {}],
            ["create", "cron1", "cron", {}],
            ["create", "child", "cli", {"parent_session_id": "cli1"}],
            ["create", "helper", "cli", {"model_config": {"_delegate_from": "cli1"}}],
            ["create", "work", "cli", {"profile_name": "work"}],
            ["create", "known", "cli", {}],
        ],
    )
    found = started_elsewhere(db, {"known"}, None)
    assert [f["agent_session_id"] for f in found] == ["cli1", "tui1"]
    assert all(f["started_at"] > 0 for f in found)
    assert [f["agent_session_id"] for f in started_elsewhere(db, set(), "work")] == ["work"]


def test_bytes_that_are_not_utf8_in_state_db_hide_nothing_else(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    """`state.db` is another program's file: one row or title holding bytes that are not
    UTF-8 (a tool that wrote it by hand, a damaged page) used to fail the whole read, which
    a pass took for "nothing there": that session's turns were never imported and no CLI
    session was discovered any more. Such bytes now read as U+FFFD and the rest comes in."""
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "cli", {}],
            ["append", "a1", "user", "first", {}],
            ["append", "a1", "assistant", "odd", {}],
            ["append", "a1", "user", "later", {}],
            ["append", "a1", "assistant", "later answer", {}],
            ["create", "c2", "cli", {}],
            ["append", "c2", "user", "hello c2", {}],
        ],
    )
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE messages SET content = CAST(X'6f6464ff' AS TEXT) WHERE id = 2")
        raw.execute("UPDATE sessions SET title = CAST(X'ff' AS TEXT) WHERE id = 'a1'")
    ledger.bind("s1", "a1")
    news = agent_news(db, ledger, "s1", 0, None)
    assert news.watermark == 4
    shown = [(r["role"], r["content"]) for e in news.entries for r in e["rows"]]
    assert shown == [
        ("user", "first"),
        ("assistant", "odd\ufffd"),
        ("user", "later"),
        ("assistant", "later answer"),
    ]
    found = started_elsewhere(db, set(), None)
    assert [(f["agent_session_id"], f["title"]) for f in found] == [("a1", "\ufffd"), ("c2", None)]


def test_values_of_another_type_in_state_db_hide_nothing_else(
    hermes_python: Path, home: Path, ledger: ProofStore
) -> None:
    """SQLite keeps whatever type a writer gives it: a timestamp written as text failed
    every later pass of that session (its CLI turns never came in again), one session's
    start as text stopped every CLI session from being discovered, and content written as
    bytes showed as Python's `b'...'`."""
    db = write_state(
        hermes_python,
        home,
        [
            ["create", "a1", "cli", {}],
            ["append", "a1", "user", "first", {}],
            ["append", "a1", "assistant", "odd", {}],
            ["append", "a1", "user", "later", {}],
            ["append", "a1", "assistant", "later answer", {}],
            ["create", "c2", "cli", {}],
        ],
    )
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE messages SET timestamp = 'yesterday' WHERE id = 1")
        raw.execute("UPDATE messages SET content = X'6f6b' WHERE id = 2")
        raw.execute("UPDATE sessions SET started_at = 'long ago' WHERE id = 'a1'")
    ledger.bind("s1", "a1")
    news = agent_news(db, ledger, "s1", 0, None)
    shown = [(r["role"], r["content"]) for e in news.entries for r in e["rows"]]
    assert shown == [
        ("user", "first"),
        ("assistant", "ok"),
        ("user", "later"),
        ("assistant", "later answer"),
    ]
    found = started_elsewhere(db, set(), None)
    assert [f["agent_session_id"] for f in found] == ["a1", "c2"]
