from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from helpers import ServerProcess, running_server


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "data", env={"TETHER_DEMO_DELAY": "0.002"}) as srv:
        yield srv


@pytest.fixture
def openai_server(tmp_path: Path, fake: FakeOpenAI) -> Iterator[ServerProcess]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("The launch is on Tuesday.\n")
    with running_server(
        tmp_path / "data",
        "--runtime",
        "openai",
        "--base-url",
        fake.base_url,
        "--model",
        "fake-model",
        "--workspace",
        str(workspace),
        "--cancel-reclaim-seconds",
        "2",
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def shared_demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One demo server for a module whose tests do not interfere with each other."""
    data = tmp_path_factory.mktemp("demo") / "data"
    with running_server(data, env={"TETHER_DEMO_DELAY": "0.002"}) as srv:
        yield srv
