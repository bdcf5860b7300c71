"""``outbox demo``: the producer side on the embedded default (a SQLite file, no services).

Stores an order row and the seven jobs of scenario S1 in one transaction, then shows what
the outbox holds. Later stages run the relay and two workers on the same file.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from sqlalchemy import Column, Integer, MetaData, Numeric, String, Table, func, select

from outbox import dsn as dsn_mod
from outbox import migrate, states
from outbox.schema import outbox_table
from outbox.store import Message, store_many

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


def run_demo(dsn: str, echo: Callable[[str], None] = print) -> None:
    engine = dsn_mod.make_engine(dsn)
    echo(f"1. database: {engine.url.render_as_string(hide_password=True)}")
    migrate.upgrade(engine)
    _demo_metadata.create_all(engine)
    echo("2. schema migrated; demo_orders is the application's own table")

    with engine.begin() as conn:
        order_id = conn.execute(
            orders.insert().values(customer="ACME", total=Decimal("120.50")).returning(orders.c.id)
        ).scalar_one()
        store_many(
            conn,
            [
                Message(
                    queue="transcribe",
                    type="transcribe.recording",
                    payload={"mark": mark, "order_id": order_id},
                    priority=priority,
                    serial_group="rec-1",
                )
                for mark, priority in S1_JOBS
            ],
        )
    echo(f"3. one transaction stored order #{order_id} and 7 jobs of group transcribe/rec-1")

    with engine.connect() as conn:
        rows = conn.execute(
            select(
                outbox_table.c.id,
                outbox_table.c.priority,
                outbox_table.c.payload,
                outbox_table.c.status,
            )
            .where(outbox_table.c.payload["order_id"].as_integer() == order_id)
            .order_by(outbox_table.c.id)
        ).all()
        pending = conn.execute(
            select(func.count()).where(outbox_table.c.status == states.PENDING)
        ).scalar_one()
    echo("4. the outbox now holds (id, job, priority, status):")
    for row in rows:
        echo(f"   {row.id:>5}  {row.payload['mark']}  p{row.priority}  {row.status}")
    echo(f"5. {pending} message(s) pending in total; a relay or worker would take them next")
    engine.dispose()
