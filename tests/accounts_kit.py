"""What the accounts tests share (docs/api.md §15): users made with the real `tether users`
command, sign-in over real HTTP, and streams read in a thread until the server ends them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from helpers import ServerProcess, iter_sse

PASSWORDS = {"alice": "alice-pass-1", "bob": "bob-pass-22", "carol": "carol-pass-333"}


def tether_users(
    data_dir: Path, *args: str, password: str | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "TETHER_TEST_NEW_PW": password or ""}
    extra = ["--password-env", "TETHER_TEST_NEW_PW"] if password is not None else []
    return subprocess.run(
        [sys.executable, "-m", "tether", "users", *args, *extra, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def add_user(data_dir: Path, name: str, *, admin: bool = False, database_url: str = "") -> None:
    args = ["add", name, *(["--admin"] if admin else [])]
    if database_url:  # the users live in the PostgreSQL log's database
        args += ["--database-url", database_url]
    done = tether_users(data_dir, *args, password=PASSWORDS[name])
    assert done.returncode == 0, done.stderr


class Signed(httpx.Client):
    """A client already used to sign in; `with` closes it at the end as usual."""

    def __enter__(self) -> Signed:
        return self


def sign_in(server: ServerProcess, name: str, password: str | None = None) -> Signed:
    client = Signed(base_url=server.base_url, timeout=10)
    response = client.post(
        "/api/auth/login", json={"username": name, "password": password or PASSWORDS[name.lower()]}
    )
    assert response.status_code == 200, response.text
    return client


def bearer(server: ServerProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.base_url, timeout=10, headers={"Authorization": f"Bearer {token}"}
    )


def new_token(client: httpx.Client, name: str = "script") -> dict:
    response = client.post("/api/tokens", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


class OpenStream:
    """An SSE stream read in a thread; `ended` is set when the server closes it."""

    def __init__(self, client: httpx.Client, path: str) -> None:
        self.frames: list[str] = []  # the event names
        self.raw: list[str] = []  # each whole frame, as text
        self.status: int | None = None
        self.opened = threading.Event()
        self.ended = threading.Event()
        self.ended_at = 0.0
        self._thread = threading.Thread(target=self._read, args=(client, path), daemon=True)
        self._thread.start()
        assert self.opened.wait(10), "the stream did not open"

    def _read(self, client: httpx.Client, path: str) -> None:
        try:
            with client.stream("GET", path, timeout=30) as response:
                self.status = response.status_code
                self.opened.set()
                for frame in iter_sse(response):
                    self.frames.append(frame.event)
                    self.raw.append(repr(dict(frame)))
        except httpx.HTTPError:
            pass
        finally:
            self.opened.set()
            self.ended_at = time.monotonic()
            self.ended.set()
