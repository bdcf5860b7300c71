"""Acceptance fixtures: a test bed (main database + interval recorder) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.workers import Bed


@pytest.fixture
def bed(dsn: str, engine: Engine, tmp_path: Path) -> Iterator[Bed]:
    testbed = Bed.create(dsn, engine, tmp_path)
    yield testbed
    testbed.dispose()
