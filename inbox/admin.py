"""``inbox.unblock``: release a halted group from code. The CLI's ``outbox inbox unblock``
is ``inbox.ops.admin.unblock``, which also writes an audit record."""

from __future__ import annotations

from sqlalchemy import Engine

from inbox.consumer import Consumer
from inbox.engine.heads import HeadPass
from inbox.engine.marks import mark_groups
from inbox.sql import heads as queries
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.schema import schema_for


def unblock(
    engine: Engine, consumer: str, group: str, *, config: OutboxConfig = DEFAULT_CONFIG
) -> int:
    """Release a group halted by a dead message (on_dead="halt"): the halted row stays
    ``failed`` (the CLI can retry it) and the group's next message becomes ready.
    Returns how many halted rows were released (0: the group was not halted)."""
    schema = schema_for(config)
    with engine.begin() as conn:
        released = conn.execute(queries.unblock(schema.inbox, consumer, group)).rowcount
        if released:  # for the workers' head pass, should the promotion below not happen
            mark_groups(conn, schema.groups, consumer, [group])
    if released:
        # Only the name and config matter to the head-of-group pass; any queue will do.
        stub = Consumer(consumer, queues=["unblock"], config=config)
        HeadPass(stub, engine, job_queue=False).promote_group(group)
    return int(released)
