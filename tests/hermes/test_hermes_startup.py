"""What a person sees when the Hermes sidecar cannot start: the run ends with the reason and
what to do about it, never as a bug's `repr`. The server itself keeps serving (the sidecar
starts in the background), so the first turn is where a bad `--hermes-python` shows."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from procs import processes_with

from fake_openai import FakeOpenAI
from helpers import ServerProcess, new_session, running_server, start_turn, wait_idle, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _first_turn_error(tmp_path: Path, fake: FakeOpenAI, python: str) -> dict:
    with (
        running_server(
            tmp_path / "data",
            "--runtime",
            "hermes",
            "--hermes-python",
            python,
            "--base-url",
            fake.base_url,
            "--model",
            fake.model,
            env={"TETHER_HERMES_HOME": str(tmp_path / "home")},
        ) as server,
        server.client() as client,
    ):
        sid = new_session(client)
        start_turn(client, sid, "hello")
        body = wait_idle(client, sid, timeout=60)
        # the next turn tries again and says the same
        start_turn(client, sid, "again")
        again = wait_idle(client, sid, timeout=60)
    first, second = body["messages"][-1], again["messages"][-1]
    assert first["state"] == second["state"] == "error"
    assert first["error"] == second["error"]
    return first["error"]


def test_a_python_without_hermes_agent_is_named_with_the_fix(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    error = _first_turn_error(tmp_path, fake, sys.executable)  # Tether's: no hermes-agent
    message = error["message"]
    assert not message.startswith("RuntimeUnavailable(")
    assert message.startswith(f"Hermes Agent could not start: {sys.executable} cannot import")
    assert "hermes-agent" in message and "--hermes-python" in message
    assert error["code"] == "internal"


def test_a_hermes_python_that_cannot_be_run_says_so(tmp_path: Path, fake: FakeOpenAI) -> None:
    not_a_program = tmp_path / "python"
    not_a_program.write_text("not a program\n")  # exists, but is not executable
    error = _first_turn_error(tmp_path, fake, str(not_a_program))
    assert error["message"] == (
        f"Hermes Agent could not start: {not_a_program} could not be run (Permission denied); "
        "point --hermes-python (TETHER_HERMES_PYTHON) at the Python that has hermes-agent."
    )


def test_a_sidecar_that_exits_before_it_is_ready_gives_its_exit_code(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'cannot start: no licence' >&2\nexit 3\n")
    script.chmod(0o755)
    error = _first_turn_error(tmp_path, fake, str(script))
    assert error["message"] == (
        "Hermes Agent could not start: the Hermes sidecar exited with code 3 before it was "
        "ready\ncannot start: no licence"
    )


def _hanging_sidecar(tmp_path: Path, fake: FakeOpenAI) -> tuple[list[str], dict[str, str]]:
    """Flags and environment of a server whose sidecar never says it is ready: its "Python"
    sleeps, named by the test's directory so `processes_with` finds it."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexec sleep 1000 # {tmp_path.name}\n")
    script.chmod(0o755)
    args = ["--runtime", "hermes", "--hermes-python", str(script)]
    args += ["--base-url", fake.base_url, "--model", fake.model]
    return args, {"TETHER_HERMES_HOME": str(tmp_path / "home")}


def test_shutdown_does_not_wait_for_a_sidecar_that_hangs_starting(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """The sidecar starts with the server; one that never says it is ready (an import that
    hangs on a network mount, a stuck warm-up) used to hold a graceful shutdown for the whole
    start-up timeout (180 s), so a service manager ended Tether with SIGKILL instead."""
    args, env = _hanging_sidecar(tmp_path, fake)
    server = ServerProcess(tmp_path / "data", *args, env=env).start()
    try:
        wait_until(lambda: processes_with(tmp_path.name), 10, "the sidecar starting")
        started = time.monotonic()
        assert server.stop(timeout=60) == 0
        assert time.monotonic() - started < 10
        assert not processes_with(tmp_path.name)
    finally:
        for pid in processes_with(tmp_path.name):
            os.kill(pid, signal.SIGKILL)
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def test_stop_ends_a_turn_that_waits_for_the_sidecar_to_start(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    """A turn sent while the sidecar is still starting waits for it (seconds on a cold
    cache, up to the 180 s start-up timeout when it hangs). Stop used to change nothing
    until then: the engine waited for the session's handle, which waited for the sidecar."""
    args, env = _hanging_sidecar(tmp_path, fake)
    try:
        with running_server(tmp_path / "data", *args, env=env) as server, server.client() as client:
            sid = new_session(client)
            run = start_turn(client, sid, "hello")
            time.sleep(1.0)
            stop = client.post("/api/chat/cancel", json={"stream_id": run["stream_id"]})
            assert stop.json()["cancelled"] is True
            last = wait_idle(client, sid, timeout=10)["messages"][-1]
            assert last["state"] == "cancelled"
    finally:
        for pid in processes_with(tmp_path.name):
            os.kill(pid, signal.SIGKILL)
