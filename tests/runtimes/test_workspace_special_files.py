"""The workspace tools read regular files only (issue 11, point 5): a named pipe, a device or
a socket in the workspace is a tool error naming what it is, never a blocked thread. Proved
on the tools themselves and through a real run of a real server, which must still stop
promptly on SIGTERM afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.runtimes.tools import ToolRunner, WorkspaceTools

from fake_openai import FakeOpenAI, reply, text, tool_call
from helpers import ServerProcess, new_session, start_turn, wait_idle


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("The launch is on Tuesday.\n")
    os.mkfifo(root / "pipe")
    os.mknod(root / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # like /dev/zero
    os.symlink(root / "pipe", root / "pipe-link")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
        yield root


def run_within(tools: WorkspaceTools, name: str, args: dict, seconds: float = 2) -> tuple:
    """The tool's result, or a failed test (not a hung one) when it blocks."""
    results: list[tuple[str, bool]] = []
    worker = threading.Thread(target=lambda: results.append(tools.run_tool(name, args)))
    worker.daemon = True
    worker.start()
    worker.join(seconds)
    assert results, f"{name} {args} was still blocked after {seconds} s"
    return results[0]


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("pipe", "a named pipe (FIFO)"),
        ("pipe-link", "a named pipe (FIFO)"),
        ("zero", "a character device"),
        ("sock", "a socket"),
    ],
)
def test_reading_anything_but_a_regular_file_is_a_clear_error(
    ws: Path, path: str, kind: str
) -> None:
    tools = WorkspaceTools(ws)
    result, is_error = run_within(tools, "read_file", {"path": path})
    assert is_error and result.startswith(f"{path} is {kind}, not a regular file")
    result, is_error = run_within(tools, "search_files", {"pattern": "x", "path": path})
    assert is_error and f"is {kind}" in result


def test_a_search_walks_past_special_files(ws: Path) -> None:
    result, is_error = run_within(WorkspaceTools(ws), "search_files", {"pattern": "launch"})
    assert not is_error and result == "notes.txt:1: The launch is on Tuesday."


def test_a_tool_call_past_its_deadline_is_abandoned_with_an_error_result(tmp_path: Path) -> None:
    for n in range(3000):
        (tmp_path / f"f{n}.txt").write_text("nothing to see\n" * 50)
    runner = ToolRunner(WorkspaceTools(tmp_path), timeout=0.001)
    result, is_error = asyncio.run(runner.run("search_files", {"pattern": "launch"}))
    assert is_error and result == "search_files did not finish within 0.001 s and was abandoned."


@pytest.mark.slow
def test_a_run_that_reads_a_fifo_gets_an_error_result_and_the_server_still_stops(
    tmp_path: Path, ws: Path
) -> None:
    with FakeOpenAI() as fake:
        fake.script(
            reply(tool_call("call_1", "read_file", {"path": "pipe"})),
            reply(tool_call("call_2", "read_file", {"path": "zero"})),
            reply(tool_call("call_3", "search_files", {"pattern": "launch"})),
            reply(text("The launch is on Tuesday.")),
        )
        server = ServerProcess(
            tmp_path / "data",
            *("--runtime", "openai", "--base-url", fake.base_url, "--model", "fake-model"),
            *("--workspace", str(ws)),
        ).start()
        try:
            with server.client() as client:
                sid = new_session(client)
                start_turn(client, sid, "When is the launch?")
                assistant = wait_idle(client, sid)["messages"][-1]
            assert assistant["state"] == "completed"
            pipe, zero, search = [i for i in assistant["timeline"] if i["type"] == "tool"]
            assert pipe["is_error"] and "is a named pipe (FIFO)" in pipe["result_preview"]
            assert zero["is_error"] and "is a character device" in zero["result_preview"]
            assert not search["is_error"] and "notes.txt:1" in search["result_preview"]
            started = time.monotonic()
            assert server.stop(signal.SIGTERM, timeout=10) == 0
            assert time.monotonic() - started < 5
        finally:
            if server.proc is not None and server.proc.poll() is None:
                server.kill()
