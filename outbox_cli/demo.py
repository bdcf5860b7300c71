"""``outbox demo``: the whole pipeline on the embedded default (a SQLite file, no services).

Stores an order row and the seven jobs of scenario S1 in one transaction, shows what the
outbox holds, runs two worker processes that take the jobs straight from the database
(no broker), prints the order they ran in and ``outbox stats``. With ``--broker`` the jobs
go through an ``outbox relay`` process and RabbitMQ or Kafka instead (outbox_cli.demo_broker).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path

from sqlalchemy import Column, Engine, Integer, MetaData, Numeric, String, Table, func, select

from outbox import dsn as dsn_mod
from outbox import migrate, states
from outbox.schema import outbox_table
from outbox.store import Message, store_many
from outbox_cli import demo_broker, demo_consumer

_demo_metadata = MetaData()
orders = Table(
    "demo_orders",
    _demo_metadata,
    Column("id", Integer, primary_key=True),
    Column("customer", String(100), nullable=False),
    Column("total", Numeric(10, 2), nullable=False),
)

# Scenario S1: letter = insertion order, digit = priority (1 = most urgent).
S1_JOBS = [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]


class _Steps:
    """Numbers the demo's one-line explanations: 1., 2., ... in the order they happen."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self.count = 0

    def __call__(self, text: str) -> None:
        self.count += 1
        self.echo(f"{self.count}. {text}")


def run_demo(
    dsn: str,
    echo: Callable[[str], None] = print,
    fresh: bool = True,
    broker: str | None = None,
) -> None:
    """Store S1's jobs with an order row, run them, print the order and the stats.

    Without ``broker`` the workers take the jobs from the database; with an ``amqp://`` or
    ``kafka://`` URL an ``outbox relay`` process publishes them and the workers receive them
    from the broker, on a queue of this run's own (``transcribe-<random>``).
    """
    step = _Steps(echo)
    url = dsn_mod.normalize(dsn)
    if fresh and url.get_backend_name() == "sqlite" and url.database:
        # A demo starts from nothing, so its output is the same every time.
        for suffix in ("", "-wal", "-shm"):
            Path(url.database + suffix).unlink(missing_ok=True)
    engine = dsn_mod.make_engine(url)
    step(f"database: {engine.url.render_as_string(hide_password=True)}")
    migrate.upgrade(engine)
    _demo_metadata.create_all(engine)
    step("schema migrated; demo_orders is the application's own table")
    if broker:
        demo_broker.check(broker, step)

    run = uuid.uuid4().hex[:8]
    queue, consumer = (f"transcribe-{run}", f"demo-{run}") if broker else ("transcribe", "demo")
    order_id = _store_order(engine, queue)
    step(f"one transaction stored order #{order_id} and 7 jobs of group {queue}/rec-1")
    pending = _show_outbox(engine, queue, order_id, step)
    plain = engine.url.render_as_string(hide_password=False)
    engine.dispose()

    if broker:
        step(f"{pending} message(s) pending in queue {queue}; starting the relay and workers")
        engine = dsn_mod.make_engine(plain)
        demo_consumer.prepare(engine)
        before = len(demo_consumer.read_runs(engine))
        demo_broker.run_pipeline(plain, broker, queue, consumer, step)
        runs = demo_consumer.read_runs(engine)[before:]
        engine.dispose()
    else:
        step(f"{pending} message(s) pending; starting two worker processes (database source)")
        runs = demo_consumer.run_workers(plain)
    _report(runs, plain, step)


def _store_order(engine: Engine, queue: str) -> int:
    """The order row and its seven jobs, in one transaction: both or neither."""
    with engine.begin() as conn:
        order_id: int = conn.execute(
            orders.insert().values(customer="ACME", total=Decimal("120.50")).returning(orders.c.id)
        ).scalar_one()
        store_many(
            conn,
            [
                Message(
                    queue=queue,
                    type="transcribe.recording",
                    payload={"mark": mark, "order_id": order_id},
                    priority=priority,
                    serial_group="rec-1",
                )
                for mark, priority in S1_JOBS
            ],
        )
    return order_id


def _show_outbox(engine: Engine, queue: str, order_id: int, step: _Steps) -> int:
    """Print the order's outbox rows; returns how many rows of ``queue`` are pending."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                outbox_table.c.id,
                outbox_table.c.priority,
                outbox_table.c.payload,
                outbox_table.c.status,
            )
            .where(outbox_table.c.queue == queue)
            .where(outbox_table.c.payload["order_id"].as_integer() == order_id)
            .order_by(outbox_table.c.id)
        ).all()
        pending: int = conn.execute(
            select(func.count()).where(
                outbox_table.c.queue == queue, outbox_table.c.status == states.PENDING
            )
        ).scalar_one()
    step("the outbox now holds (id, job, priority, status):")
    for row in rows:
        step.echo(f"   {row.id:>5}  {row.payload['mark']}  p{row.priority}  {row.status}")
    return pending


def _report(runs: Sequence[demo_consumer.Run], dsn: str, step: _Steps) -> None:
    """The order the jobs ran in, by how many processes, and ``outbox stats``."""
    order = " ".join(f"{r.mark}{r.priority}" for r in runs)
    pids = sorted({r.pid for r in runs})
    step(f"processing order: {order}   (expected a1 b1 d1 e1 g1 c2 f2: priority, then id)")
    step(
        f"{len(runs)} jobs ran in {len(pids)} of 2 worker processes (the one that finishes a "
        f"job claims its group's next); two of the group at once: "
        f"{'YES (bug!)' if demo_consumer.overlapping(runs) else 'never'}"
    )
    step("outbox stats:")
    stats = subprocess.run(
        [sys.executable, "-m", "outbox_cli", "stats"],
        capture_output=True, text=True, check=False,
        env=demo_consumer.child_env(OUTBOX_DSN=dsn),
    )  # fmt: skip
    for line in dsn_mod.mask(stats.stdout + stats.stderr).rstrip().splitlines():
        step.echo(f"   {line}")
