"""``async def`` handlers on PostgreSQL, MariaDB and SQLite: run by the worker on an event
loop with an asyncio engine, in the same effect transaction as sync handlers (the effect
commits with ``done`` or not at all), beside sync handlers in one consumer."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.settings import ISOLATIONS
from inbox.sources.database import DatabaseSource
from inbox.worker import Worker, WorkerOptions
from outbox import Message, inbox_table, states, store_many
from outbox.backoff import Backoff
from outbox.errors import MissingExtraError
from tests.integration.inbox.helpers import make_kit, rows, store_jobs

pytestmark = pytest.mark.db

effects_metadata = MetaData()
effects = Table(
    "async_effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("mark", String(50), nullable=False),
    Column("kind", String(10), nullable=False),
)


def mixed_consumer(fail: dict[str, int] | None = None) -> Consumer:
    """``async_job`` by an async handler, ``sync_job`` by a sync one; each writes its effect
    through its session, then raises while ``fail[mark] >= attempt``."""
    fail = fail or {}
    consumer = Consumer("c1", queues=["jobs"], backoff=Backoff.fixed(0.05))

    @consumer.handler("async_job")
    async def async_job(session: AsyncSession, message: InboxMessage) -> None:
        assert isinstance(session, AsyncSession)
        mark = message.payload["mark"]
        await session.execute(insert(effects).values(mark=mark, kind="async"))
        await asyncio.sleep(0)  # a real suspension point on the worker's loop
        if fail.get(mark, 0) >= message.attempt:
            raise RuntimeError(f"{mark} fails on attempt {message.attempt}")

    @consumer.handler("sync_job")
    def sync_job(session: Session, message: InboxMessage) -> None:
        mark = message.payload["mark"]
        session.execute(insert(effects).values(mark=mark, kind="sync"))
        if fail.get(mark, 0) >= message.attempt:
            raise RuntimeError(f"{mark} fails on attempt {message.attempt}")

    return consumer


def store_both(engine: Engine, count: int, groups: int = 0) -> None:
    messages = [
        Message(
            queue="jobs",
            type=kind,
            payload={"mark": f"{kind[0]}{i}"},
            serial_group=f"g{i % groups}" if groups else None,
        )
        for i in range(count)
        for kind in ("async_job", "sync_job")
    ]
    with engine.begin() as conn:
        store_many(conn, messages)


def run_worker(engine: Engine, consumer: Consumer, **options: Any) -> Worker:
    settings: dict[str, Any] = {"poll_interval": 0.05, "stop_when_idle": True, "time_limit": 120}
    worker = Worker(
        consumer,
        engine,
        DatabaseSource(engine, consumer.queues),
        WorkerOptions(**(settings | options)),
    )
    assert worker.run(install_signals=False) == 0
    return worker


def effect_counts(engine: Engine) -> Counter[tuple[str, str]]:
    with engine.connect() as conn:
        found = conn.execute(
            select(effects.c.mark, effects.c.kind, func.count()).group_by(
                effects.c.mark, effects.c.kind
            )
        )
        return Counter({(mark, kind): n for mark, kind, n in found})


def inbox_states(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(conn.execute(select(inbox_table.c.state)).scalars())


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("batch_size", [1, 10])
def test_async_and_sync_handlers_of_one_consumer_each_run_once(
    engine: Engine, isolation: str, batch_size: int
) -> None:
    effects_metadata.create_all(engine)
    store_both(engine, 15, groups=4)
    worker = run_worker(
        engine, mixed_consumer(), concurrency=2, batch_size=batch_size, isolation=isolation
    )
    expected = Counter({(f"a{i}", "async"): 1 for i in range(15)})
    expected.update({(f"s{i}", "sync"): 1 for i in range(15)})
    assert effect_counts(engine) == expected
    assert inbox_states(engine) == Counter({states.DONE: 30})
    assert worker.processed == {states.DONE: 30}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_raising_async_handler_rolls_its_effect_back_and_runs_again(
    engine: Engine, isolation: str
) -> None:
    effects_metadata.create_all(engine)
    store_both(engine, 6)
    consumer = mixed_consumer(fail={"a2": 1, "s3": 1, "a4": 2})
    run_worker(engine, consumer, batch_size=10, isolation=isolation)
    # One committed effect per message: the failed runs' inserts were rolled back with them.
    counts = effect_counts(engine)
    assert set(counts.values()) == {1} and len(counts) == 12
    found = rows(engine)
    assert {m: found[m].attempts for m in ("a2", "s3", "a4", "a1")} == {
        "a2": 2,
        "s3": 2,
        "a4": 3,
        "a1": 1,
    }
    assert inbox_states(engine) == Counter({states.DONE: 12})


def test_the_one_message_runner_awaits_async_handlers_inside_its_loop(engine: Engine) -> None:
    kit = make_kit(engine)
    seen: list[tuple[str, int]] = []

    @kit.consumer.handler("ajob")
    async def ajob(session: AsyncSession, message: InboxMessage) -> None:
        result = await session.execute(select(func.count()).select_from(inbox_table))
        seen.append((message.payload["mark"], int(result.scalar_one())))

    store_jobs(engine, [("x", 1), ("y", 1)], group=None, type="ajob")
    kit.take_outbox()
    kit.runner.calls.run(kit.drain)
    assert seen == [("x", 2), ("y", 2)]
    assert {m: r.state for m, r in rows(engine).items()} == {"x": states.DONE, "y": states.DONE}


def test_an_async_handler_outside_the_loop_fails_its_message_with_the_reason(
    engine: Engine,
) -> None:
    kit = make_kit(engine, max_attempts=1)

    @kit.consumer.handler("ajob")
    async def ajob(session: AsyncSession, message: InboxMessage) -> None:
        raise AssertionError("never awaited")

    store_jobs(engine, [("x", 1)], group=None, type="ajob")
    kit.take_outbox()
    kit.drain()  # not inside kit.runner.calls.run: nothing awaits on this thread
    row = rows(engine)["x"]
    assert row.state == states.FAILED
    assert "must run inside HandlerCalls.run()" in row.last_error


def test_a_sync_handler_that_returns_a_coroutine_fails_with_a_clear_error(engine: Engine) -> None:
    kit = make_kit(engine, max_attempts=1)

    async def body() -> None:
        raise AssertionError("never awaited")

    @kit.consumer.handler("wrapped")
    def wrapped(session: Session, message: InboxMessage) -> Any:
        return body()

    store_jobs(engine, [("x", 1)], group=None, type="wrapped")
    kit.take_outbox()
    kit.drain()
    row = rows(engine)["x"]
    assert row.state == states.FAILED
    assert "returned an awaitable: declare it async def" in row.last_error


def test_a_missing_async_driver_stops_the_worker_at_start_naming_the_extra(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = {"postgresql": "psycopg", "mysql": "aiomysql", "sqlite": "aiosqlite"}[
        engine.dialect.name
    ]
    if module == "psycopg":
        module = "greenlet"  # psycopg is the sync driver too: take the bridge away instead
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'outbox-relay\[asyncio\]'"):
        Worker(mixed_consumer(), engine, DatabaseSource(engine, ["jobs"]), WorkerOptions())
