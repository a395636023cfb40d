"""Fixtures of the OpenAI runtime's tests (tests/runtimes/openai_kit.py has the helpers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from runtimes.openai_kit import make_runtime

from tether.runtimes.openai import OpenAIRuntime

from fake_openai import FakeOpenAI


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("hello tools")
    (tmp_path / "secret.txt").write_text("TOPSECRET")
    return root


@pytest.fixture
def runtime(fake: FakeOpenAI, tmp_path: Path, workspace: Path) -> OpenAIRuntime:
    return make_runtime(fake.base_url, tmp_path, workspace)
