"""Bad input, producer side: each bad input gets a clear error naming the field, nothing is
written, and the caller's transaction stays usable (on every database)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

import outbox
from outbox.errors import PayloadError, PayloadTooLargeError, ValidationError

ot = outbox.outbox_table

BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("nan payload", {"payload": {"x": float("nan")}}, PayloadError, "payload"),
    ("infinity payload", {"payload": [float("inf")]}, PayloadError, "payload"),
    ("object payload", {"payload": {"x": object()}}, PayloadError, "payload"),
    ("bytes payload", {"payload": b"raw"}, PayloadError, "payload"),
    ("naive datetime", {"payload": {"t": datetime(2026, 1, 1)}}, PayloadError, "payload"),
    ("too large", {"payload": "x" * (256 * 1024)}, PayloadTooLargeError, "payload"),
    ("empty queue", {"queue": ""}, ValidationError, "queue"),
    ("queue with space", {"queue": "my queue"}, ValidationError, "queue"),
    ("queue with quote", {"queue": "q'; DROP TABLE outbox;--"}, ValidationError, "queue"),
    ("queue not str", {"queue": 5}, ValidationError, "queue"),
    ("queue too long", {"queue": "q" * 256}, ValidationError, "queue"),
    ("empty type", {"type": " "}, ValidationError, "type"),
    ("priority zero", {"priority": 0}, ValidationError, "priority"),
    ("priority too big", {"priority": 10}, ValidationError, "priority"),
    ("priority bool", {"priority": True}, ValidationError, "priority"),
    ("priority str", {"priority": "1"}, ValidationError, "priority"),
    ("group too long", {"serial_group": "g" * 256}, ValidationError, "serial_group"),
    ("group empty", {"serial_group": ""}, ValidationError, "serial_group"),
    ("key too long", {"key": "k" * 256}, ValidationError, "key"),
    ("event_id not uuid", {"event_id": "order-17"}, ValidationError, "event_id"),
    ("event_id int", {"event_id": 17}, ValidationError, "event_id"),
    ("negative delay", {"delay": -1}, ValidationError, "delay"),
    ("headers not str", {"headers": {"a": 1}}, ValidationError, "headers"),
    ("reserved header", {"headers": {"outbox-event-id": "x"}}, ValidationError, "headers"),
]


def _call(conn: Any, **overrides: Any) -> None:
    args: dict[str, Any] = {"queue": "q", "type": "t", "payload": {"ok": True}}
    args.update(overrides)
    outbox.store(conn, args.pop("queue"), args.pop("type"), args.pop("payload"), **args)


@pytest.mark.parametrize(("case", "overrides", "error", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_with_the_field_named(
    engine: Engine, case: str, overrides: dict[str, Any], error: type[Exception], field: str
) -> None:
    with engine.begin() as conn:
        with pytest.raises(error) as raised:
            _call(conn, **overrides)
        assert isinstance(raised.value, ValidationError)
        assert raised.value.field == field
        assert str(raised.value).startswith(f"{field}: ")
        # The transaction is still usable and the next store works
        _call(conn)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ot)).scalar_one() == 1


def test_store_many_names_the_index_and_writes_nothing(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as raised:
            outbox.store_many(
                conn,
                [outbox.Message("q", "t", 1), outbox.Message("q", "t", 2, priority=99)],
            )
        assert raised.value.field == "messages[1].priority"
        with pytest.raises(ValidationError, match=r"messages\[0\]: unknown field\(s\): colour"):
            outbox.store_many(conn, [{"queue": "q", "type": "t", "payload": 1, "colour": 1}])
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ot)).scalar_one() == 0


def test_configured_limits_are_enforced(engine: Engine) -> None:
    config = outbox.OutboxConfig(max_priority=3, max_payload_bytes=10)
    with engine.begin() as conn:
        outbox.store(conn, "q", "t", "12345678", priority=3, config=config)  # 10 bytes: ok
        with pytest.raises(PayloadTooLargeError, match="11 bytes serialised; the limit is 10"):
            outbox.store(conn, "q", "t", "123456789", config=config)
        with pytest.raises(ValidationError, match="outside the configured range 1..3"):
            outbox.store(conn, "q", "t", 1, priority=4, config=config)


def test_uuid_event_id_accepted_as_string(engine: Engine) -> None:
    event_id = uuid.uuid4()
    with engine.begin() as conn:
        assert outbox.store(conn, "q", "t", 1, event_id=str(event_id).upper()) == event_id
