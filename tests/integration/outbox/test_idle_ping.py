"""``make_engine`` pings a pooled connection only when it sat idle (outbox.dsn): a connection
killed while idle is replaced before use; one back from use a moment ago is not pinged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from outbox import dsn as dsn_mod


@pytest.fixture(params=["postgresql", "mariadb"])
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pooled(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setattr(dsn_mod, "IDLE_BEFORE_PING", 0.0)  # every checkout counts as idle
    eng = dsn_mod.make_engine(engine.url, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def _backend_id(conn: Any) -> int:
    query = (
        "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    )
    return int(conn.execute(text(query)).scalar_one())


def _kill(engine: Engine, backend: int) -> None:
    with engine.connect() as admin:
        if admin.dialect.name == "postgresql":
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        else:
            admin.execute(text(f"KILL {int(backend)}"))  # KILL takes no parameter
        admin.commit()


def test_a_connection_killed_while_idle_is_replaced_before_use(
    engine: Engine, pooled: Engine
) -> None:
    with pooled.connect() as conn:
        first = _backend_id(conn)
    _kill(engine, first)  # the pooled connection dies while idle
    with pooled.connect() as conn:  # pinged, found dead, replaced: no error
        second = _backend_id(conn)
    assert second != first


def test_a_connection_back_from_use_a_moment_ago_is_not_pinged(engine: Engine) -> None:
    eng = dsn_mod.make_engine(engine.url, pool_size=1, max_overflow=0)
    pings = 0
    original = eng.dialect.do_ping

    def counting(dbapi_conn: Any) -> bool:
        nonlocal pings
        pings += 1
        return original(dbapi_conn)

    eng.dialect.do_ping = counting  # type: ignore[method-assign]
    try:
        for _ in range(20):
            with eng.connect() as conn:
                conn.execute(text("SELECT 1"))
    finally:
        eng.dispose()
    assert pings <= 1  # the very first checkout of a new connection at most
