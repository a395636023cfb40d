"""Layers: run journal (the log's writer), worker lifecycle registry, visible transcript.

The database stops taking writes in the middle of a run: the disk is full, a file-size limit
is hit, or the database files become read-only. What the user sees:

- during the fault: every read keeps working (`/api/health`, `GET /api/sessions`, every
  session, and the log replayed from seq 1 exactly as it was shown); a write answers 503
  `storage_unavailable`, naming the database, and leaves no trace; the cut run keeps its
  session busy with its live scene as last recorded, and its model request is closed;
- once the database takes writes again: the run settles as exactly one `run.finished`
  `{state: "error", error: {code: "internal", message: "could not write to <db>: ..."}}`, so
  its assistant row keeps the text shown before the fault and ends with an error notice; the
  log is contiguous (the refused batch left no gap); new turns complete, here and elsewhere;
- a shutdown during the fault exits 0, and the next start settles the run as interrupted.
- a start (or queued message) with an attachment on a full disk is 503 `storage_unavailable`
  naming the attachment and its directory, and leaves no file (not even an empty temporary
  one); when the bytes fit but the turn cannot be logged, they are removed again;
- a read-only data directory is refused at start with a message that says so and names it.

How the fault is injected, as root: "full" mounts a small tmpfs on the data directory and
fills it (ENOSPC), then deletes the filler; "fsize" lowers RLIMIT_FSIZE of the server
process to the size of its files (EFBIG; Python ignores SIGXFSZ), then lifts it; "readonly"
sets the immutable attribute on the database files (EPERM even for root and for open file
descriptors, where the file system supports it), then clears it. Where mounting is not
possible, or the immutable attribute does not stop writes, the file-size limit stands in.

SQLite only: the faults are injected into the data directory's database files.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fake_openai import FakeOpenAI, barrier, hang, reply, text
from faultkit import (
    assert_each_run_ends_once,
    assert_log_intact,
    live_text,
    openai_flags,
    whole_log,
)
from helpers import (
    ServerProcess,
    new_session,
    session_body,
    start_turn,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow


def _succeeds(*command: str) -> bool:
    try:
        return subprocess.run(command, capture_output=True).returncode == 0
    except OSError:  # the tool is not installed
        return False


class Fault:
    """Stops the server's database writes (`inject`) and lets them through again (`lift`)."""

    def __init__(self, kind: str, data_dir: Path, size: str = "16m"):
        self.kind = kind
        self.data_dir = data_dir
        self.mounted = False
        self.filler = data_dir / "filler"
        self.server: ServerProcess | None = None
        self.active = False
        data_dir.mkdir(parents=True)
        if kind == "full":
            self.mounted = _succeeds(
                "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(data_dir)
            )
            if not self.mounted:
                self.kind = "fsize"
        if kind == "readonly" and not self._immutable_stops_writes():
            self.kind = "fsize"

    def _immutable_stops_writes(self) -> bool:
        """Does the immutable attribute refuse writes through a descriptor opened before it
        was set? (ext4 and XFS check it on every write; tmpfs, for one, does not.)"""
        probe = self.data_dir / "probe"
        stopped = False
        with open(probe, "wb") as handle:
            if _succeeds("chattr", "+i", str(probe)):
                try:
                    handle.write(b"x")
                    handle.flush()
                except OSError:
                    stopped = True
                finally:
                    _succeeds("chattr", "-i", str(probe))
        probe.unlink()
        return stopped

    def _db_files(self) -> list[str]:
        return [str(p) for p in self.data_dir.glob("tether.db*")]

    def inject(self) -> None:
        assert self.server is not None and self.server.proc is not None
        self.active = True
        if self.kind == "full":
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT)
            chunk = 1 << 20
            try:
                while chunk >= 512:
                    try:
                        os.write(fd, bytes(chunk))
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC
                        chunk //= 2
            finally:
                os.close(fd)
        elif self.kind == "fsize":  # the write-ahead log may not grow any more
            size = os.path.getsize(self.data_dir / "tether.db-wal")
            _, hard = resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(self.server.proc.pid, resource.RLIMIT_FSIZE, (size, hard))
        else:
            subprocess.run(["chattr", "+i", *self._db_files()], check=True)

    def lift(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.kind == "full":
            self.filler.unlink()
        elif self.kind == "fsize":
            proc = self.server.proc if self.server else None
            if proc is not None and proc.poll() is None:
                _, hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
        else:
            subprocess.run(["chattr", "-i", *self._db_files()], check=True)

    def close(self) -> None:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            self.lift()
        if self.mounted and subprocess.run(["umount", str(self.data_dir)]).returncode:
            subprocess.run(["umount", "-l", str(self.data_dir)])  # still busy: detach it


@pytest.fixture
def fault(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fault]:
    injector = Fault(request.param, tmp_path / "data")
    try:
        yield injector
    finally:
        injector.close()  # after the server fixture stopped the server


@pytest.fixture
def server(fault: Fault, fake: FakeOpenAI, workspace: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(fault.data_dir, *openai_flags(fake, workspace)).start()
    fault.server = srv
    try:
        yield srv
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            fault.lift()  # let the shutdown record what it can
            srv.stop()


def cut_a_run(client: httpx.Client, fake: FakeOpenAI, fault: Fault) -> tuple[str, dict, list]:
    """Start a run, let it show some text, stop the database's writes, let the model send
    more. Returns (session id, run, the log as shown before the fault)."""
    fake.script(
        reply(text("Shown before the fault. "), barrier("fault"), text("Never recorded."), hang())
    )
    sid = new_session(client, "the cut one")
    run = start_turn(client, sid, "Write this down")
    assert fake.wait_reached("fault", 10)
    wait_until(lambda: live_text(client, sid) == "Shown before the fault. ")
    shown = whole_log(client, sid)
    fault.inject()
    fake.release("fault")
    return sid, run, shown


@pytest.mark.parametrize("fault", ["full", "fsize", "readonly"], indirect=True)
def test_a_write_fault_mid_run_ends_it_with_a_visible_error_and_the_server_recovers(
    server: ServerProcess, fake: FakeOpenAI, fault: Fault
) -> None:
    with server.client() as client:
        other = new_session(client, "untouched")
        fake.script(reply(text("An earlier answer.")))
        start_turn(client, other, "Earlier question")
        other_before = wait_idle(client, other)
        other_log = whole_log(client, other)
        sid, run, shown = cut_a_run(client, fake, fault)

        # the model request of the cut run is closed: nothing it says can be recorded
        assert fake.wait_disconnects(1, 10)
        body = session_body(client, sid)
        assert body["busy"] is True and body["live"]["stream_id"] == run["stream_id"]
        assert live_text(client, sid) == "Shown before the fault. "
        # reads keep working, and show what they showed before
        assert client.get("/api/health").status_code == 200
        listed = client.get("/api/sessions")
        assert listed.status_code == 200
        assert {r["session_id"] for r in listed.json()["sessions"]} == {sid, other}
        assert session_body(client, other)["messages"] == other_before["messages"]
        assert whole_log(client, other) == other_log
        assert whole_log(client, sid) == shown
        # writes are refused, clearly and without a trace
        for refused in (
            client.post("/api/sessions", json={"title": "new"}),
            client.post("/api/chat/start", json={"session_id": other, "message": "Lost?"}),
            client.patch("/api/session", json={"session_id": other, "title": "renamed"}),
        ):
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "storage_unavailable"
            assert str(fault.data_dir / "tether.db") in refused.json()["message"]
        assert (
            client.post("/api/chat/start", json={"session_id": sid, "message": "x"}).json()["code"]
            == "session_busy"
        )  # the run is not over yet

        fault.lift()
        body = wait_idle(client, sid)
        user, assistant = body["messages"]
        assert user["content"] == "Write this down"
        assert assistant["state"] == "error" and assistant["stream_id"] == run["stream_id"]
        assert assistant["content"] == "Shown before the fault. "
        assert assistant["error"]["code"] == "internal"
        assert assistant["error"]["message"].startswith(
            f"could not write to {fault.data_dir / 'tether.db'}"
        )
        assert assistant["timeline"][-1] == {
            "id": f"{run['stream_id']}.notice",
            "type": "notice",
            "kind": "error",
            "text": f"Error (internal): {assistant['error']['message']}",
        }
        log = whole_log(client, sid)
        assert_log_intact(log)
        assert log[: len(shown)] == shown
        assert [e["type"] for e in log[len(shown) :]] == ["run.finished"]
        assert_each_run_ends_once(log)
        assert "Never recorded." not in str(log)
        assert session_body(client, other)["title"] == "untouched"
        assert len(client.get("/api/sessions").json()["sessions"]) == 2

        for session_id in (sid, other):
            fake.script(reply(text("Writing again.")))
            start_turn(client, session_id, "Are we back?")
            assert wait_idle(client, session_id)["messages"][-1]["state"] == "completed"
        sent = fake.requests[-2]["messages"]  # the cut turn and its partial text go along
        assert sent[0] == {"role": "user", "content": "Write this down"}
        assert sent[1]["content"].startswith("Shown before the fault. ")


@pytest.mark.parametrize("fault", ["full"], indirect=True)
def test_a_stop_the_storage_cannot_record_yet_is_recorded_with_the_runs_end(
    server: ServerProcess, fake: FakeOpenAI, fault: Fault
) -> None:
    """Layer: runs controls and worker (invariant 9: a cancelled run's log holds the Stop).
    A Stop while the database refuses writes closes the model request at once, but its
    `run.cancel_requested` could not be written: it answered 503 "nothing was changed"
    (the run was stopped), and once the disk had room the run's end read `cancelled` with
    no Stop in the log. The Stop now answers that it stopped the run, and the run's end,
    retried until the storage takes it, records the Stop with it."""
    fake.script(reply(text("Shown before the fault. "), barrier("fault"), hang()))
    with server.client() as client:
        sid = new_session(client, "stopped during the fault")
        run = start_turn(client, sid, "Write this down")
        assert fake.wait_reached("fault", 10)
        wait_until(lambda: live_text(client, sid) == "Shown before the fault. ")
        shown = whole_log(client, sid)
        fault.inject()
        stop = client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
        assert stop.status_code == 200, stop.text
        assert stop.json()["cancelled"] is True
        assert fake.wait_disconnects(1, 10)
        assert session_body(client, sid)["busy"] is True  # its end is not written yet
        fault.lift()
        assistant = wait_idle(client, sid)["messages"][-1]
        assert assistant["state"] == "cancelled"
        log = whole_log(client, sid)
        assert log[: len(shown)] == shown
        assert [e["type"] for e in log[len(shown) :]] == ["run.cancel_requested", "run.finished"]
        assert_each_run_ends_once(log)


@pytest.mark.parametrize("fault", ["full"], indirect=True)
def test_a_shutdown_during_the_fault_leaves_the_run_for_recovery(
    server: ServerProcess, fake: FakeOpenAI, fault: Fault
) -> None:
    with server.client() as client:
        sid, run, shown = cut_a_run(client, fake, fault)
        assert fake.wait_disconnects(1, 10)
    assert server.stop() == 0  # the ending cannot be written: shutdown still completes
    assert "could not record its end at shutdown" in server.log()
    fault.lift()
    server.start()
    with server.client() as client:
        log = whole_log(client, sid)
        assert_log_intact(log)
        assert log[: len(shown)] == shown
        ending = assert_each_run_ends_once(log)[run["stream_id"]]
        assert ending["state"] == "interrupted" and ending["maintenance"] is True
        assistant = session_body(client, sid)["messages"][-1]
        assert assistant["content"] == "Shown before the fault. "
        fake.script(reply(text("Back.")))
        start_turn(client, sid, "Still here?")
        assert wait_idle(client, sid)["messages"][-1]["state"] == "completed"


def _text_upload(name: str, size: int) -> dict:
    data = base64.b64encode(b"x" * size).decode()
    return {"name": name, "mime": "text/plain", "data_base64": data}


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Fault]:
    """A data directory on an 8 MiB tmpfs (where mounting is not possible: the file-size
    limit, injected once the server runs)."""
    injector = Fault("full", tmp_path / "data", size="8m")
    try:
        yield injector
    finally:
        injector.close()


@pytest.fixture
def demo_server(tiny_disk: Fault) -> Iterator[ServerProcess]:
    srv = ServerProcess(tiny_disk.data_dir).start()
    tiny_disk.server = srv
    try:
        yield srv
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            tiny_disk.lift()
            srv.stop()


def test_a_start_with_an_attachment_on_a_full_disk_is_503_and_leaves_no_file(
    demo_server: ServerProcess, tiny_disk: Fault
) -> None:
    """Issue 11, point 6: this answered 500 (the connection reset) and left an empty
    temporary file in attachments/."""
    attachments = tiny_disk.data_dir / "attachments"
    with demo_server.client() as client:
        sid = new_session(client, "kept as it was")
        if tiny_disk.kind == "fsize":  # no tmpfs: the file-size limit stands in for the disk
            tiny_disk.inject()
        before, log_before, files_before = (
            session_body(client, sid),
            whole_log(client, sid),
            _files(attachments),
        )
        refused = client.post(
            "/api/chat/start",
            json={
                "session_id": sid,
                "message": "Read this",
                "attachments": [_text_upload("big.txt", 10 * 2**20)],
            },
        )
        assert refused.status_code == 503, refused.text
        body = refused.json()
        assert body["code"] == "storage_unavailable"
        assert str(attachments) in body["message"] and "'big.txt'" in body["message"]
        assert session_body(client, sid) == before
        assert whole_log(client, sid) == log_before
        assert _files(attachments) == files_before == []
        tiny_disk.lift()
        start_turn(client, sid, "A small one", attachments=[_text_upload("small.txt", 100)])
        assert wait_idle(client, sid)["messages"][0]["attachments"][0]["name"] == "small.txt"


@pytest.mark.parametrize("fault", ["fsize"], indirect=True)
def test_a_start_whose_turn_cannot_be_logged_leaves_no_attachment_bytes(
    server: ServerProcess, fault: Fault
) -> None:
    """The bytes fit but the event that would hold them does not: they are removed again."""
    attachments = fault.data_dir / "attachments"
    with server.client() as client:
        sid = new_session(client, "kept as it was")
        before = session_body(client, sid)
        fault.inject()  # the log cannot grow; a 100-byte attachment still fits under the limit
        for path, body in (
            ("/api/chat/start", {"session_id": sid, "message": "Read this"}),
            ("/api/chat/queue", {"session_id": sid, "message": "And this"}),
        ):
            body["attachments"] = [_text_upload("notes.txt", 100)]
            refused = client.post(path, json=body)
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "storage_unavailable"
            assert _files(attachments) == []
        fault.lift()
        assert session_body(client, sid) == before


def test_a_read_only_data_directory_is_refused_at_start_and_named(tmp_path: Path) -> None:
    """It was reported as a damaged database ("attempt to write a readonly database ...
    restore it from a backup"). As root, a read-only mount (or, where mounting is not
    possible, the immutable attribute) is what makes a directory read-only."""
    data = tmp_path / "data"
    data.mkdir()
    mounted = _succeeds("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(data))
    try:
        server = ServerProcess(data).start()
        with server.client() as client:
            sid = new_session(client, "still here")
        server.stop()
        if mounted:
            assert _succeeds("mount", "-o", "remount,ro", str(data))
        else:
            subprocess.run(["chattr", "+i", str(data), *map(str, data.glob("*"))], check=True)
        refused = subprocess.run(
            [sys.executable, "-m", "tether", "serve", "--data-dir", str(data), "--no-browser"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1
        assert f"The data directory {data} is read-only" in refused.stderr
        assert "restore it from a backup" not in refused.stderr
        if mounted:
            assert _succeeds("mount", "-o", "remount,rw", str(data))
        else:
            subprocess.run(["chattr", "-i", str(data), *map(str, data.glob("*"))], check=True)
        server = ServerProcess(data).start()
        with server.client() as client:
            assert session_body(client, sid)["title"] == "still here"
        server.stop()
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(data)])


@pytest.fixture
def rotating_server(fault: Fault, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    """The `openai` runtime with `--compression-mode rotate`: a turn that reports 900 of the
    1,000-token window continues in a child once it has finished."""
    rotate = ("--context-window", "1000", "--compression-mode", "rotate")
    srv = ServerProcess(fault.data_dir, *openai_flags(fake), *rotate).start()
    fault.server = srv
    try:
        yield srv
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            fault.lift()
            srv.stop()


@pytest.mark.parametrize("fault", ["full"], indirect=True)
def test_a_rotation_the_storage_refuses_is_skipped_and_its_run_still_frees_the_session(
    rotating_server: ServerProcess, fake: FakeOpenAI, fault: Fault
) -> None:
    """Layers: worker lifecycle registry, compression (runs/worker.py, runs/rotation.py;
    contract invariant 9: once a run has ended, its session admits the next turn). The
    database stops taking writes after the turn's `run.finished` is written, while the
    rotation's summary is asked for: the child cannot be created. That `StorageError`
    escaped the worker before it unwound its run, so the session stayed busy on this server
    until a restart. Now the rotation is skipped with a log line, the run unwinds, nothing of
    a rotation is left, and the next turn (which crosses the threshold again) rotates."""
    crossing = {"prompt_tokens": 900, "completion_tokens": 10}
    fake.script(
        reply(text("A long answer."), usage=crossing),
        reply(barrier("summary"), text("The handoff.")),
    )
    with rotating_server.client() as client:
        sid = new_session(client, "about to rotate")
        run = start_turn(client, sid, "Tell me everything")
        assert fake.wait_reached("summary", 10)  # the turn has ended: its rotation began
        fault.inject()
        fake.release("summary")
        body = wait_idle(client, sid)  # was: busy with the ended run until a restart
        assert f"rotation of {sid} skipped: it could not be written" in rotating_server.log()
        assert body["continuation_session_id"] is None
        assert body["messages"][-1]["state"] == "completed"
        assert body["messages"][-1]["stream_id"] == run["stream_id"]
        fault.lift()
        assert [r["session_id"] for r in client.get("/api/sessions").json()["sessions"]] == [sid]
        log = whole_log(client, sid)
        assert_log_intact(log)
        assert_each_run_ends_once(log)
        assert "session.rotated" not in [e["type"] for e in log]

        fake.script(reply(text("Another long one."), usage=crossing), reply(text("Handoff 2.")))
        start_turn(client, sid, "And the rest")
        child = wait_until(
            lambda: session_body(client, sid)["continuation_session_id"], what="a rotation"
        )
        wait_idle(client, sid)
        assert session_body(client, child)["busy"] is False
