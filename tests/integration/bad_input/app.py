"""The consumer the bad-input and security tests run in ``outbox worker`` OS processes:
``outbox worker tests.integration.bad_input.app:consumer``.

Configured through the environment (set by ``worker_env``): ``H4B_CONSUMER`` (name),
``H4B_QUEUES`` and ``H4B_TYPES`` (JSON lists). Every type in ``H4B_TYPES`` runs ``job``, which
insists on a payload ``{"mark": str, ...}`` (anything else is a permanent error: failed at
once) and records what it saw, verbatim, in ``h4b_effects`` through the handler's session (so
the record commits with ``done`` or not at all). ``{"fail": n}`` raises on attempts <= n.
"""

from __future__ import annotations

import json
import os

from sqlalchemy import Column, Integer, MetaData, Table, Text, Uuid, insert
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from outbox.backoff import Backoff

metadata = MetaData()
effects = Table(
    "h4b_effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", Uuid(), nullable=False),
    Column("mark", Text(), nullable=False),
    Column("type", Text(), nullable=False),
    Column("queue", Text(), nullable=False),
    Column("grp", Text(), nullable=True),
    Column("consumer", Text(), nullable=False),
)


class BadPayload(Exception):
    """The payload is not the shape this handler accepts: permanent, never retried."""


def job(session: Session, message: InboxMessage) -> None:
    payload = message.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("mark"), str):
        raise BadPayload(f"expected an object with a string 'mark', got {payload!r:.100}")
    if message.attempt <= int(payload.get("fail", 0)):
        raise RuntimeError(f"{payload['mark']} failed on attempt {message.attempt}")
    session.execute(
        insert(effects).values(
            event_id=message.event_id,
            mark=payload["mark"],
            type=message.type,
            queue=message.queue,
            grp=message.serial_group,
            consumer=consumer.name,
        )
    )


consumer = Consumer(
    os.environ.get("H4B_CONSUMER", "h4b-consumer"),
    queues=json.loads(os.environ.get("H4B_QUEUES", '["jobs"]')),
    on_retry="block",
    on_dead="continue",
    max_attempts=2,
    backoff=Backoff.fixed(0.1),  # no jitter: short, predictable retries
    permanent_errors=(BadPayload,),
    visibility_timeout=30.0,
    group_lock_timeout=2.0,
)
for _type in json.loads(os.environ.get("H4B_TYPES", '["job"]')):
    consumer.handler(_type)(job)
