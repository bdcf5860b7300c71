"""Settings validation, publisher selection by URL, and the SQLite one-relay lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.errors import ConfigError
from outbox.schema import outbox_table
from relay import queries
from relay.publishers import publisher_from_url
from relay.publishers.rabbitmq import RabbitMQPublisher
from relay.publishers.settings import PublisherSettings
from relay.relay import RelaySettings
from relay.sqlite_guard import RelayAlreadyRunning, SQLiteRelayLock


@pytest.mark.parametrize(
    "field,value",
    [
        ("batch_size", 0),
        ("poll_interval", 0),
        ("max_attempts", 0),
        ("time_limit", -1),
        ("max_messages", 0),
    ],
)
def test_bad_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        RelaySettings(**{field: value})  # type: ignore[arg-type]


def test_amqp_url_builds_rabbitmq_with_options() -> None:
    publisher = publisher_from_url("amqp://guest:pw@127.0.0.1:5672/%2F", fanout=True)
    assert isinstance(publisher, RabbitMQPublisher) and publisher.fanout


@pytest.mark.parametrize("url", ["", "redis://x", "kafka://"])
def test_bad_broker_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="broker"):
        publisher_from_url(url)


def test_bad_broker_url_error_masks_password() -> None:
    with pytest.raises(ConfigError) as info:
        publisher_from_url("redis://user:hunter2@host/0")
    assert "hunter2" not in str(info.value)


def test_sqlite_lock_admits_one_holder(tmp_path: Path) -> None:
    database = str(tmp_path / "app.db")
    first, second = SQLiteRelayLock(database), SQLiteRelayLock(database)
    first.acquire()
    with pytest.raises(RelayAlreadyRunning):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


def test_sqlite_memory_database_is_refused() -> None:
    with pytest.raises(ConfigError, match="memory"):
        SQLiteRelayLock(":memory:")


def test_queues_given_as_a_list_build_the_fetch() -> None:
    # The fetch statement is cached by its arguments, so a list (the annotation says tuple,
    # but any sequence used to work) must not reach it unhashable at the first batch.
    settings = RelaySettings(queues=["a", "b"])  # type: ignore[arg-type]
    assert settings.queues == ("a", "b")
    stmt = queries.fetch_due(outbox_table, limit=10, queues=settings.queues, lock=True)
    assert "outbox.queue IN" in str(stmt)


def test_queues_as_one_string_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="queues"):
        RelaySettings(queues="orders")  # type: ignore[arg-type]


@pytest.mark.parametrize("field,value", [("confirm_timeout", 0), ("kafka_partitions", 0)])
def test_bad_publisher_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        PublisherSettings(**{field: value})  # type: ignore[arg-type]


def test_publisher_settings_give_each_broker_its_own_options() -> None:
    settings = PublisherSettings(
        confirm_timeout=5.0, fanout=True, queue_arguments={"x-queue-type": "quorum"},
        kafka_partitions=6,
    )  # fmt: skip
    assert settings.options_for("amqp://h/") == {
        "confirm_timeout": 5.0, "fanout": True, "queue_arguments": {"x-queue-type": "quorum"},
    }  # fmt: skip
    assert settings.options_for("kafka://h:9092") == {"confirm_timeout": 5.0, "partitions": 6}
    with pytest.raises(ConfigError, match="broker"):
        settings.options_for("redis://h/")
