from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI


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
