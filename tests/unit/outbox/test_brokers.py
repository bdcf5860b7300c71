"""The broker adapters' pieces that need no broker: URLs checked and dispatched once
(outbox.brokers.urls) for the relay and the worker without loading a client, librdkafka's
logger."""

from __future__ import annotations

import subprocess
import sys

import pytest

from outbox.brokers.urls import broker_of, kafka_bootstrap
from outbox.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "broker"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "rabbitmq"),
        ("AMQPS://host", "rabbitmq"),
        ("kafka://h1:9092,h2:9092", "kafka"),
    ],
)
def test_the_scheme_names_the_broker(url: str, broker: str) -> None:
    assert broker_of("broker", url) == broker


@pytest.mark.parametrize(
    "url",
    ["", "host:5672", "amqp://", "kafka:///", "redis://user:hunter2@host/0", "kafka://u:hunter2@h"],
)
def test_a_bad_url_is_refused_masked_and_named_by_its_option(url: str) -> None:
    with pytest.raises(ConfigError, match="^source: ") as info:
        broker_of("source", url)
    assert "hunter2" not in str(info.value)


def test_kafka_bootstrap_is_the_host_list() -> None:
    assert kafka_bootstrap("kafka://h1:9092,h2:9092/") == "h1:9092,h2:9092"


def test_checking_a_url_loads_no_broker_client() -> None:
    # Given a fresh interpreter  When both factories' URL check runs
    code = (
        "import sys; from outbox.brokers.urls import broker_of; "
        "import relay.publishers, inbox.sources; "
        "broker_of('b', 'amqp://h'); broker_of('b', 'kafka://h'); "
        "print(sorted(m for m in ('pika', 'confluent_kafka') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # Then neither pika nor librdkafka is loaded
    assert out.stdout.strip() == "[]"


def test_librdkafka_logs_at_the_libraries_level() -> None:
    from outbox.brokers.kafka import CLIENT_LOGGER
    from outbox.logs import LIBRARY_LOGGERS_INSIDE_OURS

    assert CLIENT_LOGGER in LIBRARY_LOGGERS_INSIDE_OURS
