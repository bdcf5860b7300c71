"""Ingest: dedupe without aborting the transaction, unknown types and rejects kept failed."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest
from sqlalchemy import Engine, func, select, text

from outbox import inbox_table, states
from outbox.transport import Rejected
from outbox.wire import H_EVENT_ID, H_QUEUE, Envelope
from tests.integration.inbox.helpers import make_kit, rows

pytestmark = pytest.mark.db


def _envelope(mark: str, event_id: object = None, type: str = "job") -> Envelope:
    return Envelope(
        event_id=event_id or uuid4(),  # type: ignore[arg-type]
        type=type,
        queue="jobs",
        priority=1,
        outbox_id=7,
        occurred_at=datetime.now(UTC),
        body=f'{{"mark":"{mark}"}}',
        serial_group="g",
        key="k-1",
        headers={"trace": "t-1"},
    )


def test_duplicates_are_counted_and_the_transaction_stays_usable(engine: Engine) -> None:
    kit = make_kit(engine)
    message = _envelope("m")
    with engine.begin() as conn:
        first = kit.ingest.within(conn, [message, message])
        # The transaction is still usable after the duplicate (PostgreSQL would abort it
        # after a unique violation).
        assert conn.execute(text("SELECT 1")).scalar() == 1
        second = kit.ingest.within(conn, [message])
    assert (first.inserted, first.duplicates) == (1, 1)
    assert (second.inserted, second.duplicates) == (0, 1)
    row = rows(engine)["m"]
    assert row.duplicates == 2
    assert row.state == states.READY


def test_the_same_event_for_two_consumers_is_two_rows(engine: Engine) -> None:
    one, two = make_kit(engine, "one"), make_kit(engine, "two")
    message = _envelope("m")
    one.ingest([message])
    two.ingest([message])
    with engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(inbox_table)).scalar()
    assert count == 2


def test_handler_sees_the_message_fields(engine: Engine) -> None:
    kit = make_kit(engine)
    seen = []
    kit.during = seen.append
    message = _envelope("m")
    kit.ingest([message])
    kit.drain()
    (got,) = seen
    assert got.event_id == message.event_id
    assert (got.type, got.queue, got.priority, got.serial_group) == ("job", "jobs", 1, "g")
    assert got.payload == {"mark": "m"}
    assert got.headers == {"trace": "t-1"}
    assert (got.key, got.attempt) == ("k-1", 1)
    assert got.occurred_at == message.occurred_at.replace(microsecond=got.occurred_at.microsecond)


def test_unknown_type_fails_at_once_with_the_reason(engine: Engine) -> None:
    kit = make_kit(engine)
    kit.ingest([_envelope("u", type="nobody.handles.this")])
    row = rows(engine)["u"]
    assert row.state == states.FAILED
    assert "unknown message type 'nobody.handles.this'" in row.last_error
    assert kit.drain() == []


def test_rejected_messages_are_kept_failed_and_deduplicated(engine: Engine) -> None:
    kit = make_kit(engine)
    broken = Rejected(reason="body: not valid JSON", headers={H_QUEUE: "jobs"}, body=b"{nope")
    kit.ingest([broken])
    kit.ingest([broken])
    event_id = uuid4()
    kit.ingest([Rejected("outbox-type: header missing", {H_EVENT_ID: str(event_id)}, b"{}")])
    with engine.connect() as conn:
        found = conn.execute(select(inbox_table).order_by(inbox_table.c.id)).all()
    assert [r.state for r in found] == [states.FAILED, states.FAILED]
    assert found[0].duplicates == 1
    assert "not valid JSON" in found[0].last_error and "{nope" in found[0].last_error
    assert found[1].event_id == event_id
    assert found[0].serial_group is None
