"""G1 atomic store, on PostgreSQL, MariaDB and SQLite (each test runs on all three)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import Enum

import pytest
from sqlalchemy import Engine, Integer, String, func, inspect, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import outbox
from outbox import migrate, states
from outbox.dsn import make_engine
from outbox.errors import DuplicateEventError
from tests.support.databases import DatabaseFactory

ot = outbox.outbox_table


class Colour(Enum):
    RED = "red"


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ot)).scalar_one())


def test_commit_stores_exactly_one_row_with_every_field(engine: Engine) -> None:
    # Given a payload using every supported type and all options
    event_id = uuid.uuid4()
    when = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    before = datetime.now(UTC)
    payload = {
        "n": 1,
        "s": "žluťoučký",
        "u": event_id,
        "t": when,
        "d": Decimal("12.30"),
        "e": Colour.RED,
        "list": [1, 2.5, None, True],
    }

    # When it is stored and the transaction commits
    with engine.begin() as conn:
        returned = outbox.store(
            conn,
            "orders.v1",
            "order.placed",
            payload,
            priority=2,
            serial_group="order-17",
            headers={"trace": "abc"},
            event_id=event_id,
            delay=timedelta(seconds=30),
        )
    after = datetime.now(UTC)

    # Then exactly one row exists and every field is right
    assert returned == event_id
    with engine.connect() as conn:
        rows = conn.execute(select(ot)).mappings().all()
    assert len(rows) == 1
    row = rows[0]
    assert row["event_id"] == event_id
    assert row["queue"] == "orders.v1"
    assert row["type"] == "order.placed"
    assert row["priority"] == 2
    assert row["serial_group"] == "order-17"
    assert row["key"] == "order-17"  # defaults to the serial group
    assert row["payload"] == {
        "n": 1,
        "s": "žluťoučký",
        "u": str(event_id),
        "t": "2026-01-02T03:04:05.123456+00:00",
        "d": "12.30",
        "e": "red",
        "list": [1, 2.5, None, True],
    }
    assert row["headers"] == {"trace": "abc"}
    assert row["status"] == states.PENDING
    assert row["attempts"] == 0
    assert row["last_error"] is None and row["sent_at"] is None
    assert row["occurred_at"].tzinfo is not None
    assert before - timedelta(seconds=1) <= row["occurred_at"] <= after + timedelta(seconds=1)
    assert row["available_at"] - row["occurred_at"] == timedelta(seconds=30)


def test_defaults_generate_event_id_and_ungrouped_row(engine: Engine) -> None:
    with engine.begin() as conn:
        first = outbox.store(conn, "q", "t", {})
        second = outbox.store(conn, "q", "t", [])
    assert isinstance(first, uuid.UUID) and first != second
    with engine.connect() as conn:
        rows = conn.execute(select(ot).order_by(ot.c.id)).mappings().all()
    assert [r["event_id"] for r in rows] == [first, second]
    assert rows[0]["id"] < rows[1]["id"]
    assert rows[0]["priority"] == 1 and rows[0]["serial_group"] is None and rows[0]["key"] is None
    assert rows[0]["available_at"] == rows[0]["occurred_at"]


def test_explicit_key_overrides_serial_group(engine: Engine) -> None:
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", {}, serial_group="g", key="k")
    with engine.connect() as conn:
        assert conn.execute(select(ot.c.key)).scalar_one() == "k"


def test_rollback_leaves_nothing(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.begin()
        outbox.store(conn, "q", "t", {"x": 1})
        assert conn.execute(select(func.count()).select_from(ot)).scalar_one() == 1
        conn.rollback()
    assert count(engine) == 0


def test_exception_in_transaction_block_leaves_nothing(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.begin() as conn:
        outbox.store(conn, "q", "t", {"x": 1})
        raise RuntimeError("domain failure after store")
    assert count(engine) == 0


def test_rolled_back_savepoint_drops_only_its_message(engine: Engine) -> None:
    with engine.begin() as conn:
        kept = outbox.store(conn, "q", "t", {"keep": True})
        savepoint = conn.begin_nested()
        outbox.store(conn, "q", "t", {"keep": False})
        savepoint.rollback()
        inner_kept = None
        with conn.begin_nested():
            inner_kept = outbox.store(conn, "q", "t", {"inner": True})
    with engine.connect() as conn:
        stored = set(conn.execute(select(ot.c.event_id)).scalars())
    assert stored == {kept, inner_kept}


def test_store_never_commits_on_its_own(engine: Engine) -> None:
    # A second connection must not see the row until the caller commits.
    with engine.connect() as writer:
        writer.begin()
        outbox.store(writer, "q", "t", {})
        if engine.dialect.name != "sqlite":  # SQLite: the writer holds the database lock
            assert count(engine) == 0
        writer.commit()
    assert count(engine) == 1


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "test_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    customer: Mapped[str] = mapped_column(String(50))


@pytest.fixture
def orm_engine(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def test_orm_session_commit_stores_domain_row_and_message(orm_engine: Engine) -> None:
    with Session(orm_engine) as session:
        session.add(Order(customer="ACME"))  # pending, not flushed
        outbox.store(session, "orders", "order.placed", {"customer": "ACME"})
        # store() must not flush the caller's pending objects
        assert len(session.new) == 1
        session.commit()
    with orm_engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM test_orders")).scalar_one() == 1
    assert count(orm_engine) == 1


def test_orm_session_rollback_drops_both(orm_engine: Engine) -> None:
    with Session(orm_engine) as session:
        session.add(Order(customer="ACME"))
        session.flush()
        outbox.store(session, "orders", "order.placed", {"customer": "ACME"})
        session.rollback()
    with orm_engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM test_orders")).scalar_one() == 0
    assert count(orm_engine) == 0


def test_orm_session_failed_flush_at_commit_drops_the_message(orm_engine: Engine) -> None:
    # Given an order row already there
    with Session(orm_engine) as session:
        session.add(Order(id=1, customer="first"))
        session.commit()
    # When a later transaction stores a message and its flush fails at commit
    with Session(orm_engine) as session:
        session.add(Order(id=1, customer="duplicate primary key"))
        outbox.store(session, "orders", "order.placed", {})
        with pytest.raises(Exception, match=r"(?i)duplicate|unique"):
            session.commit()
        session.rollback()
    # Then the message never existed
    assert count(orm_engine) == 0


def test_duplicate_event_id_raises_and_keeps_transaction_usable(engine: Engine) -> None:
    event_id = uuid.uuid4()
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", {"first": True}, event_id=event_id)

    with engine.begin() as conn:
        other = outbox.store(conn, "q", "t", {"before": True})
        with pytest.raises(DuplicateEventError) as err:
            outbox.store(conn, "q", "t", {"second": True}, event_id=str(event_id))
        assert err.value.event_ids == [event_id]
        assert "event_id" in str(err.value)
        # The transaction is still usable (no PostgreSQL "current transaction is aborted")
        after = outbox.store(conn, "q", "t", {"after": True})
        conn.execute(text("SELECT 1"))

    with engine.connect() as conn:
        rows = dict(conn.execute(select(ot.c.event_id, ot.c.payload)).all())
    assert rows == {event_id: {"first": True}, other: {"before": True}, after: {"after": True}}


def test_store_many_inserts_all_in_order(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = outbox.store_many(
            conn,
            [
                outbox.Message("q", "t", {"i": i}, priority=1 + i % 3, serial_group="g")
                for i in range(100)
            ],
        )
    assert len(set(ids)) == 100
    with engine.connect() as conn:
        rows = conn.execute(select(ot.c.event_id, ot.c.payload).order_by(ot.c.id)).all()
    assert [r.event_id for r in rows] == ids
    assert [r.payload["i"] for r in rows] == list(range(100))


def test_store_many_accepts_mappings(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = outbox.store_many(conn, [{"queue": "q", "type": "t", "payload": 1, "priority": 3}])
    with engine.connect() as conn:
        assert conn.execute(select(ot.c.priority).where(ot.c.event_id == ids[0])).scalar_one() == 3


def test_store_many_with_one_existing_event_id_stores_none(engine: Engine) -> None:
    existing = uuid.uuid4()
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", {"original": True}, event_id=existing)

    with engine.begin() as conn:
        batch = [outbox.Message("q", "t", {"i": i}) for i in range(3)]
        batch.append(outbox.Message("q", "t", {"dup": True}, event_id=existing))
        with pytest.raises(DuplicateEventError) as err:
            outbox.store_many(conn, batch)
        assert err.value.event_ids == [existing]
        survivor = outbox.store(conn, "q", "t", {"after": True})

    with engine.connect() as conn:
        rows = dict(conn.execute(select(ot.c.event_id, ot.c.payload)).all())
    assert rows == {existing: {"original": True}, survivor: {"after": True}}


def test_store_many_refuses_repeated_event_id_inside_the_batch(engine: Engine) -> None:
    repeated = uuid.uuid4()
    with engine.begin() as conn, pytest.raises(DuplicateEventError):
        outbox.store_many(conn, [outbox.Message("q", "t", 1, event_id=repeated)] * 2)
    assert count(engine) == 0


def test_names_with_quotes_and_unicode_are_stored_verbatim(engine: Engine) -> None:
    group = "it's; DROP TABLE outbox; -- %s 日本 " + "x" * 200
    with engine.begin() as conn:
        outbox.store(conn, "q", "type'with\"quotes;%", {"k": "v'"}, serial_group=group)
    with engine.connect() as conn:
        row = conn.execute(select(ot.c.type, ot.c.serial_group)).one()
    assert row.type == "type'with\"quotes;%"
    assert row.serial_group == group


def test_custom_table_names(db_factory: DatabaseFactory) -> None:
    # Given a database migrated with other table names
    config = outbox.OutboxConfig(outbox_table="app_outbox", inbox_table="app_inbox")
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        try:
            migrate.upgrade(engine, config)
            # When a message is stored with that config
            with engine.begin() as conn:
                outbox.store(conn, "q", "t", {}, config=config)
            # Then it lands in app_outbox, and no table "outbox" exists
            tables = set(inspect(engine).get_table_names())
            assert {"app_outbox", "app_inbox"} <= tables
            assert "outbox" not in tables
            with engine.connect() as conn:
                table = outbox.schema_for(config).outbox
                assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 1
        finally:
            engine.dispose()


def test_connection_object_type_is_checked() -> None:
    with pytest.raises(TypeError, match="conn_or_session"):
        outbox.store("not a connection", "q", "t", {})  # type: ignore[arg-type]
