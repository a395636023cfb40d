"""Fixtures for the Hermes Agent runtime tests: the real hermes-agent, offline, against the
suite's fake OpenAI-compatible server.

hermes-agent pins its dependencies exactly, so it lives in its own virtualenv, built once and
reused across runs: `$TETHER_TEST_CACHE/hermes-venv` (default `~/.cache/tether-tests`).
`TETHER_TEST_HERMES_PYTHON` may point at an interpreter that already has it. When the venv
cannot be built the tests fail with the reason; they are never skipped silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hermes_venv import HermesVenvError, build_hermes_venv, write_home

from fake_openai import FakeOpenAI

CONTEXT_LENGTH = 131072  # Hermes refuses models below 64K


@pytest.fixture(scope="session")
def hermes_python() -> Path:
    try:
        return build_hermes_venv()
    except HermesVenvError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(context_length=CONTEXT_LENGTH) as server:
        yield server


@pytest.fixture
def hermes_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake: FakeOpenAI, hermes_python: Path
) -> Path:
    """Environment for a HermesRuntime in this process; returns the Hermes home."""
    home = write_home(tmp_path / "hermes-home", fake)
    monkeypatch.setenv("TETHER_HERMES_HOME", str(home))
    monkeypatch.setenv("TETHER_HERMES_PYTHON", str(hermes_python))
    monkeypatch.setenv("TETHER_HERMES_MAX_TOKENS", "256")
    monkeypatch.setenv("TETHER_HERMES_TOOLSETS", "terminal")
    monkeypatch.setenv("TETHER_HERMES_TOOL_DELAY", "0")
    monkeypatch.setenv("TETHER_TEST_HERMES_KEY", "test-key")
    return home


@pytest.fixture
def hermes_flags(fake: FakeOpenAI, hermes_env: Path, hermes_python: Path) -> list[str]:
    """`tether serve` flags for the Hermes runtime against the fake model, with `hermes_env`
    (which the server inherits) set."""
    return [
        "--runtime",
        "hermes",
        "--hermes-python",
        str(hermes_python),
        "--base-url",
        fake.base_url,
        "--model",
        fake.model,
        "--api-key-env",
        "TETHER_TEST_HERMES_KEY",
    ]
