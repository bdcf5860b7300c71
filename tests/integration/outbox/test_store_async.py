"""G1 atomic store for the asyncio producer (``store_async``, ``store_many_async``) on an
``AsyncSession`` / ``AsyncConnection``, on PostgreSQL, MariaDB and SQLite; what the tables
hold is read back through the sync ``engine``. Bad input is refused as ``store()`` refuses it.

pytest runs these tests synchronously: each one drives its coroutine with ``asyncio.run``,
and the asyncio engine lives and is disposed inside that one event loop (its connections
belong to the loop that opened them)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from sqlalchemy import Engine, Integer, String, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import outbox
from outbox.aio import make_async_engine
from outbox.dialect import by_family
from outbox.errors import DuplicateEventError, ValidationError
from outbox.schema import outbox_sequences_table
from tests.integration.outbox.test_bad_input import BAD

ot = outbox.outbox_table
counters = outbox_sequences_table
T = TypeVar("T")


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "test_async_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    customer: Mapped[str] = mapped_column(String(50))


@pytest.fixture
def run(db_url: URL, engine: Engine) -> Callable[[Callable[[AsyncEngine], Awaitable[T]]], T]:
    """``run(body)``: ``await body(async_engine)`` in a fresh event loop, on the test's
    database (with the domain table created)."""
    Base.metadata.create_all(engine)

    def runner(body: Callable[[AsyncEngine], Awaitable[T]]) -> T:
        async def main() -> T:
            async_engine = make_async_engine(db_url)
            try:
                return await body(async_engine)
            finally:
                await async_engine.dispose()

        return asyncio.run(main())

    return runner


Run = Callable[[Callable[[AsyncEngine], Awaitable[Any]]], Any]


def stored(engine: Engine) -> dict[uuid.UUID, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(select(ot.c.event_id, ot.c.payload)).all())


def orders(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM test_async_orders")).scalar_one())


def test_commit_stores_the_row(run: Run, engine: Engine) -> None:
    async def body(aengine: AsyncEngine) -> uuid.UUID:
        async with AsyncSession(aengine) as session, session.begin():
            return await outbox.store_async(
                session, "orders", "order.placed", {"n": 1}, priority=2, serial_group="g"
            )

    event_id = run(body)
    with engine.connect() as conn:
        row = conn.execute(select(ot)).mappings().one()
    assert row["event_id"] == event_id
    assert (row["queue"], row["type"], row["payload"]) == ("orders", "order.placed", {"n": 1})
    assert (row["priority"], row["serial_group"], row["key"]) == (2, "g", "g")


def test_rollback_leaves_nothing(run: Run, engine: Engine) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            await outbox.store_async(session, "q", "t", {"x": 1})
            # visible inside the transaction, so the rollback below has something to undo
            count = await session.scalar(select(func.count()).select_from(ot))
            assert count == 1
            await session.rollback()
        with pytest.raises(RuntimeError):
            async with AsyncSession(aengine) as session, session.begin():
                await outbox.store_async(session, "q", "t", {"x": 2})
                raise RuntimeError("domain failure after store")

    run(body)
    assert stored(engine) == {}


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_domain_row_and_message_commit_or_roll_back_together(
    run: Run, engine: Engine, commit: bool
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            session.add(Order(customer="ACME"))
            await outbox.store_async(session, "orders", "order.placed", {"customer": "ACME"})
            # store_async must not flush the caller's pending objects
            assert len(session.new) == 1
            if commit:
                await session.commit()
            else:
                await session.flush()
                await session.rollback()

    run(body)
    assert orders(engine) == (1 if commit else 0)
    assert len(stored(engine)) == (1 if commit else 0)


def test_rolled_back_savepoint_drops_only_its_message(run: Run, engine: Engine) -> None:
    async def body(aengine: AsyncEngine) -> set[uuid.UUID]:
        async with AsyncSession(aengine) as session, session.begin():
            kept = await outbox.store_async(session, "q", "t", {"keep": True})
            savepoint = await session.begin_nested()
            await outbox.store_async(session, "q", "t", {"keep": False})
            await savepoint.rollback()
            with pytest.raises(RuntimeError):
                async with session.begin_nested():
                    await outbox.store_async(session, "q", "t", {"keep": False})
                    raise RuntimeError("undo the savepoint")
            async with session.begin_nested():
                inner = await outbox.store_async(session, "q", "t", {"inner": True})
        return {kept, inner}

    expected = run(body)
    assert set(stored(engine)) == expected


def test_duplicate_event_id_raises_and_keeps_transaction_usable(run: Run, engine: Engine) -> None:
    event_id = uuid.uuid4()

    async def body(aengine: AsyncEngine) -> tuple[uuid.UUID, uuid.UUID]:
        async with AsyncSession(aengine) as session, session.begin():
            await outbox.store_async(session, "q", "t", {"first": True}, event_id=event_id)
        async with AsyncSession(aengine) as session, session.begin():
            other = await outbox.store_async(session, "q", "t", {"before": True})
            with pytest.raises(DuplicateEventError) as err:
                await outbox.store_async(session, "q", "t", {"second": True}, event_id=event_id)
            assert err.value.event_ids == [event_id]
            assert "event_id" in str(err.value)
            # No PostgreSQL "current transaction is aborted": the next insert commits
            after = await outbox.store_async(session, "q", "t", {"after": True})
        return other, after

    other, after = run(body)
    assert stored(engine) == {
        event_id: {"first": True},
        other: {"before": True},
        after: {"after": True},
    }


def test_store_many_async_is_all_or_none_on_a_session(run: Run, engine: Engine) -> None:
    existing = uuid.uuid4()

    async def body(aengine: AsyncEngine) -> tuple[list[uuid.UUID], uuid.UUID]:
        async with AsyncSession(aengine) as session, session.begin():
            batch = [outbox.Message("q", "t", {"i": i}) for i in range(3)]
            ids = await outbox.store_many_async(session, batch)
            await outbox.store_async(session, "q", "t", {"original": True}, event_id=existing)
        async with AsyncSession(aengine) as session, session.begin():
            bad = [outbox.Message("q", "t", {"i": i}) for i in range(3)]
            bad.append(outbox.Message("q", "t", {"dup": True}, event_id=existing))
            with pytest.raises(DuplicateEventError) as err:
                await outbox.store_many_async(session, bad)
            assert err.value.event_ids == [existing]
            with pytest.raises(ValidationError) as invalid:
                await outbox.store_many_async(
                    session, [outbox.Message("q", "t", 1), {"queue": "q", "type": "t"}]
                )
            assert invalid.value.field == "messages[1]"
            survivor = await outbox.store_async(session, "q", "t", {"after": True})
        return ids, survivor

    ids, survivor = run(body)
    with engine.connect() as conn:
        rows = conn.execute(select(ot.c.event_id, ot.c.payload).order_by(ot.c.id)).all()
    assert [r.event_id for r in rows] == [*ids, existing, survivor]
    assert [r.payload for r in rows][:3] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_store_many_async_on_an_async_connection(run: Run, engine: Engine) -> None:
    async def body(aengine: AsyncEngine) -> list[uuid.UUID]:
        async with aengine.begin() as aconn:
            ids = await outbox.store_many_async(
                aconn, [{"queue": "q", "type": "t", "payload": i, "priority": 3} for i in range(5)]
            )
            await outbox.store_async(aconn, "q", "t", "single")
        async with aengine.connect() as aconn:
            await outbox.store_many_async(aconn, [outbox.Message("q", "t", "dropped")] * 2)
            await outbox.store_async(aconn, "q", "t", "dropped")
            await aconn.rollback()
        return ids

    ids = run(body)
    rows = stored(engine)
    assert len(rows) == 6 and set(ids) < set(rows)
    assert [rows[i] for i in ids] == [0, 1, 2, 3, 4]
    assert "dropped" not in rows.values()


def test_sequence_numbers_are_assigned_and_given_back(run: Run, engine: Engine) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            await outbox.store_async(session, "q", "t", 1, sequence_key="acct-1")
        async with AsyncSession(aengine) as session:
            await outbox.store_async(session, "q", "t", "rolled back", sequence_key="acct-1")
            await session.rollback()
        async with AsyncSession(aengine) as session, session.begin():
            await outbox.store_async(session, "q", "t", 2, sequence_key="acct-1")
            await outbox.store_many_async(
                session, [outbox.Message("q", "t", n, sequence_key="acct-1") for n in (3, 4)]
            )
            await outbox.store_async(session, "q", "t", 9, sequence_key="acct-2", sequence=9)

    run(body)
    with engine.connect() as conn:
        got = conn.execute(select(ot.c.sequence_key, ot.c.sequence, ot.c.payload)).all()
        last = dict(conn.execute(select(counters.c.sequence_key, counters.c["last"])).all())
    assert sorted((k, int(n), p) for k, n, p in got) == [
        ("acct-1", 1, 1),
        ("acct-1", 2, 2),
        ("acct-1", 3, 3),
        ("acct-1", 4, 4),
        ("acct-2", 9, 9),
    ]
    assert int(last["acct-1"]) == 4


@pytest.fixture
def listener(db_url: URL) -> Iterator[psycopg.Connection[Any]]:
    """A plain psycopg connection LISTENing on the default config's channel."""
    conninfo = db_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(by_family("postgresql").listen(outbox.DEFAULT_CONFIG.notify_channel))
        yield conn


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_notify_is_delivered_on_commit_only(
    run: Run, engine: Engine, listener: psycopg.Connection[Any]
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session:
            await outbox.store_async(session, "rolled.back", "t", {})
            await session.rollback()
        async with AsyncSession(aengine) as session, session.begin():
            await outbox.store_async(session, "committed", "t", {})
        async with aengine.begin() as aconn:
            # Two queues: PostgreSQL folds equal notifications of one transaction into one.
            await outbox.store_many_async(
                aconn, [outbox.Message(queue, "t", {}) for queue in ("batch.a", "batch.b")]
            )

    run(body)
    # Notifications arrive in commit order: had the rolled-back one been sent, it would be
    # the first one here.
    got = [n.payload for n in listener.notifies(timeout=10, stop_after=3)]
    assert got == ["committed", "batch.a", "batch.b"]
    assert {n.channel for n in listener.notifies(timeout=0)} == set()


def _bad_call(session: AsyncSession, **overrides: Any) -> Awaitable[uuid.UUID]:
    args: dict[str, Any] = {"queue": "q", "type": "t", "payload": {"ok": True}}
    args.update(overrides)
    return outbox.store_async(
        session, args.pop("queue"), args.pop("type"), args.pop("payload"), **args
    )


@pytest.mark.parametrize(("case", "overrides", "error", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_as_store_refuses_it(
    run: Run,
    engine: Engine,
    case: str,
    overrides: dict[str, Any],
    error: type[Exception],
    field: str,
) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            with pytest.raises(error) as raised:
                await _bad_call(session, **overrides)
            assert isinstance(raised.value, ValidationError)
            assert raised.value.field == field
            assert str(raised.value).startswith(f"{field}: ")
            # The transaction is still usable and the next store works
            await _bad_call(session)

    run(body)
    assert len(stored(engine)) == 1
    with engine.connect() as conn:
        counters = select(func.count()).select_from(outbox_sequences_table)
        assert conn.execute(counters).scalar_one() == 0


def test_store_many_async_names_the_index_and_writes_nothing(run: Run, engine: Engine) -> None:
    async def body(aengine: AsyncEngine) -> None:
        async with AsyncSession(aengine) as session, session.begin():
            with pytest.raises(ValidationError) as raised:
                await outbox.store_many_async(
                    session,
                    [
                        outbox.Message("q", "t", 1, sequence_key="k"),
                        outbox.Message("q", "t", 2, priority=99),
                    ],
                )
            assert raised.value.field == "messages[1].priority"

    run(body)
    assert stored(engine) == {}
    with engine.connect() as conn:
        counters = select(func.count()).select_from(outbox_sequences_table)
        assert conn.execute(counters).scalar_one() == 0
