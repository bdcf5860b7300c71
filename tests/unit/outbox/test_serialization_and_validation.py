from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from outbox.config import OutboxConfig
from outbox.errors import ConfigError, PayloadError, ValidationError
from outbox.serialization import DEFAULT_SERIALIZER, decode, serialize
from outbox.validation import check_delay, check_event_id, check_queue


def test_serialize_supported_types() -> None:
    text = serialize(
        "payload",
        {
            "u": UUID(int=1),
            "d": Decimal("0.10"),
            "day": date(2026, 1, 2),
            "t": datetime(2026, 1, 2, tzinfo=UTC),
            "tuple": (1, 2),
        },
        DEFAULT_SERIALIZER,
    )
    assert decode(text) == {
        "u": "00000000-0000-0000-0000-000000000001",
        "d": "0.10",
        "day": "2026-01-02",
        "t": "2026-01-02T00:00:00+00:00",
        "tuple": [1, 2],
    }


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), Decimal("NaN"), {1j}, object()])
def test_serialize_refuses(bad: object) -> None:
    with pytest.raises(PayloadError) as raised:
        serialize("payload", {"x": bad}, DEFAULT_SERIALIZER)
    assert raised.value.field == "payload"


def test_decode_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        decode('{"x": NaN}')


@pytest.mark.parametrize("queue", ["orders", "a.b-c_d", "Q9"])
def test_good_queue_names(queue: str) -> None:
    assert check_queue(queue) == queue


@pytest.mark.parametrize("queue", ["", "a b", "a/b", "ü", "a;b", None])
def test_bad_queue_names(queue: object) -> None:
    with pytest.raises(ValidationError, match="^queue: "):
        check_queue(queue)


def test_event_id_and_delay() -> None:
    assert isinstance(check_event_id(None), UUID)
    with pytest.raises(ValidationError, match="event_id"):
        check_event_id("nope")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert check_delay(1.5, now) == now + timedelta(seconds=1.5)
    assert check_delay(None, now) == now
    with pytest.raises(ValidationError, match="delay"):
        check_delay("soon", now)


def test_config_validates_and_refuses_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        OutboxConfig.from_mapping({"max_priorty": 3})
    with pytest.raises(ConfigError, match="outbox_table"):
        OutboxConfig(outbox_table="outbox; DROP TABLE x")
    with pytest.raises(ConfigError, match="min_priority"):
        OutboxConfig(min_priority=5, max_priority=1)
    assert OutboxConfig.from_mapping({"max_priority": 3}).max_priority == 3


def test_config_notify_is_a_boolean() -> None:
    assert OutboxConfig().notify is True
    assert OutboxConfig.from_mapping({"notify": False}).notify is False
    with pytest.raises(ConfigError, match="notify"):
        OutboxConfig(notify="no")  # type: ignore[arg-type]
