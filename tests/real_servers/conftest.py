"""Real OpenAI-compatible servers nobody here wrote, on loopback: Hugging Face
`transformers serve` (CPU torch, its own virtualenv: `transformers_venv.py`) running tiny
models built here (`tiny_model.py`). Nothing is downloaded: HF_HUB_OFFLINE=1.

When the virtualenv cannot be built the tests fail with the reason; they never skip."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servekit import TransformersServe, offline_env  # noqa: E402
from transformers_venv import TransformersVenvError, build_transformers_venv  # noqa: E402


@pytest.fixture(scope="session")
def transformers_python() -> Path:
    try:
        return build_transformers_venv()
    except TransformersVenvError as exc:
        pytest.fail(f"transformers serve is not available: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_models(transformers_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`stops/` (answers "hello world"), `endless/` (says "more" until cut off) and `tools/`
    (calls list_files, then answers "hello world")."""
    out = tmp_path_factory.mktemp("tiny-models")
    subprocess.run(
        [str(transformers_python), str(Path(__file__).parent / "tiny_model.py"), str(out)],
        env=offline_env(out / "hf-home"),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def _serve(python: Path, model_dir: Path, log: Path) -> Iterator[TransformersServe]:
    server = TransformersServe(python, model_dir, log).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def serve_stops(
    transformers_python: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServe]:
    log = tmp_path_factory.mktemp("serve-stops") / "serve.log"
    yield from _serve(transformers_python, tiny_models / "stops", log)


@pytest.fixture(scope="module")
def serve_endless(
    transformers_python: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServe]:
    log = tmp_path_factory.mktemp("serve-endless") / "serve.log"
    yield from _serve(transformers_python, tiny_models / "endless", log)


@pytest.fixture(scope="module")
def serve_tools(
    transformers_python: Path, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServe]:
    log = tmp_path_factory.mktemp("serve-tools") / "serve.log"
    yield from _serve(transformers_python, tiny_models / "tools", log)


@pytest.fixture
def serve_to_kill(
    transformers_python: Path, tiny_models: Path, tmp_path: Path
) -> Iterator[TransformersServe]:
    yield from _serve(transformers_python, tiny_models / "endless", tmp_path / "serve.log")
