"""`--compression-mode rotate` (docs/architecture.md §3; contract "Inactive compression
continuation recovery" for Tether's own lineage). Layers: log (session.rotated, the child's
handoff), sidebar (the child takes the parent's place without moving updated_at: invariant
4), model context (the child starts from the summary, never the parent's turns as intent:
invariant 6), run admission (409 session_rotated before any mutation)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pg import database

from tether.errors import SessionRotated
from tether.events import SUMMARY_PREFIX
from tether.log import Draft
from tether.runtimes.base import Runtime, RuntimeEvent, TextDelta, TurnInput, Usage
from tether.services import open_store
from tether.settings import Settings

from engine_harness import Harness, harness
from fake_openai import FakeOpenAI, hang, reply, text
from helpers import new_session, running_server, session_body, start_turn, wait_idle


class FullContextRuntime(Runtime):
    """Reports a context that crossed 80% of a 1,000-token window on every turn."""

    name = "full"
    model = "full-1"
    demo = False

    def __init__(self) -> None:
        self.summaries: list[list] = []
        self.turns: list[list] = []

    def accepts(self, mime: str) -> bool:
        return True

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        self.turns.append(turn.messages)
        yield TextDelta(f"answer {len(self.turns)}")
        yield Usage(prompt_tokens=850, completion_tokens=20)

    async def summarize(self, messages: list, model: str | None) -> str:
        self.summaries.append(messages)
        return f"handoff #{len(self.summaries)}"

    async def aclose(self) -> None:
        return None


async def rotated_child(h: Harness, parent: str) -> str:
    """The child `parent` continues in, once its rotating turn has finished."""
    for _ in range(500):
        child = (await h.sessions.row(parent))["continuation_session_id"]
        if child and not h.registry.busy(parent):
            return child
        await asyncio.sleep(0.01)
    raise AssertionError("the session never rotated")


def rotating(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, context_window=1000, compression_mode="rotate")


def test_a_turn_that_crossed_the_threshold_continues_in_a_child(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = FullContextRuntime()
        async with harness(tmp_path, runtime, rotating(tmp_path)) as h:
            parent = (await h.sessions.create("Research"))["session_id"]
            await h.engine.start(parent, "first question")
            child = await rotated_child(h, parent)
            parent_row, child_row = await h.sessions.row(parent), await h.sessions.row(child)
            # the turn finished in the parent, then the parent rotated
            parent_view = await h.sessions.view(parent)
            assert [m["role"] for m in parent_view["messages"]] == ["user", "assistant"]
            assert (await h.types(parent))[-1] == "session.rotated"
            # the child takes the parent's place, inheriting its activity time
            assert child_row["parent_session_id"] == parent
            assert child_row["title"] == "Research"
            assert child_row["updated_at"] == parent_row["updated_at"]
            body = await h.sessions.list_json(archived=False, query=None)
            listed = [r["session_id"] for r in json.loads(body)["sessions"]]
            assert child in listed and parent not in listed
            # the child shows the parent's history (display only) ...
            child_view = await h.sessions.view(child)
            assert child_view["messages"] == []
            assert [m["content"] for m in child_view["inherited_messages"]] == [
                "first question",
                "answer 1",
            ]
            assert {m["session_id"] for m in child_view["inherited_messages"]} == {parent}
            # ... while its model context starts from the summary, as reference material
            context = await h.sessions.context(child, h.engine.runtime.name)
            assert context["context_messages"] == [
                {"role": "system", "content": SUMMARY_PREFIX + "handoff #1"}
            ]
            # a stale start on the parent is refused before any mutation
            before = await h.store.read(parent)
            with pytest.raises(SessionRotated) as info:
                await h.engine.start(parent, "stale tab")
            assert info.value.code == "session_rotated"
            assert info.value.extra["continuation_session_id"] == child
            assert await h.store.read(parent) == before
            # the next turn goes to the child and the model sees summary + new turn
            await h.engine.start(child, "second question")
            for _ in range(500):
                grandchild = (await h.sessions.row(child))["continuation_session_id"]
                if grandchild and not h.registry.busy(child):
                    break
                await asyncio.sleep(0.01)
            assert runtime.turns[1][0]["content"] == SUMMARY_PREFIX + "handoff #1"
            assert runtime.turns[1][1] == {"role": "user", "content": "second question"}
            # several hops: the parent points at the newest continuation
            assert (await h.sessions.row(parent))["continuation_session_id"] == grandchild
            with pytest.raises(SessionRotated) as info:
                await h.engine.start(parent, "very stale")
            assert info.value.extra["continuation_session_id"] == grandchild
            grandchild_view = await h.sessions.view(grandchild)
            assert [m["content"] for m in grandchild_view["inherited_messages"]] == [
                "first question",
                "answer 1",
                "second question",
                "answer 2",
            ]

    asyncio.run(main())


def test_a_child_keeps_the_model_system_prompt_and_pin_chosen_for_its_parent(
    tmp_path: Path,
) -> None:
    """The child takes its parent's place: the model, system prompt and pin the user chose
    for the conversation (`PATCH /api/session`) go on in it. They were left behind, so the
    conversation's next turn went to the server's default model without its system prompt,
    and a pinned conversation dropped out of the pinned ones, with nothing said."""

    async def main() -> None:
        runtime = FullContextRuntime()
        async with harness(tmp_path, runtime, rotating(tmp_path)) as h:
            parent = (await h.sessions.create("Research"))["session_id"]
            chosen = {"model": "picked-model", "system_prompt": "Answer in French.", "pinned": True}
            await h.sessions.patch(parent, chosen)
            await h.engine.start(parent, "first question")
            child = await rotated_child(h, parent)
            row = await h.sessions.row(child)
            assert {k: row[k] for k in chosen} == chosen
            assert row["updated_at"] == (await h.sessions.row(parent))["updated_at"]
            await h.engine.start(child, "second question")
            for _ in range(500):
                if len(runtime.turns) == 2:
                    break
                await asyncio.sleep(0.01)
            assert runtime.turns[1][0]["role"] == "system"
            assert "Answer in French." in runtime.turns[1][0]["content"]

    asyncio.run(main())


def test_in_place_mode_never_rotates(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = FullContextRuntime()
        async with harness(
            tmp_path, runtime, Settings(data_dir=tmp_path, context_window=1000)
        ) as h:
            sid = (await h.sessions.create(None))["session_id"]
            await h.engine.start(sid, "q")
            await h.wait_idle(sid)
            await asyncio.sleep(0.05)
            assert (await h.sessions.row(sid))["continuation_session_id"] is None
            assert runtime.summaries == []

    asyncio.run(main())


def test_a_child_s_first_turn_reads_nothing_of_its_log_before_the_model(tmp_path: Path) -> None:
    """Layer: the server's session folds. The child is cached from the events that created
    it (`SessionService.create_log`), as a session made by `POST /api/sessions` is, so its
    first turn's context needs no read of its log (runs/test_stateless_start.py)."""
    reads: list[str] = []
    child_reads_when_asked: list[int] = []

    class Probe(FullContextRuntime):
        async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
            child_reads_when_asked.append(reads.count(turn.session_id))
            async for event in super().stream(turn):
                yield event

    async def main() -> None:
        async with harness(tmp_path, Probe(), rotating(tmp_path)) as h:
            h.note_reads(reads)
            parent = (await h.sessions.create("Research"))["session_id"]
            await h.engine.start(parent, "first question")
            child = await rotated_child(h, parent)
            await h.engine.start(child, "second question")
            await h.wait_idle(child)
            assert child_reads_when_asked == [0, 0]  # the parent's first turn, the child's

    asyncio.run(main())


class GatedFullContextRuntime(FullContextRuntime):
    """FullContextRuntime whose first answer waits for its gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def stream(self, turn: TurnInput) -> AsyncIterator[RuntimeEvent]:
        await self.gate.wait()
        async for event in super().stream(turn):
            yield event


def test_a_message_queued_during_the_rotating_turn_is_created_with_the_child(
    tmp_path: Path,
) -> None:
    """Layer: queued messages across a rotation (runs/rotation.py continue_in). The queued
    message leaves the parent in the `session.rotated` append and arrives in the child's
    creating append, so no failure between two appends can lose it; the child starts it as
    its first turn, and the model gets it (contract invariant 1)."""

    async def main() -> None:
        runtime = GatedFullContextRuntime()
        async with harness(tmp_path, runtime, rotating(tmp_path)) as h:
            parent = (await h.sessions.create("Research"))["session_id"]
            await h.engine.start(parent, "first question")
            queued = await h.queue.add(parent, "queued meanwhile", ())
            assert queued["started"] is None
            runtime.gate.set()
            await rotated_child(h, parent)  # the newest: the queued turn rotates again
            rotated = [e for e in await h.store.read(parent) if e.type == "session.rotated"]
            child = rotated[0].data["continuation_session_id"]
            created = await h.store.read(child)
            assert [e.type for e in created[:2]] == ["session.created", "queue.added"]
            assert created[1].data["queue_id"] == queued["queue_id"]
            assert created[1].data["text"] == "queued meanwhile"
            assert (await h.types(parent))[-2:] == ["session.rotated", "queue.removed"]
            await h.wait_idle(child)
            assert runtime.turns[1][-1] == {"role": "user", "content": "queued meanwhile"}
            assert (await h.sessions.view(child))["messages"][0]["content"] == "queued meanwhile"

    asyncio.run(main())


@pytest.mark.slow
def test_a_stop_during_the_handoff_summary_skips_the_rotation_and_frees_the_session(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """The finished run holds the session while the handoff summary is asked for: a Stop
    then is the user's word that nothing more should happen. It changed nothing, so a model
    server that never answered the summary kept the session busy (409 `session_busy`) for
    the request's whole timeout. Now the summary request is closed, the rotation skipped as
    a failed one is, and the parent takes the next turn. The Stop still answers `cancelled:
    false`: the run had ended `completed`, and `cancelled: true` means the Stop decided a
    run's outcome (docs/api.md §4)."""
    fake.context_length = 600
    args = ["--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"]
    with (
        running_server(tmp_path / "data", *args, "--compression-mode", "rotate") as server,
        server.client() as client,
    ):
        sid = new_session(client)
        crossing = reply(text("word " * 400), usage={"prompt_tokens": 20, "completion_tokens": 500})
        fake.script(crossing, reply(hang()))  # the answer, then the handoff summary request
        stream_id = start_turn(client, sid, "one")["stream_id"]
        assert fake.wait_for_requests(2)
        assert session_body(client, sid)["messages"][-1]["state"] == "completed"
        stop = client.post("/api/chat/cancel", json={"stream_id": stream_id})
        assert stop.json() == {"ok": True, "cancelled": False, "stream_id": stream_id}
        assert fake.wait_disconnects(1)  # the summary request is closed
        body = wait_idle(client, sid, timeout=5)
        assert body["continuation_session_id"] is None
        # the parent's context is as large as it was: compressed in place, then rotated
        fake.script(reply(text("SUMMARY")), reply(text("two answered")), reply(text("HANDOFF")))
        start_turn(client, sid, "two")
        assert wait_idle(client, sid)["messages"][-1]["content"] == "two answered"
        assert session_body(client, sid)["continuation_session_id"] is not None


def _make_children(data_dir: Path, url: str | None, parent: str, updated_at: float) -> None:
    """What a process killed between a rotation's two writes leaves: a child created with its
    handoff, the parent never recorded as rotated; and a second such child someone has used
    since (a turn of its own)."""

    async def main() -> None:
        store = open_store(Settings(data_dir=data_dir, database_url=url))
        created = {
            "title": "Research",
            "parent_session_id": parent,
            "inherited_updated_at": updated_at,
            "inherited_last_message_at": updated_at,
            "handoff": {"summary": "handoff", "tokens_before": 900, "tokens_after": 2},
        }
        turn = {"turn_id": "u_used", "stream_id": "r_used"}
        try:
            chosen = {"model": "picked-model", "pinned": True}  # the parent's, carried over
            await store.create_session(
                "s_unfinished",
                [Draft("session.created", created), Draft("session.updated", chosen)],
            )
            await store.create_session(
                "s_used",
                [
                    Draft("session.created", created),
                    Draft(
                        "turn.submitted",
                        {**turn, "text": "go on", "attachments": [], "submitted_at": updated_at},
                        "r_used",
                        "u_used",
                    ),
                    Draft("run.started", {**turn, "runtime": "demo"}, "r_used", "u_used"),
                    Draft("run.finished", {**turn, "state": "completed"}, "r_used", "u_used"),
                ],
            )
        finally:
            await store.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_child_left_by_a_rotation_cut_short_is_removed_at_start(
    tmp_path: Path, backend: str
) -> None:
    """Killed between creating the child and recording `session.rotated`, a rotation left a
    second copy of the conversation in the sidebar (the parent, not rotated, and the child
    showing its history). At start it is removed: nothing continues in it and it holds
    nothing the parent does not (its queued copies are still the parent's); the parent's next
    turn rotates again. A child someone has used is a conversation of its own and stays. On a
    shared log a child younger than ten minutes stays too: another replica may be between
    the two writes. Layers: log, sidebar; maintenance moves no `updated_at` (invariant 4)."""
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(database()) if backend == "postgres" else None
        args = ("--database-url", url) if url else ()
        data = tmp_path / "data"
        with running_server(data, *args) as server, server.client() as client:
            parent = new_session(client, "Research")
            start_turn(client, parent, "first question")
            before = wait_idle(client, parent)
        _make_children(data, url, parent, before["updated_at"])
        with running_server(data, *args) as server, server.client() as client:
            listed = {s["session_id"] for s in client.get("/api/sessions").json()["sessions"]}
            kept = {parent, "s_used"} | ({"s_unfinished"} if url else set())
            assert listed == kept
            unfinished = client.get("/api/session", params={"session_id": "s_unfinished"})
            assert unfinished.status_code == (200 if url else 404)
            after = session_body(client, parent)
            assert after["updated_at"] == before["updated_at"]
            assert after["messages"] == before["messages"]
