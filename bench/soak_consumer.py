"""The consumer ``bench/soak.py``'s worker processes run.

    outbox worker bench.soak_consumer:consumer --dsn ... --source amqp://...   # SOAK_QUEUE=...

``soak.event`` writes one row into ``soak_effects`` inside the handler's transaction (the row
that commits with "done", exactly once per event_id), with the wall-clock interval the handler
ran, so the soak can count double effects and overlapping runs of a serial group from what the
database recorded. The table has no unique key on event_id on purpose: a second effect must be
visible, not refused. A payload with ``"fail": true`` raises ``Poison`` after writing its
effect: a permanent error, so the message lands ``failed`` at once and the effect rolls back.

Settings (environment, set by soak.py): SOAK_QUEUE (the run's queue), SOAK_HANDLER_MS (time a
handler takes, default 5), SOAK_VISIBILITY_TIMEOUT (seconds before a killed worker's claim is
taken back, default 10: the run is minutes long, not hours).
"""

from __future__ import annotations

import os
import time

from sqlalchemy import BigInteger, Column, Double, Integer, MetaData, String, Table, Uuid, insert
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage

NAME = "soak"

effects_metadata = MetaData()
effects = Table(
    "soak_effects",
    effects_metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("event_id", Uuid(), nullable=False, index=True),
    Column("queue", String(255), nullable=False),
    Column("serial_group", String(255), nullable=True),
    Column("pid", Integer(), nullable=False),
    Column("started", Double(), nullable=False),  # time.time() when the handler began
    Column("ended", Double(), nullable=False),  # ... and when it returned (before the commit)
)


class Poison(Exception):
    """The payload asked to fail: a permanent error (no retry)."""


consumer = Consumer(
    NAME,
    queues=[os.environ.get("SOAK_QUEUE", "soak")],
    on_retry="block",
    on_dead="continue",
    permanent_errors=(Poison,),
    visibility_timeout=float(os.environ.get("SOAK_VISIBILITY_TIMEOUT", "10")),
)
HANDLER_SECONDS = float(os.environ.get("SOAK_HANDLER_MS", "5")) / 1000


@consumer.handler("soak.event")
def soak_event(session: Session, message: InboxMessage) -> None:
    started = time.time()
    time.sleep(HANDLER_SECONDS)  # the work: long enough for kills to land mid-handler
    session.execute(
        insert(effects).values(
            event_id=message.event_id,
            queue=message.queue,
            serial_group=message.serial_group,
            pid=os.getpid(),
            started=started,
            ended=time.time(),
        )
    )
    if isinstance(message.payload, dict) and message.payload.get("fail"):
        raise Poison(f"poison message {message.payload.get('i')}")
