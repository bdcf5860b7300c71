"""``outbox demo``: the whole pipeline on the embedded default (a SQLite file, no services).

Stores an order row and the seven jobs of scenario S1 in one transaction, shows what the
outbox holds, runs two worker processes that take the jobs straight from the database
(no broker), prints the order they ran in and ``outbox stats``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

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


def run_demo(dsn: str, echo: Callable[[str], None] = print, fresh: bool = True) -> None:
    url = dsn_mod.normalize(dsn)
    if fresh and url.get_backend_name() == "sqlite" and url.database:
        # A demo starts from nothing, so its output is the same every time.
        for suffix in ("", "-wal", "-shm"):
            Path(url.database + suffix).unlink(missing_ok=True)
    engine = dsn_mod.make_engine(url)
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
    echo(f"5. {pending} message(s) pending; starting two worker processes (database source)")
    engine.dispose()

    from inbox.demo import run_workers  # the consumer side lives in inbox/

    runs = run_workers(engine.url.render_as_string(hide_password=False))
    order = " ".join(f"{r.mark}{r.priority}" for r in runs)
    overlap = any(
        a.started < b.finished and b.started < a.finished
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
    )
    pids = sorted({r.pid for r in runs})
    echo(f"6. processing order: {order}   (expected a1 b1 d1 e1 g1 c2 f2: priority, then id)")
    echo(
        f"7. {len(runs)} jobs ran in {len(pids)} of 2 worker processes (the one that finishes a "
        f"job claims its group's next); two of the group at once: "
        f"{'YES (bug!)' if overlap else 'never'}"
    )
    echo("8. outbox stats:")
    stats = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "stats", "--dsn", dsn],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in (stats.stdout + stats.stderr).rstrip().splitlines():
        echo(f"   {line}")
