from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from faultkit import BACKENDS, Backend


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """The model: a real OpenAI-compatible HTTP server on loopback, scripted per test."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """The folder the agent's read-only tools may read."""
    folder = tmp_path / "workspace"
    folder.mkdir()
    (folder / "notes.txt").write_text("The launch is on Tuesday.\n")
    return folder


@pytest.fixture(scope="module", params=BACKENDS, ids=[b.name for b in BACKENDS])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The log a fault test's servers run on: each test that asks for it runs once per
    backend (the SQLite-file faults do not ask)."""
    return request.param


@pytest.fixture
def store_flags(backend: Backend) -> Iterator[list[str]]:
    """`tether serve` flags for this test's own log (on PostgreSQL a throwaway database)."""
    with backend.flags() as flags:
        yield flags
