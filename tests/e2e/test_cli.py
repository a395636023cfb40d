"""The `tether` command as a user runs it (docs/api.md §1): flags and TETHER_* variables, the
per-user data directory, readiness, clean exit on SIGTERM/SIGINT, durability across kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from helpers import ServerProcess, free_port, iter_sse

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_zero_even_with_open_streams(tmp_path: Path, sig: int) -> None:
    server = ServerProcess(tmp_path / "data").start()
    with server.client() as client:
        sid = client.post("/api/sessions", json={}).json()["session"]["session_id"]
        opened = threading.Event()

        def follow(path: str) -> None:
            try:
                with client.stream("GET", path) as response:
                    for _ in iter_sse(response):
                        opened.set()
            except httpx.HTTPError:
                pass

        readers = [
            threading.Thread(target=follow, args=(p,), daemon=True)
            for p in (f"/api/sessions/{sid}/events", "/api/events")
        ]
        for r in readers:
            r.start()
        assert opened.wait(5)
        assert server.stop(sig, timeout=15) == 0


def test_environment_variables_configure_serve(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "TETHER_PORT": str(port),
        "TETHER_DATA_DIR": str(tmp_path / "d"),
        "TETHER_NO_BROWSER": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(200):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health").status_code == 200:
                    break
            except httpx.HTTPError:
                threading.Event().wait(0.05)
        health = httpx.get(f"http://127.0.0.1:{port}/api/health").json()
        assert health["ok"] is True and health["runtime"] == "demo"
        assert (tmp_path / "d" / "tether.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_default_data_dir_is_per_user(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "unused")
    server.extra = []
    port = free_port()
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "serve", "--port", str(port), "--no-browser"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/health")
                break
            except httpx.HTTPError:
                threading.Event().wait(0.05)
        assert (tmp_path / "xdg" / "tether" / "tether.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_non_loopback_without_password_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "serve",
            "--host",
            "0.0.0.0",
            "--data-dir",
            str(tmp_path),
            "--no-browser",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "without a password" in result.stderr


def test_corrupted_database_stops_start_with_the_file_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "tether.db").write_bytes(b"garbage" * 1000)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "serve",
            "--data-dir",
            str(data),
            "--port",
            str(free_port()),
            "--no-browser",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert str(data / "tether.db") in result.stdout + result.stderr
    assert (data / "tether.db").read_bytes() == b"garbage" * 1000


@pytest.mark.parametrize(
    "command",
    [["serve", "--no-browser", "--port", "0"], ["users", "add", "bob", "--password-env", "PW"]],
    ids=["serve", "users add"],
)
def test_a_data_directory_that_cannot_be_made_is_one_clear_line(
    tmp_path: Path, command: list[str]
) -> None:
    """A `--data-dir` under a file (or on a path the system refuses) printed a Python
    traceback; it is one line naming the directory and the system's reason, exit 1, and
    nothing is created."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    data = blocker / "data"
    result = subprocess.run(
        [sys.executable, "-m", "tether", *command, "--data-dir", str(data)],
        env={**os.environ, "PW": "a long enough password"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"Cannot make the data directory {data}: Not a directory" in result.stderr
    assert blocker.read_text() == "not a directory"


def test_acknowledged_writes_survive_kill_minus_nine(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    with server.client() as client:
        sid = client.post("/api/sessions", json={"title": "durable"}).json()["session"][
            "session_id"
        ]
        for i in range(20):
            client.patch("/api/session", json={"session_id": sid, "title": f"v{i}"})
    server.kill()
    server.start()
    with server.client() as client:
        body = client.get("/api/session", params={"session_id": sid}).json()["session"]
        assert body["title"] == "v19" and body["last_seq"] == 21
    server.stop()
