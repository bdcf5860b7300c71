"""The operator page's route tests run on PostgreSQL and SQLite (the two ends of the dialect
seam: row locks and a single writer); MariaDB takes the same core calls in tests/integration/ops."""

from __future__ import annotations

import pytest

UI_DIALECTS = ("postgresql", "sqlite")


@pytest.fixture(params=UI_DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)
