"""The property tests' engine: the shared fixture's database, without the pool's pre-ping.

A state machine run issues thousands of short statements from one thread; a ``SELECT 1``
before each checkout would double the round trips and buys nothing against a local server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from outbox.dsn import make_engine


@pytest.fixture
def engine(db_url: URL) -> Iterator[Engine]:
    eng = make_engine(db_url, pool_pre_ping=False)
    yield eng
    eng.dispose()
