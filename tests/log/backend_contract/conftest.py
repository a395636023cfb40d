"""The `backend` fixture: every test in this directory runs once per backend in BACKENDS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_kit import BACKENDS, Backend, make_backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    made = make_backend(request.param, tmp_path)
    try:
        yield made
    finally:
        made.dispose()
