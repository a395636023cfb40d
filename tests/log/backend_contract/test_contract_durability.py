"""Backend contract, layer: the log. An acknowledged append is durable: it survives closing
and reopening, and a process killed with SIGKILL right after its acknowledgements; what was
not acknowledged is there whole or not at all (invariant 3 after `kill -9`)."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from backend_kit import Backend

from tether.log import Draft, StreamClosed

WRITER = Path(__file__).with_name("crash_writer.py")
ACKS_BEFORE_KILL = 150


def test_acknowledged_events_and_index_states_survive_reopening(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        created = await store.create_session("s1", [Draft("session.created", {"title": "a"})])
        appended = await store.append("s1", [Draft("session.updated", {"pinned": True})])
        state = await store.index_state("s1")
        await store.aclose()
        again = await backend.open()
        assert await again.read("s1") == created + appended
        assert await again.last_seq("s1") == 2
        assert await again.index_state("s1") == state
        assert [e.seq for e in await again.append("s1", [Draft("x")])] == [3]
        await again.aclose()

    asyncio.run(main())


def read_acks_then_kill(child: subprocess.Popen, count: int, timeout: float) -> list[dict]:
    """Acknowledgement lines until `count` pairs were acknowledged, then SIGKILL at once
    (appends are still in flight: the kill lands mid-batch)."""
    assert child.stdout is not None
    acks: list[dict] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        buffer = b""
        while sum(a["kind"] == "pair" for a in acks) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the writer acknowledged only {len(acks)} appends")
            if not sel.select(timeout=1):
                continue
            chunk = os.read(child.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"the writer exited: {child.wait()}")
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            acks.extend(json.loads(line) for line in lines)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    return acks


@pytest.mark.slow
def test_acknowledged_appends_survive_sigkill(backend: Backend) -> None:
    child = subprocess.Popen(
        [sys.executable, str(WRITER), json.dumps(backend.spec())],
        stdout=subprocess.PIPE,
        cwd=WRITER.parent,
    )
    try:
        acks = read_acks_then_kill(child, ACKS_BEFORE_KILL, timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL

    async def main() -> None:
        store = await backend.open()
        events = await store.read("crash")
        by_seq = {e.seq: e.data for e in events}
        for ack in acks:  # every acknowledged event, as acknowledged
            assert [by_seq.get(seq) for seq in ack["seqs"]] == ack["tokens"]
        last = max(seq for ack in acks for seq in ack["seqs"])
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert len(events) >= last
        for event in events[2:]:  # an unacknowledged pair is there whole or not at all
            mate = by_seq.get(event.seq + (1 if event.data["token"].endswith("a") else -1))
            assert mate is not None and mate["token"][:-1] == event.data["token"][:-1]
        assert await store.last_seq("crash") == len(events)
        assert (await store.index_state("crash"))["seqs"] == list(range(1, len(events) + 1))
        with pytest.raises(StreamClosed):  # the fence survived the crash
            await store.append("crash", [Draft("text.delta", {}, stream_id="closed")])
        assert [e.seq for e in await store.append("crash", [Draft("x")])] == [len(events) + 1]
        await store.aclose()

    asyncio.run(main())
