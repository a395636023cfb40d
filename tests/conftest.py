from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import pg  # noqa: E402

from helpers import ServerProcess, running_server  # noqa: E402


def pytest_report_header() -> str:
    """Whether the PostgreSQL backend's tests will run, said before any test does (they are
    skipped without a server, never silently)."""
    return pg.unavailable() or f"postgresql: tests run against {pg.SERVER}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh real server with its own data directory."""
    with running_server(tmp_path / "data") as srv:
        yield srv


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server for a module whose tests do not interfere with each other."""
    with running_server(tmp_path_factory.mktemp("shared") / "data") as srv:
        yield srv
