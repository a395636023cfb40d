"""The data directory is private to its owner whatever the umask: the directory and the
attachment folders 0700, the database (with its -wal and -shm) and every stored file 0600;
an existing directory with looser modes is tightened, with a warning (docs/security.md)."""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import new_session, running_server, start_turn, wait_until

pytestmark = pytest.mark.slow


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """The servers started inside inherit this umask."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_private(data: Path) -> None:
    assert mode(data) == 0o700, oct(mode(data))
    for name in ("tether.db", "tether.db-wal", "tether.db-shm"):
        assert (data / name).exists(), name
        assert mode(data / name) == 0o600, (name, oct(mode(data / name)))
    attachments = data / "attachments"
    stored = [p for p in attachments.rglob("*")]
    assert any(p.is_file() for p in stored)
    for path in [attachments, *stored]:
        expected = 0o700 if path.is_dir() else 0o600
        assert mode(path) == expected, (path.relative_to(data), oct(mode(path)))


def store_an_attachment(client) -> None:  # noqa: ANN001 - an httpx.Client
    sid = new_session(client)
    data = base64.b64encode(b"private notes").decode()
    attachments = [{"name": "notes.txt", "mime": "text/plain", "data_base64": data}]
    start_turn(client, sid, "read this", attachments=attachments)
    wait_until(
        lambda: not client.get("/api/session/status", params={"session_id": sid}).json()["busy"]
    )


def test_a_new_data_directory_is_private_under_umask_022(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with umask(0o022), running_server(data) as server, server.client() as client:
        store_an_attachment(client)
        assert_private(data)


def test_an_open_data_directory_is_tightened_with_a_warning(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with umask(0o022):
        with running_server(data) as server, server.client() as client:
            store_an_attachment(client)
        for path in [data, *data.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        with running_server(data) as server, server.client() as client:
            assert mode(data) == 0o700 and mode(data / "tether.db") == 0o600
            store_an_attachment(client)
            assert mode(data / "tether.db-wal") == 0o600
            assert mode(data / "tether.db-shm") == 0o600
        assert "restricted it to its owner" in server.log()
