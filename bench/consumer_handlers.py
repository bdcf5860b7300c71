"""No-op consumers for ``bench/consumer.py``'s worker processes.

    outbox worker bench.consumer_handlers:consumer --dsn ... --stop-when-idle
    procrastinate --app bench.consumer_handlers.proc_app worker    # BENCH_PROCRASTINATE_DSN

``noop`` does nothing (parts b, d, f: the cost is the queue's own). ``effect`` inserts one
``bench_effect`` row through the session it is given, so the row commits with the message's
acknowledgement (part c). ``timed`` writes the wall time the handler ran into
``bench_latency`` in the handler's transaction (part e: commit -> handler-done latency).
The procrastinate app (tasks ``noop`` and ``effect``; the latter inserts on a connection of
its own, not atomic with procrastinate's own bookkeeping) is built on first access so that
importing this module never needs procrastinate (a bench-only install, not a dependency).
pgqueuer's entrypoints are in ``bench/consumer_pgq.py``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sqlalchemy import BigInteger, Column, Double, Integer, MetaData, String, Table, Uuid, insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage

latency_metadata = MetaData()
latency = Table(
    "bench_latency",
    latency_metadata,
    Column("event_id", Uuid(), primary_key=True),
    Column("done_at", Double, nullable=False),
)

effect_metadata = MetaData()
effect = Table(
    "bench_effect",
    effect_metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("ref", String(64), nullable=False),
)
# The same row in SQL, for the peers that insert on a psycopg connection of their own.
EFFECT_SQL = "INSERT INTO bench_effect (ref) VALUES (%s)"

# BENCH_QUEUE: parts e and f give each run a queue of its own (broker queues outlive a
# database).
consumer = Consumer("bench", queues=[os.environ.get("BENCH_QUEUE", "bench")])


@consumer.handler("noop")
def noop(session: Session, message: InboxMessage) -> None:
    """Nothing: parts b, d and f measure the claim / finish machinery."""


# The same no-op as an ``async def`` (part g), in a consumer of its own: one async handler
# puts every handler of its consumer on the worker's event loop.
async_consumer = Consumer("bench", queues=[os.environ.get("BENCH_QUEUE", "bench")])


@async_consumer.handler("noop")
async def async_noop(session: AsyncSession, message: InboxMessage) -> None:
    """Nothing, awaited: part g compares it with ``noop``."""


@consumer.handler("effect")
def effect_handler(session: Session, message: InboxMessage) -> None:
    """One row through the handler's session: it commits with the message's ``done``."""
    session.execute(insert(effect).values(ref=str(message.event_id)))


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

    connection: Any = None
    lock = threading.Lock()

    @app.task(name="effect", queue="bench")
    def effect_task(i: int) -> None:
        """The ``effect`` row on a connection of this process's own: committed before, and
        apart from, procrastinate marking the job done."""
        nonlocal connection
        import psycopg

        with lock:
            if connection is None:
                connection = psycopg.connect(conninfo, autocommit=True)
            connection.execute(EFFECT_SQL, (f"procrastinate-{i}",))

    return app


_app: Any = None


def __getattr__(name: str) -> Any:
    global _app
    if name != "proc_app":
        raise AttributeError(name)
    if _app is None:
        _app = _procrastinate_app()
    return _app
