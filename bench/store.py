"""Producer-side cost of the outbox (not a test): prints two tables of ratios from one run.

    .venv/bin/python bench/store.py [--rounds 7] [--txns 300]

(a) a domain transaction inserting one order row, without and with one ``store()``;
(b) 100 messages in one transaction: ``store_many()`` once vs ``store()`` 100 times;
(a') the transaction of (a) with a bare ``SELECT 1`` instead (what any second statement
    costs) and with ``store()`` under ``OutboxConfig(notify=False)`` (without the wake-up);
(c) the transaction of (a) in an ``AsyncSession``, without and with one ``store_async()``,
    beside (a)'s figures: what one call adds in each (``+store``, ``+store_async``) and
    their ratio, the price of running ``store()`` through the asyncio bridge.
Variants run interleaved, round by round, on the same database, and the tables show the
median of the rounds: the machine is shared and noisy, ratios hold where absolute times drift.
Goals: with/without <= 1.25 (sync and asyncio); store_many >= 5x fewer seconds per message.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal

from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    create_engine,
    text,
)
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

import outbox
from outbox import migrate
from outbox.aio import make_async_engine
from outbox.dsn import make_engine

TARGETS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}

orders_meta = MetaData()
orders = Table(
    "bench_orders",
    orders_meta,
    Column("id", Integer, primary_key=True),
    Column("customer", String(100), nullable=False),
    Column("total", Numeric(10, 2), nullable=False),
)
PAYLOAD = {"order_id": 17, "customer": "ACME", "lines": [{"sku": "X-1", "qty": 2}] * 5}


def bench_db(name: str, admin_url: str) -> tuple[Engine, str]:
    db = f"outbox_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            text(f'CREATE DATABASE "{db}"' if name == "postgresql" else f"CREATE DATABASE `{db}`")
        )
    admin.dispose()
    engine = make_engine(admin_url.rsplit("/", 1)[0] + "/" + db)
    migrate.upgrade(engine)
    orders_meta.create_all(engine)
    return engine, db


def drop_db(name: str, admin_url: str, engine: Engine, db: str) -> None:
    engine.dispose()
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            text(
                f'DROP DATABASE "{db}" WITH (FORCE)'
                if name == "postgresql"
                else f"DROP DATABASE `{db}`"
            )
        )
    admin.dispose()


def timed(fn: Callable[[], None], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


async def atimed(fn: Callable[[], Awaitable[None]], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        await fn()
    return (time.perf_counter() - start) / repeat


def run(
    name: str, engine: Engine, aengine: AsyncEngine, runner: asyncio.Runner, rounds: int, txns: int
) -> dict[str, float]:
    def without() -> None:
        with engine.begin() as conn:
            conn.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))

    def with_store() -> None:
        with engine.begin() as conn:
            conn.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))
            outbox.store(conn, "orders", "order.placed", PAYLOAD, serial_group="c-17")

    quiet = outbox.OutboxConfig(notify=False)

    def with_quiet_store() -> None:
        with engine.begin() as conn:
            conn.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))
            outbox.store(conn, "orders", "order.placed", PAYLOAD, serial_group="c-17", config=quiet)

    def with_round_trip() -> None:
        # What any second statement costs: the floor under "with store()".
        with engine.begin() as conn:
            conn.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))
            conn.execute(text("SELECT 1"))

    batch = [outbox.Message("orders", "order.placed", PAYLOAD, serial_group="c-17")] * 100

    def many() -> None:
        with engine.begin() as conn:
            outbox.store_many(conn, [outbox.Message(m.queue, m.type, m.payload) for m in batch])

    def singles() -> None:
        with engine.begin() as conn:
            for m in batch:
                outbox.store(conn, m.queue, m.type, m.payload)

    async def async_without() -> None:
        async with AsyncSession(aengine) as session, session.begin():
            await session.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))

    async def async_with() -> None:
        async with AsyncSession(aengine) as session, session.begin():
            await session.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))
            await outbox.store_async(
                session, "orders", "order.placed", PAYLOAD, serial_group="c-17"
            )

    results: dict[str, list[float]] = {
        k: []
        for k in (
            "without",
            "with",
            "quiet",
            "round_trip",
            "async_without",
            "async_with",
            "many",
            "singles",
        )
    }
    # warm up pools and statement caches
    for fn in (without, with_store, with_quiet_store, with_round_trip, many, singles):
        fn()
    for afn in (async_without, async_with):
        runner.run(afn())
    for _ in range(rounds):
        results["without"].append(timed(without, txns))
        results["with"].append(timed(with_store, txns))
        results["quiet"].append(timed(with_quiet_store, txns))
        results["round_trip"].append(timed(with_round_trip, txns))
        results["async_without"].append(runner.run(atimed(async_without, txns)))
        results["async_with"].append(runner.run(atimed(async_with, txns)))
        results["many"].append(timed(many, max(1, txns // 30)) / 100)
        results["singles"].append(timed(singles, max(1, txns // 30)) / 100)
    return {k: statistics.median(v) for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--txns", type=int, default=300, help="transactions per round and variant")
    parser.add_argument("--db", choices=sorted(TARGETS), action="append")
    args = parser.parse_args()
    rows = []
    # One event loop for the whole run: an asyncio engine's connections belong to their loop.
    with asyncio.Runner() as runner:
        for name in args.db or sorted(TARGETS):
            engine, db = bench_db(name, TARGETS[name])
            aengine = make_async_engine(engine.url)
            try:
                rows.append((name, run(name, engine, aengine, runner, args.rounds, args.txns)))
            finally:
                runner.run(aengine.dispose())
                drop_db(name, TARGETS[name], engine, db)

    print(f"outbox-relay bench/store.py  rounds={args.rounds} txns/round={args.txns} (medians)")
    header = (
        f"{'database':<11}{'txn w/o':>10}{'txn with':>10}{'with/w/o':>10}{'goal':>7}"
        f"{'single/msg':>12}{'many/msg':>10}{'speed-up':>10}{'goal':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows:
        ratio = r["with"] / r["without"]
        speedup = r["singles"] / r["many"]
        print(
            f"{name:<11}{r['without'] * 1e3:>8.3f}ms{r['with'] * 1e3:>8.3f}ms{ratio:>10.2f}"
            f"{'<=1.25':>7}{r['singles'] * 1e6:>10.1f}us{r['many'] * 1e6:>8.1f}us"
            f"{speedup:>9.1f}x{'>=5x':>7}"
        )
    print()
    print("what the second statement costs (each / txn w/o): any statement, store() without")
    print("the wake-up (OutboxConfig(notify=False)), store()")
    header = f"{'database':<11}{'+SELECT 1':>11}{'+store quiet':>14}{'+store':>9}"
    print(header)
    print("-" * len(header))
    for name, r in rows:
        print(
            f"{name:<11}{r['round_trip'] / r['without']:>11.2f}{r['quiet'] / r['without']:>14.2f}"
            f"{r['with'] / r['without']:>9.2f}"
        )
    print()
    header = (
        f"{'database':<11}{'async w/o':>11}{'async with':>12}{'with/w/o':>10}{'goal':>7}"
        f"{'+store':>10}{'+store_async':>14}{'async/sync':>12}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows:
        ratio = r["async_with"] / r["async_without"]
        added = r["with"] - r["without"]
        added_async = r["async_with"] - r["async_without"]
        print(
            f"{name:<11}{r['async_without'] * 1e3:>9.3f}ms{r['async_with'] * 1e3:>10.3f}ms"
            f"{ratio:>10.2f}{'<=1.25':>7}{added * 1e6:>8.1f}us{added_async * 1e6:>12.1f}us"
            f"{added_async / added:>12.2f}"
        )


if __name__ == "__main__":
    main()
