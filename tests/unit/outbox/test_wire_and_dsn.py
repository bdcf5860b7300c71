from datetime import UTC, datetime
from uuid import uuid4

import pytest

from outbox.dsn import mask, normalize
from outbox.wire import Envelope, MalformedMessageError, from_wire, routing_name


def _envelope() -> Envelope:
    return Envelope(
        event_id=uuid4(),
        type="order.placed",
        queue="orders",
        priority=2,
        outbox_id=42,
        occurred_at=datetime(2026, 1, 1, 12, tzinfo=UTC),
        body='{"a":1}',
        serial_group="g-1",
        key="k-1",
        headers={"trace": "t"},
    )


def test_round_trip() -> None:
    env = _envelope()
    raw = {k: v.encode() for k, v in env.wire_headers().items()}  # brokers may hand bytes
    assert from_wire(raw, env.wire_body()) == env
    assert routing_name("orders", 2) == "orders_2"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda h: h.pop("outbox-event-id"), "outbox-event-id"),
        (lambda h: h.update({"outbox-event-id": "x"}), "outbox-event-id"),
        (lambda h: h.update({"outbox-schema-version": "2"}), "outbox-schema-version"),
        (lambda h: h.update({"outbox-priority": "high"}), "outbox-priority"),
        (lambda h: h.update({"outbox-occurred-at": "2026-01-01T00:00:00"}), "outbox-occurred-at"),
    ],
)
def test_malformed_headers_name_the_field(mutate: object, field: str) -> None:
    headers = _envelope().wire_headers()
    mutate(headers)  # type: ignore[operator]
    with pytest.raises(MalformedMessageError) as raised:
        from_wire(headers, b"{}")
    assert raised.value.field == field


def test_malformed_body() -> None:
    headers = _envelope().wire_headers()
    with pytest.raises(MalformedMessageError, match="^body: not valid JSON"):
        from_wire(headers, b"{not json")
    with pytest.raises(MalformedMessageError, match="^body"):
        from_wire(headers, b"\xff\xfe")
    with pytest.raises(MalformedMessageError, match="^headers: missing"):
        from_wire(None, b"{}")


def test_mask_and_normalize() -> None:
    text = "cannot connect to postgresql://app:s3cr%40t@db/x and amqp://guest:guest@mq:5672/"
    masked = mask(text)
    assert "s3cr" not in masked and "guest@" not in masked
    assert "postgresql://app:***@db/x" in masked and "amqp://guest:***@mq:5672/" in masked
    assert normalize("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize("mariadb://u@h/db").drivername == "mysql+pymysql"
    assert normalize("sqlite:///x.db").drivername == "sqlite"
