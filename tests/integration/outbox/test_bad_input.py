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
from outbox.schema import outbox_sequences_table

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
    ("reserved contract header", {"headers": {"Outbox-Sequence": "3"}}, ValidationError, "headers"),
    ("effect_key empty", {"effect_key": ""}, ValidationError, "effect_key"),
    ("effect_key not str", {"effect_key": 17}, ValidationError, "effect_key"),
    ("effect_key too long", {"effect_key": "e" * 256}, ValidationError, "effect_key"),
    ("effect_key padded", {"effect_key": "invoice-1 "}, ValidationError, "effect_key"),
    ("effect_key leading space", {"effect_key": " invoice-1"}, ValidationError, "effect_key"),
    ("sequence_key empty", {"sequence_key": ""}, ValidationError, "sequence_key"),
    ("sequence_key not str", {"sequence_key": b"k"}, ValidationError, "sequence_key"),
    ("sequence_key too long", {"sequence_key": "s" * 256}, ValidationError, "sequence_key"),
    ("sequence_key padded", {"sequence_key": "acct\t"}, ValidationError, "sequence_key"),
    ("sequence_key blank", {"sequence_key": " "}, ValidationError, "sequence_key"),
    ("schema_version empty", {"schema_version": ""}, ValidationError, "schema_version"),
    ("schema_version int", {"schema_version": 2}, ValidationError, "schema_version"),
    ("schema_version too long", {"schema_version": "v" * 256}, ValidationError, "schema_version"),
    ("schema_version padded", {"schema_version": "v2\n"}, ValidationError, "schema_version"),
    ("sequence without key", {"sequence": 1}, ValidationError, "sequence"),
    ("sequence zero", {"sequence_key": "k", "sequence": 0}, ValidationError, "sequence"),
    ("sequence negative", {"sequence_key": "k", "sequence": -5}, ValidationError, "sequence"),
    ("sequence over bigint", {"sequence_key": "k", "sequence": 2**63}, ValidationError, "sequence"),
    ("sequence bool", {"sequence_key": "k", "sequence": True}, ValidationError, "sequence"),
    ("sequence str", {"sequence_key": "k", "sequence": "3"}, ValidationError, "sequence"),
    ("sequence float", {"sequence_key": "k", "sequence": 3.0}, ValidationError, "sequence"),
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
        # ... and no sequence number was taken for the refused message
        counters = select(func.count()).select_from(outbox_sequences_table)
        assert conn.execute(counters).scalar_one() == 0


def test_contract_limits_are_accepted(engine: Engine) -> None:
    with engine.begin() as conn:
        _call(
            conn,
            effect_key="e" * 255,
            sequence_key="s" * 255,
            sequence=2**63 - 1,
            schema_version="v" * 255,
        )
        _call(conn, sequence_key="inner space ok", sequence=1, effect_key="a b")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ot)).scalar_one() == 2


def test_store_many_refuses_a_bad_contract_field_and_takes_no_number(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as raised:
            outbox.store_many(
                conn,
                [
                    outbox.Message("q", "t", 1, sequence_key="k"),
                    {"queue": "q", "type": "t", "payload": 2, "sequence": 4},
                ],
            )
        assert raised.value.field == "messages[1].sequence"
        with pytest.raises(ValidationError) as raised:
            outbox.store_many(conn, [outbox.Message("q", "t", 1, effect_key=" e")])
        assert raised.value.field == "messages[0].effect_key"
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ot)).scalar_one() == 0
        counters = select(func.count()).select_from(outbox_sequences_table)
        assert conn.execute(counters).scalar_one() == 0


def test_store_many_names_the_index_and_writes_nothing(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as raised:
            outbox.store_many(
                conn,
                [outbox.Message("q", "t", 1), outbox.Message("q", "t", 2, priority=99)],
            )
        assert raised.value.field == "messages[1].priority"
        with pytest.raises(ValidationError, match=r"^messages\[0\]: unknown field\(s\): colour"):
            outbox.store_many(conn, [{"queue": "q", "type": "t", "payload": 1, "colour": 1}])
        with pytest.raises(ValidationError) as raised:
            outbox.store_many(conn, [outbox.Message("q", "t", 1), "not a message"])  # type: ignore[list-item]
        assert raised.value.field == "messages[1]"
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
