"""Shared fixtures: a fresh migrated database per test on each dialect.

``db_url`` / ``engine`` are parametrised over PostgreSQL, MariaDB and SQLite, so every
database-facing test runs on all three. Select one with ``-k postgresql`` etc.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from outbox.dsn import make_engine
from tests.support.databases import DIALECTS, DatabaseFactory
from tests.support.kafka import KafkaBroker

# ci_skips: under CI=true a skip fails the run; pytester: the test of that hook.
pytest_plugins = ["tests.support.ci_skips", "pytester"]


# The longest tests first: under pytest-xdist (``make test``) the last test to start then
# is a short one, and the run does not end waiting on one worker's 80-second scenario.
_FIRST = ("tests/faults/", "tests/acceptance/", "tests/property/", "tests/integration/")


def _rank(item: pytest.Item) -> int:
    path = item.nodeid
    return next((i for i, prefix in enumerate(_FIRST) if path.startswith(prefix)), len(_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: file order is kept inside each directory


@pytest.fixture(scope="session")
def db_factories(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DatabaseFactory]]:
    workdir: Path = tmp_path_factory.mktemp("sqlite")
    factories = {d: DatabaseFactory(d, workdir) for d in DIALECTS}
    yield factories
    for factory in factories.values():
        factory.close()


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_factory(dialect: str, db_factories: dict[str, DatabaseFactory]) -> DatabaseFactory:
    return db_factories[dialect]


@pytest.fixture
def db_url(db_factory: DatabaseFactory) -> Iterator[URL]:
    """A migrated database of its own for this test."""
    with db_factory.database() as url:
        yield url


@pytest.fixture
def engine(db_url: URL) -> Iterator[Engine]:
    # Full pre-ping: the test's own polling must survive the connection kills it provokes
    # (the product's engines ping only idle connections and retry the rest themselves).
    eng = make_engine(db_url, pool_pre_ping=True)
    yield eng
    eng.dispose()


@pytest.fixture
def pg_engine(db_factories: dict[str, DatabaseFactory]) -> Iterator[Engine]:
    """A migrated PostgreSQL database of its own, for the tests of PostgreSQL-only statements."""
    with db_factories["postgresql"].database() as url:
        eng = make_engine(url)
        yield eng
        eng.dispose()


@pytest.fixture
def dsn(db_url: URL) -> str:
    """The test database as a string, for subprocesses and the CLI."""
    return db_url.render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A Kafka-protocol broker (tansu) for the whole session. Topics persist across tests,
    so tests use unique queue names."""
    broker = KafkaBroker(log_path=tmp_path_factory.mktemp("kafka") / "tansu.log")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def kafka_broker_private(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker of this test's own, for tests that stop, kill or restart it."""
    broker = KafkaBroker(log_path=tmp_path / "tansu.log")
    broker.start()
    yield broker
    broker.stop()
