"""What every part of a consumer's engine (claimers, runners, ingest, lease keeper) starts from."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine

from inbox.consumer import Consumer
from outbox.clock import utcnow
from outbox.dialect import dialect_of
from outbox.schema import schema_for


class ConsumerPart:
    """One consumer on one database: its tables, named by its config, and the database's
    dialect seam, resolved once when the part is built so that no message pays for them."""

    def __init__(
        self, consumer: Consumer, engine: Engine, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.consumer = consumer
        self.engine = engine
        self.clock = clock
        self.schema = schema = schema_for(consumer.config)
        self.inbox = schema.inbox
        self.outbox = schema.outbox
        self.groups = schema.groups
        self.dialect = dialect_of(engine)
