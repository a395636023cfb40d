"""state.db reconciliation (invariant 5's proof and native-image mirror rules) and inactive
compression continuation recovery from the profile's lineage; the last test has the real
hermes CLI write a turn into a session Tether also drives."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tether.runtimes.hermes.lineage import continuation_of
from tether.runtimes.hermes.proofs import Proof, ProofStore
from tether.runtimes.hermes.reconcile import (
    Row,
    is_mirror,
    read_rows,
    reconcile,
    scalar_projection,
)

from fake_openai import FakeOpenAI, reply, text

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
RICH = [{"type": "text", "text": "what is this"}, IMAGE]


def rich_row(**kw: object) -> Row:
    return Row(**{"role": "user", "content": RICH, "timestamp": 100.0, **kw})  # type: ignore[arg-type]


def scalar_row(**kw: object) -> Row:
    return Row(
        **{
            "role": "user",
            "content": "what is this\n[screenshot]",
            "timestamp": 100.0,
            "session_id": "a1",
            "row_id": 7,
            "api_content": RICH,
            **kw,
        }
    )  # type: ignore[arg-type]


# -- native-image mirrors -------------------------------------------------------------------------
def test_a_mirror_needs_all_the_evidence() -> None:
    assert scalar_projection(RICH) == "what is this\n[screenshot]"
    assert is_mirror(rich_row(), scalar_row())
    assert not is_mirror(rich_row(timestamp=100.001), scalar_row())  # timestamps exact
    assert not is_mirror(rich_row(role="assistant"), scalar_row())  # role
    assert not is_mirror(rich_row(tool_call_id="c1"), scalar_row())  # tool shape
    assert not is_mirror(rich_row(row_id=8), scalar_row())  # conflicting stable ids
    assert not is_mirror(rich_row(provider={"model": "a"}), scalar_row(provider={"model": "b"}))
    assert not is_mirror(rich_row(), scalar_row(content="what is this [screenshot]"))
    # text alone, or images alone, is no native-image turn
    assert not is_mirror(rich_row(content=[IMAGE]), scalar_row(content="[screenshot]"))
    assert scalar_projection([{"type": "text", "text": "only text"}]) is None


def test_literal_screenshot_text_alone_is_never_evidence() -> None:
    typed = Row("user", "look\n[screenshot]", 100.0)  # the user typed the marker
    other = scalar_row(content="look\n[screenshot]", api_content=None)
    assert not is_mirror(typed, other)


# -- proofs ----------------------------------------------------------------------------------------
def rows_for(session: str, ts: float, first_id: int, user: str = "hi") -> list[Row]:
    return [
        Row("user", user, ts, session, first_id),
        Row("assistant", "answer", ts + 1, session, first_id + 1),
    ]


def proof(ts: float, stream: str = "r_1", session: str = "a1", source: str = "tether") -> Proof:
    return Proof("s_t", stream, "u_1", session, ts, source)


def test_a_proven_turn_is_hidden_and_a_foreign_one_shown() -> None:
    rows = rows_for("a1", 10.0, 1) + rows_for("a1", 20.0, 3, user="from the cli")
    out = reconcile(rows, [proof(10.0)])
    assert out.hidden == [1, 2]
    assert [r.content for r in out.display] == ["from the cli", "answer"]
    assert out.watermark == 4


def test_text_is_never_the_proof() -> None:
    rows = rows_for("a1", 10.0, 1)
    assert reconcile(rows, [proof(10.5)]).hidden == []  # same text, other timestamp
    assert reconcile(rows, [proof(10.0, session="a2")]).hidden == []  # other agent session
    assert reconcile(rows, [proof(10.0, source="webui")]).hidden == []  # other source


def test_an_ambiguous_timestamp_bucket_keeps_every_row() -> None:
    """Two user rows share the proven timestamp: no durable identity says which is Tether's,
    so both are shown and sent. (While the turn is open no pass runs at all: that protection
    is tested against the real server, hermes/test_hermes_agent_sync.py.)"""
    rows = rows_for("a1", 10.0, 1) + rows_for("a1", 10.0, 3, user="same time")
    settled = reconcile(rows, [proof(10.0, stream="r_live")])
    assert [r.row_id for r in settled.display] == [1, 2, 3, 4]  # in doubt: keep both
    assert [r.row_id for r in settled.context] == [1, 2, 3, 4] and settled.hidden == []
    alone = reconcile(rows[:2], [proof(10.0, stream="r_live")])
    assert alone.hidden == [1, 2] and alone.display == []  # the same proof, unambiguous


def test_reconciliation_is_bounded_and_idempotent() -> None:
    rows = [r for i in range(50) for r in rows_for("a1", float(i), 2 * i + 1, f"m{i}")]
    first = reconcile(rows, [], limit=30)
    assert len(first.display) == 30 and first.watermark == 30
    again = reconcile(rows, [], limit=30)
    assert again == first  # same input, same answer
    rest = reconcile(rows, [], watermark=first.watermark, limit=1000)
    assert len(rest.display) == 70 and rest.watermark == 100
    assert reconcile(rows, [], watermark=rest.watermark).display == []


# -- lineage ---------------------------------------------------------------------------------------
def lineage_db(path: Path, rows: list[tuple]) -> Path:
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, parent_session_id TEXT, "
        "started_at REAL, ended_at REAL, end_reason TEXT, profile_name TEXT, "
        "model_config TEXT)"
    )
    db.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()
    return path


@pytest.mark.parametrize(
    ("child_end", "found"),
    [
        (None, "c"),
        ("idle_timeout", "c"),
        ("agent_close", "c"),
        ("cli_close", None),
        ("session_reset", None),
        ("something_new", None),
    ],
)
def test_continuation_reasons(tmp_path: Path, child_end: str | None, found: str | None) -> None:
    db = lineage_db(
        tmp_path / "state.db",
        [
            ("p", "tether", None, 1.0, 5.0, "compression", None, "{}"),
            ("c", "cli", "p", 5.0, 9.0 if child_end else None, child_end, None, "{}"),
        ],
    )
    assert continuation_of(db, "p") == found


def test_foreign_profile_delegated_and_branch_children_do_not_authorize(tmp_path: Path) -> None:
    for i, (profile, config, source) in enumerate(
        [
            ("work", "{}", "cli"),
            (None, json.dumps({"_delegate_from": "p"}), "cli"),
            (None, json.dumps({"_branched_from": "p"}), "cli"),
            (None, "{}", "tool"),
        ]
    ):
        db = lineage_db(
            tmp_path / f"state{i}.db",
            [
                ("p", "tether", None, 1.0, 5.0, "compression", None, "{}"),
                ("c", source, "p", 6.0, None, None, profile, config),
            ],
        )
        assert continuation_of(db, "p") is None
    # not a compression parent, or a child older than the parent's end
    for i, (end, started) in enumerate([("cli_close", 6.0), ("compression", 4.0)]):
        db = lineage_db(
            tmp_path / f"edge{i}.db",
            [
                ("p", "tether", None, 1.0, 5.0, end, None, "{}"),
                ("c", "cli", "p", started, None, None, None, "{}"),
            ],
        )
        assert continuation_of(db, "p") is None


def test_chains_are_followed_to_the_newest_and_bounded(tmp_path: Path) -> None:
    db = lineage_db(
        tmp_path / "state.db",
        [
            ("a", "tether", None, 1.0, 2.0, "compression", None, "{}"),
            ("b", "cli", "a", 2.0, 3.0, "compression", None, "{}"),
            ("c", "cli", "b", 3.0, None, None, None, "{}"),
        ],
    )
    assert continuation_of(db, "a") == "c"
    assert continuation_of(db, "c") is None
    assert continuation_of(tmp_path / "missing.db", "a") is None


# -- the real CLI writes into a session Tether drives ---------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cli_written_turn_is_reconciled_and_tethers_own_is_hidden(
    hermes_env: Path, hermes_python: Path, fake: FakeOpenAI, tmp_path: Path
) -> None:
    from test_hermes_runtime import collect, make_runtime, turn

    fake.script(reply(text("answer to tether")), reply(text("answer to the cli")))

    async def tether_turn() -> None:
        runtime = make_runtime(fake, tmp_path)
        try:
            handle = await runtime.open_handle("s_mix")
            await collect(handle.stream(turn("s_mix", "from tether")))
        finally:
            await runtime.aclose()

    asyncio.run(tether_turn())
    cli = subprocess.run(
        [
            str(hermes_python.parent / "hermes"),
            "chat",
            "-q",
            "from the cli",
            "-Q",
            "--resume",
            "s_mix",
            "-t",
            "terminal",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        env={
            "HERMES_HOME": str(hermes_env),
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "OPENAI_API_KEY": "test-key",
        },
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    rows = read_rows(hermes_env / "state.db", ["s_mix"])
    assert [r.content for r in rows if r.role == "user"] == ["from tether", "from the cli"]
    proofs = ProofStore(hermes_env / "tether-proofs.sqlite").for_sessions(["s_mix"])
    out = reconcile(rows, proofs)
    assert [(r.role, r.content) for r in out.display] == [
        ("user", "from the cli"),
        ("assistant", "answer to the cli"),
    ]
    assert len(out.hidden) == 2  # Tether's own turn: its user row and the answer
    assert reconcile(rows, proofs, watermark=out.watermark).display == []
