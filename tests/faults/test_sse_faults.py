"""Layers: live stream / SSE and run journal replay. Contract invariants 3 (reattach preserves
order) and 5 (replay is idempotent).

A client whose connection is cut at random bytes (mid-frame included) and who resumes with
`Last-Event-ID`, as a browser's EventSource does, ends with exactly the events 1..N, each
once, and folds the same projection as a client that was never cut, during a live run with
reasoning, interim progress, tools and a streamed answer. A cursor kept across a `kill -9`
and restart of the server mid-run resumes with exactly the suffix, recovery's ending
included. Each test runs on SQLite and on PostgreSQL (where the restarted server is a new
replica, and the ending comes when the dead one's lease expires: the resumed stream waits
for it, live).
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, barrier, delay, reasoning, reply, text, tool_call
from faultkit import Backend, live_text, openai_flags
from helpers import (
    ServerProcess,
    SSEFrame,
    fold_frames,
    new_session,
    read_events,
    run_events,
    running_server,
    seqs,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow

_LINE_END = re.compile(r"\r\n|\r|\n")
ANSWER = "The launch is on **Tuesday**, as the notes say."


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, fake_model: FakeOpenAI, backend: Backend
) -> Iterator[ServerProcess]:
    """One server per backend for the seeds: each test uses its own session and run."""
    root = tmp_path_factory.mktemp("sse")
    workspace = root / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("The launch is on Tuesday.\n")
    with (
        backend.flags() as store_flags,
        running_server(root / "data", *openai_flags(fake_model, workspace), *store_flags) as srv,
    ):
        yield srv


def complete_frames(raw: bytes) -> list[SSEFrame]:
    """The frames an EventSource dispatches from a stream cut after `raw`: only those whose
    terminating blank line arrived (any of CRLF, CR, LF ends a line), comments skipped."""
    lines = _LINE_END.split(raw.decode("utf-8", errors="replace"))
    lines.pop()  # what follows the last line end is an unfinished line
    frames, fields, data = [], {}, []
    for line in lines:
        if line == "":
            if data:
                frames.append(
                    SSEFrame(
                        event=fields.get("event", "message"),
                        id=fields.get("id"),
                        data="\n".join(data),
                    )
                )
            fields, data = {}, []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                fields[name] = value
    return frames


@dataclass
class CuttingClient:
    """Follows a session until `stream_id` finishes, hanging up after a random number of
    bytes each time and reconnecting with `Last-Event-ID`."""

    server: ServerProcess
    session_id: str
    seed: int
    max_bytes: int = 700
    frames: list[SSEFrame] = field(default_factory=list)
    cuts: int = 0
    cuts_mid_frame: int = 0
    error: BaseException | None = None

    def follow(self, stream_id: str) -> None:
        rng = random.Random(self.seed)
        cursor: str | None = None
        try:
            with self.server.client() as client:
                while not self._finished(stream_id):
                    headers = {} if cursor is None else {"Last-Event-ID": cursor}
                    params = {"after": "0"} if cursor is None else {}
                    got = self._connection(
                        client, headers, params, rng.randint(1, self.max_bytes), stream_id
                    )
                    ids = [f["id"] for f in got if f.get("id")]
                    cursor = ids[-1] if ids else cursor
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def _connection(
        self, client: httpx.Client, headers: dict, params: dict, budget: int, stream_id: str
    ) -> list[SSEFrame]:
        raw = b""
        path = f"/api/sessions/{self.session_id}/events"
        with client.stream("GET", path, headers=headers, params=params) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                raw += chunk
                got = complete_frames(raw[:budget])
                if len(raw) >= budget or _ends(got, stream_id):
                    break
        got = complete_frames(raw[:budget])
        if not _ends(got, stream_id):
            self.cuts += 1
            self.cuts_mid_frame += not raw[:budget].endswith((b"\n\n", b"\r\n\r\n"))
        self.frames.extend(got)
        return got

    def _finished(self, stream_id: str) -> bool:
        return _ends(self.frames, stream_id)


def _ends(frames: list[SSEFrame], stream_id: str) -> bool:
    return any(f.event == "run.finished" and f.json["stream_id"] == stream_id for f in frames)


def rich_run() -> list:
    """Reasoning, interim progress, two tool rounds and a streamed answer, paced so that the
    clients follow it live rather than replay it afterwards."""
    pause = delay(0.03)
    return [
        reply(
            reasoning("The user wants "),
            pause,
            reasoning("the launch date."),
            pause,
            text("Let me check "),
            pause,
            text("the notes."),
            pause,
            tool_call("call_notes", "read_file", {"path": "notes.txt"}),
        ),
        reply(
            reasoning("Found it; "),
            pause,
            reasoning("list the folder too."),
            pause,
            text("And the folder."),
            pause,
            tool_call("call_list", "list_files", {}),
        ),
        reply(
            *[
                step
                for start in range(0, len(ANSWER), 6)
                for step in (text(ANSWER[start : start + 6]), pause)
            ]
        ),
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clients_cut_at_random_bytes_fold_what_an_uncut_client_folds(
    shared: ServerProcess, fake_model: FakeOpenAI, seed: int
) -> None:
    fake_model.reset()
    fake_model.script(*rich_run())
    with shared.client() as client:
        sid = new_session(client)
    cutters = [CuttingClient(shared, sid, seed=seed * 100 + k) for k in range(2)]
    stream: dict[str, str] = {}
    ready = threading.Event()

    def follow(cutter: CuttingClient) -> None:
        ready.wait(10)
        cutter.follow(stream["id"])

    threads = [threading.Thread(target=follow, args=(c,)) for c in cutters]
    for t in threads:
        t.start()
    with shared.client() as client:
        stream["id"] = start_turn(client, sid, "When is the launch?")["stream_id"]
        ready.set()
        clean = run_events(client, sid, stream["id"], timeout=30)
        body = wait_idle(client, sid)
    for t in threads:
        t.join(30)
    assert body["messages"][-1]["state"] == "completed"
    assert body["messages"][-1]["content"] == ANSWER
    kinds = [i["type"] for i in body["messages"][-1]["timeline"]]
    assert kinds.count("tool") == 2 and kinds.count("reasoning") == 2
    expected = fold_frames(clean)
    assert expected["messages"] == body["messages"]
    for cutter in cutters:
        assert cutter.error is None, cutter.error
        assert cutter.cuts >= 3 and cutter.cuts_mid_frame >= 1  # the faults did happen
        assert seqs(cutter.frames) == seqs(clean)  # 1..N: no gap, no duplicate
        assert [f["data"] for f in cutter.frames if f.get("id")] == [
            f["data"] for f in clean if f.get("id")
        ]
        assert fold_frames(cutter.frames) == expected


def test_a_cursor_kept_across_a_restart_mid_run_resumes_with_the_suffix(
    tmp_path: Path, fake: FakeOpenAI, workspace: Path, backend: Backend, store_flags: list[str]
) -> None:
    fake.script(
        reply(
            reasoning("Thinking first."),
            text("Before the restart "),
            barrier("mid"),
            text("never shown"),
        )
    )
    with running_server(tmp_path / "data", *openai_flags(fake, workspace), *store_flags) as server:
        with server.client() as client:
            sid = new_session(client)
            run = start_turn(client, sid, "Survive a restart")
            assert fake.wait_reached("mid", 10)
            wait_until(lambda: live_text(client, sid) == "Before the restart ")
            before = read_events(client, sid, after="0", stop_on="heartbeat")
            cursor = seqs(before)[-1]
        server.kill()
        server.start()
        with server.client() as client:
            resumed = read_events(
                client,
                sid,
                headers={"Last-Event-ID": str(cursor)},
                stop_on="run.finished",
                timeout=10 + backend.takeover_seconds,
            )
            fresh = read_events(client, sid, after="0", stop_on="heartbeat")
            body = session_body(client, sid)
    assert seqs(resumed) == list(range(cursor + 1, seqs(fresh)[-1] + 1))
    suffix = [f for f in resumed if f.get("id")]  # heartbeats may come first on PostgreSQL
    assert [f.event for f in suffix] == ["run.finished"]
    assert suffix[0].json["data"]["state"] == "interrupted"
    assert suffix[0].json["stream_id"] == run["stream_id"]
    assert seqs(before + resumed) == seqs(fresh)
    view = fold_frames(before + resumed)
    assert view == fold_frames(fresh)
    assert view["live"] is None and view["messages"] == body["messages"]
    assert view["messages"][-1]["content"] == "Before the restart "
