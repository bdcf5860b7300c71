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

from inbox.engine.claims import Claim
from outbox import states
from outbox.wire import Envelope
from tests.integration.inbox.helpers import PAIRED, Mode, make_kit, own_group, rows, store_jobs

pytestmark = [pytest.mark.db, pytest.mark.parametrize("mode", PAIRED, indirect=True, ids=str)]


def test_consumers_differing_in_case_each_get_the_event(engine: Engine, mode: Mode) -> None:
    upper = make_kit(engine, "Billing", mode=mode)
    lower = make_kit(engine, "billing", mode=mode)
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


def test_groups_and_queues_differing_in_case_are_apart(engine: Engine, mode: Mode) -> None:
    kit = make_kit(engine, mode=mode, queues=("orders",))
    name = own_group()  # the same name but for its case: name-A, name-a
    upper, lower = f"{name}-A", f"{name}-a"
    store_jobs(engine, [("x", 1)], group=upper, queue="orders")
    store_jobs(engine, [("y", 1)], group=lower, queue="orders")
    store_jobs(engine, [("z", 1)], group=None, queue="Orders")
    assert kit.take_outbox() == 2  # not the row of queue "Orders"
    # Claimed and held, pass after pass (N=1: one a pass): group "a" is not held by group "A"
    held: list[Claim] = []
    while len(held) < 2 and (claims := kit.claim()):
        held += claims
    assert sorted(str(c.serial_group) for c in held) == [upper, lower]
