"""Names are compared byte for byte on every database.

MariaDB's default collation (utf8mb4_general_ci) compares case- and accent-insensitively: two
consumers "Billing" and "billing" shared one dedupe key, so the second never ran its effect
(a lost event for it), queues "Orders" and "orders" were mixed by the database source, and
groups "A" and "a" were one group. The name columns are binary (utf8mb4_bin) there.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import Engine

from outbox import states
from outbox.wire import Envelope
from tests.integration.inbox.helpers import make_kit, rows, store_jobs

pytestmark = pytest.mark.db


def test_consumers_differing_in_case_each_get_the_event(engine: Engine) -> None:
    upper = make_kit(engine, "Billing")
    lower = make_kit(engine, "billing")
    store_jobs(engine, [("a", 1)], group=None)
    upper.take_outbox()  # the database source delivers each row once: deliver by hand too
    event = rows(engine, "Billing")["a"]
    envelope = Envelope(
        event_id=event.event_id,
        type=event.type,
        queue=event.queue,
        priority=event.priority,
        outbox_id=event.seq,
        occurred_at=event.occurred_at,
        body=json.dumps(event.payload),
        serial_group=None,
        key=None,
        headers={},
    )
    lower.ingest([envelope])
    assert upper.drain() == ["a"] and lower.drain() == ["a"]
    assert rows(engine, "Billing")["a"].state == states.DONE
    found = rows(engine, "billing")["a"]
    assert found.state == states.DONE and found.duplicates == 0


def test_groups_and_queues_differing_in_case_are_apart(engine: Engine) -> None:
    kit = make_kit(engine, queues=("orders",))
    store_jobs(engine, [("x", 1)], group="A", queue="orders")
    store_jobs(engine, [("y", 1)], group="a", queue="orders")
    store_jobs(engine, [("z", 1)], group=None, queue="Orders")
    assert kit.take_outbox() == 2  # not the row of queue "Orders"
    first = kit.claimer.claim_next()
    second = kit.claimer.claim_next()  # group "a" is not held by group "A"
    assert first is not None and second is not None
    assert {first.serial_group, second.serial_group} == {"A", "a"}
