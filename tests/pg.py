"""A throwaway PostgreSQL database per test, on the server the suite is given.

TETHER_TEST_POSTGRES names the server (default: the local one on 127.0.0.1:5432, user
postgres, trust auth, as CI and the development machine run it). Each test creates a database
of a unique name and drops it afterwards. Without a reachable server the PostgreSQL tests are
skipped with a printed reason (pytest -rs shows it), never silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

SERVER = os.environ.get("TETHER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _admin():  # noqa: ANN202
    import psycopg

    return psycopg.connect(SERVER, autocommit=True, connect_timeout=3)


def unavailable(check_server: bool = True) -> str | None:
    """Why the PostgreSQL tests cannot run here (None: they can)."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        return f"PostgreSQL tests skipped: the postgres extra is not installed ({exc})"
    if not check_server:
        return None
    try:
        with _admin():
            return None
    except Exception as exc:
        return f"PostgreSQL tests skipped: no server at {SERVER} ({exc})".strip()


def url_of(name: str) -> str:
    """SERVER's URL with the database `name` (a postgresql:// URL, as --database-url takes)."""
    return urlunsplit(urlsplit(SERVER)._replace(path=f"/{name}"))


def create_database() -> tuple[str, str]:
    """A new empty database: (its name, its URL). Skips the test without a server."""
    reason = unavailable()
    if reason is not None:
        print(reason)
        pytest.skip(reason)
    name = f"tether_test_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name, url_of(name)


def drop_database(name: str) -> None:
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database() -> Iterator[str]:
    """The URL of a database that exists for the `with` block."""
    name, url = create_database()
    try:
        yield url
    finally:
        drop_database(name)


# -- a PostgreSQL server of the test's own, for faults the shared one must not suffer ---------


class PrivateServer:
    """A throwaway PostgreSQL cluster in a temporary directory, from the Debian binaries, run
    as the `postgres` user when the tests run as root (initdb refuses root). `restart()` stops
    it the way an operator's restart does (fast shutdown: connections are cut) and starts it
    again on the same port."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "cluster"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _prefix(self) -> list[str]:
        return [str(_RUNUSER), "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._prefix(), *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "log"
            raise RuntimeError(
                f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}\n"
                + (log.read_text(errors="replace")[-2000:] if log.exists() else "")
            )

    def start(self) -> None:
        self._run(
            str(_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-l",
            str(self.root / "log"),
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on",
            "start",
        )

    def stop(self) -> None:
        self._run(str(_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-m", "fast", "stop")

    def running(self) -> bool:
        done = subprocess.run(
            [*self._prefix(), str(_BIN / "pg_ctl"), "-D", str(self.data), "status"],
            capture_output=True,
            timeout=30,
        )
        return done.returncode == 0

    def restart(self) -> None:
        try:
            self.stop()
        except RuntimeError:  # pg_ctl can find the PID file gone mid-shutdown (it happened
            if self.running():  # once in 15 runs): what matters is that the server is down
                raise
        for attempt in range(5):  # the old postmaster's port may take a moment to free
            try:
                self.start()
                return
            except RuntimeError:
                if attempt == 4:
                    raise
                time.sleep(0.5)


_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
_BIN = _BIN_DIRS[-1] if _BIN_DIRS else Path("/nonexistent")


# util-linux's, in /usr/sbin: found there too when PATH lacks it (a minimal shell's)
_RUNUSER = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_server(tmp_path: Path) -> Iterator[PrivateServer]:
    """A PostgreSQL server of this test's own; skips (with the reason printed) without the
    binaries or a way to run them."""
    reason = unavailable(check_server=False)
    if reason is None and not (_BIN / "initdb").exists():
        reason = "PostgreSQL tests skipped: no PostgreSQL binaries to start a private server"
    if reason is None and os.geteuid() == 0 and _RUNUSER is None:
        reason = "PostgreSQL tests skipped: running as root without runuser"
    if reason is not None:
        print(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="tether-pg-", dir="/tmp"))  # short: the socket path
    server = PrivateServer(root)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server._run(str(_BIN / "initdb"), "-D", str(server.data), "-A", "trust", "-U", "postgres")
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(RuntimeError):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
