"""Fixtures of the fault suite: a test bed (database + run recorder), the broker a scenario
runs on, and pipelines whose processes and broker queues are cleaned up after the test."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.faults.pipeline import MakePipeline, Pipeline, delete_rabbit_queues, require_rabbitmq
from tests.support import services
from tests.support.kafka import KafkaBroker
from tests.support.workers import Bed


@pytest.fixture
def bed(dsn: str, engine: Engine, tmp_path: Path) -> Iterator[Bed]:
    testbed = Bed.create(dsn, engine, tmp_path)
    yield testbed
    testbed.dispose()


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    """Indirect parameter "rabbitmq" or "kafka" (the session's broker) -> its URL."""
    if request.param == "kafka":
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        return broker.url
    assert request.param == "rabbitmq", request.param
    return require_rabbitmq()


@pytest.fixture
def make_pipeline(bed: Bed, tmp_path: Path) -> Iterator[MakePipeline]:
    """``make(relay_broker_url, worker_source_url)``; afterwards every process it started is
    killed (before the database goes) and its RabbitMQ queues are deleted."""
    made: list[Pipeline] = []

    def make(relay_broker: str, source: str) -> Pipeline:
        pipeline = Pipeline(bed, tmp_path, f"faults_{uuid.uuid4().hex[:10]}", relay_broker, source)
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        pipeline.dispose()
        if pipeline.source.startswith("amqp"):
            # the workers declare <queue>_1 .. _9 (every priority of the consumer)
            with contextlib.suppress(Exception):
                delete_rabbit_queues(
                    services.RABBITMQ_URL, [f"{pipeline.queue}_{p}" for p in range(1, 10)]
                )
