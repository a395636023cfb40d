"""`url`: a throwaway PostgreSQL database for the PostgreSQL backend's tests (tests/pg.py makes
and drops it, or skips with the reason when there is no server). A file that needs more of
its database (migrated, filled) defines its own `url`, which takes precedence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg import database


@pytest.fixture
def url() -> Iterator[str]:
    with database() as made:
        yield made
