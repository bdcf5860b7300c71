"""PostgreSQL: store() sends its insert on the driver's cursor; what the caller sees stays
SQLAlchemy's (errors, events), and notify=False leaves the wake-up out."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

import outbox
from outbox.dialect import by_family

ot = outbox.outbox_table
pytestmark = pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)


@pytest.fixture
def listener(db_url: URL) -> Iterator[psycopg.Connection[Any]]:
    conninfo = db_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(by_family("postgresql").listen(outbox.DEFAULT_CONFIG.notify_channel))
        yield conn


def test_notify_false_stores_without_a_wake_up(
    engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    quiet = outbox.OutboxConfig(notify=False)
    with engine.begin() as conn:
        outbox.store(conn, "quiet.one", "t", {}, config=quiet)
        outbox.store_many(conn, [outbox.Message("quiet.many", "t", {})], config=quiet)
    with engine.begin() as conn:
        outbox.store(conn, "loud", "t", {})
    # Commit order: had a quiet transaction notified, its queue would come first.
    assert [n.payload for n in listener.notifies(timeout=10, stop_after=1)] == ["loud"]
    with engine.connect() as conn:
        assert sorted(conn.execute(select(ot.c.queue)).scalars()) == [
            "loud",
            "quiet.many",
            "quiet.one",
        ]


def test_driver_errors_are_sqlalchemy_errors_and_the_rollback_works(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.begin()
        conn.execute(text("SET LOCAL statement_timeout = 1"))
        conn.execute(text("SELECT pg_sleep(0)"))
        with pytest.raises(DBAPIError):
            conn.execute(text("SELECT pg_sleep(1)"))  # the transaction is now aborted
        with pytest.raises(DBAPIError, match="aborted"):
            outbox.store(conn, "q", "t", {})
        conn.rollback()
        with conn.begin():
            outbox.store(conn, "q", "t", {})
    with engine.connect() as conn:
        assert conn.execute(select(ot.c.queue)).scalars().all() == ["q"]


def test_cursor_event_listeners_still_see_the_insert(engine: Engine) -> None:
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(args[2])

    event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.begin() as conn:
            outbox.store(conn, "q", "t", {})
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert any("INSERT INTO outbox" in s for s in seen), seen


def test_store_many_keeps_every_field(engine: Engine) -> None:
    when = datetime.now(UTC)
    ids = [uuid.uuid4(), uuid.uuid4()]
    messages = [
        outbox.Message(
            "q.1", "t 'quoted' \"x\"", {"s": "žluť", "n": 2**62}, priority=3,
            serial_group="g \" 1", headers={"h": "v\\"}, event_id=ids[0],
            delay=timedelta(seconds=5), effect_key="e", sequence_key="k", schema_version="v2",
        ),
        outbox.Message("q.2", "t", [1, None], key="k2", event_id=ids[1], sequence_key="k"),
    ]  # fmt: skip
    with engine.begin() as conn:
        assert outbox.store_many(conn, messages) == ids
    with engine.connect() as conn:
        rows = conn.execute(select(ot).order_by(ot.c.id)).mappings().all()
    first, second = rows
    assert first["type"] == "t 'quoted' \"x\"" and first["serial_group"] == 'g " 1'
    assert first["payload"] == {"s": "žluť", "n": 2**62} and first["headers"] == {"h": "v\\"}
    assert first["priority"] == 3 and first["key"] == 'g " 1'
    assert first["available_at"] - first["occurred_at"] == timedelta(seconds=5)
    assert first["occurred_at"] >= when - timedelta(seconds=1)
    assert (first["effect_key"], first["schema_version"]) == ("e", "v2")
    assert [r["sequence"] for r in rows] == [1, 2]
    assert second["payload"] == [1, None] and second["key"] == "k2"
    assert second["serial_group"] is None and second["headers"] == {}
    assert {r["status"] for r in rows} == {"pending"} and {r["attempts"] for r in rows} == {0}


def test_hide_parameters_hides_the_message_in_a_driver_error(engine: Engine) -> None:
    hiding = create_engine(engine.url, hide_parameters=True)
    try:
        with hiding.connect() as conn:
            conn.begin()
            conn.execute(text("SET LOCAL statement_timeout = 1"))
            with pytest.raises(DBAPIError):
                conn.execute(text("SELECT pg_sleep(1)"))  # the transaction is now aborted
            with pytest.raises(DBAPIError) as raised:
                outbox.store(conn, "q", "t", {"card": "4111-secret"})
            assert "4111-secret" not in str(raised.value)
            assert "hidden due to hide_parameters" in str(raised.value)
    finally:
        hiding.dispose()


def test_sql_logging_still_shows_the_insert(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"), engine.begin() as conn:
        outbox.store(conn, "q", "t", {})
    assert any("INSERT INTO outbox" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["before_execute", "handle_error"])
def test_statement_and_error_listeners_still_run(engine: Engine, name: str) -> None:
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(name)

    event.listen(engine, name, record)
    try:
        with engine.connect() as conn:
            conn.begin()
            conn.execute(text("SET LOCAL statement_timeout = 1"))
            with pytest.raises(DBAPIError):
                conn.execute(text("SELECT pg_sleep(1)"))
            seen.clear()
            with pytest.raises(DBAPIError):
                outbox.store(conn, "q", "t", {})
    finally:
        event.remove(engine, name, record)
    assert seen == [name]
