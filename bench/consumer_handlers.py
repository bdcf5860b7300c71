"""No-op consumers for ``bench/consumer.py``'s worker processes.

    outbox worker bench.consumer_handlers:consumer --dsn ... --stop-when-idle
    procrastinate --app bench.consumer_handlers.proc_app worker    # BENCH_PROCRASTINATE_DSN

``noop`` does nothing (part b: the cost is the queue's own). ``timed`` writes the wall time
the handler ran into ``bench_latency`` in the handler's transaction (part c: commit ->
handler-done latency). The procrastinate app is built on first access so that importing this
module never needs procrastinate (it is a bench-only install, not a dependency).
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import Column, Double, MetaData, Table, Uuid, insert
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage

latency_metadata = MetaData()
latency = Table(
    "bench_latency",
    latency_metadata,
    Column("event_id", Uuid(), primary_key=True),
    Column("done_at", Double, nullable=False),
)

# BENCH_QUEUE: part c gives each run a queue of its own (RabbitMQ queues outlive a database).
consumer = Consumer("bench", queues=[os.environ.get("BENCH_QUEUE", "bench")])


@consumer.handler("noop")
def noop(session: Session, message: InboxMessage) -> None:
    """Nothing: part b measures the claim / finish machinery."""


@consumer.handler("timed")
def timed(session: Session, message: InboxMessage) -> None:
    session.execute(insert(latency).values(event_id=message.event_id, done_at=time.time()))


def _procrastinate_app() -> Any:
    import procrastinate  # type: ignore[import-not-found, unused-ignore]

    conninfo = os.environ["BENCH_PROCRASTINATE_DSN"]
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop", queue="bench")
    def noop_task(i: int) -> None:
        """Nothing, like ``noop`` above."""

    return app


_app: Any = None


def __getattr__(name: str) -> Any:
    global _app
    if name != "proc_app":
        raise AttributeError(name)
    if _app is None:
        _app = _procrastinate_app()
    return _app
