"""Shared by the bad-input and security tests: brokers to publish raw messages to, worker
processes running ``tests.integration.bad_input.app:consumer``, and what the inbox recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import Engine, select

from outbox import inbox_table
from outbox.wire import Envelope
from tests.integration.bad_input.app import effects, metadata
from tests.integration.sources.sources_fixtures import SOURCE_CASES, SourceCase

ROOT = Path(__file__).resolve().parents[3]
TARGET = "tests.integration.bad_input.app:consumer"


@pytest.fixture(params=sorted(SOURCE_CASES))
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SourceCase]:
    """RabbitMQ and Kafka (the session's tansu), with raw and regular publishing."""
    case = SOURCE_CASES[str(request.param)](request, tmp_path)
    yield case
    case.cleanup()


def source_url(case: SourceCase) -> str:
    if case.name == "kafka":
        return str(case.broker.url)  # type: ignore[attr-defined]
    return str(case.url)  # type: ignore[attr-defined]


def create_effects(engine: Engine) -> None:
    metadata.create_all(engine)


def worker_env(consumer: str, queues: Sequence[str], types: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env["H4B_CONSUMER"] = consumer
    env["H4B_QUEUES"] = json.dumps(list(queues))
    env["H4B_TYPES"] = json.dumps(list(types))
    return env


def worker_cmd(dsn: str, source: str, *extra: str, time_limit: float = 60.0) -> list[str]:
    args = [sys.executable, "-m", "outbox_cli", "worker", TARGET, "--dsn", dsn]
    if source:
        args += ["--source", source]
    return [
        *args,
        "--stop-when-idle",
        "--poll-interval",
        "0.05",
        "--time-limit",
        str(time_limit),
        *extra,
    ]


def run_worker(
    dsn: str,
    source: str,
    env: dict[str, str],
    *extra: str,
    time_limit: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """One worker process until idle; its output is returned for the caller to inspect."""
    return subprocess.run(
        worker_cmd(dsn, source, *extra, time_limit=time_limit),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=time_limit + 60,
    )


def envelope(
    queue: str,
    mark: Any,
    *,
    seq: int,
    type: str = "job",
    priority: int = 1,
    serial_group: str | None = None,
    body: str | None = None,
    event_id: UUID | None = None,
) -> Envelope:
    return Envelope(
        event_id=event_id or uuid4(),
        type=type,
        queue=queue,
        priority=priority,
        outbox_id=seq,
        occurred_at=datetime.now(UTC),
        body=body if body is not None else json.dumps({"mark": mark}),
        serial_group=serial_group,
        # as store() does: the key defaults to the group, so Kafka keeps a group in one
        # partition; without it each message lands on a random partition and a consumer
        # apart from the outbox receives the group out of order (docs/ordering.md)
        key=serial_group,
    )


def inbox_rows(engine: Engine, consumer: str) -> list[Any]:
    with engine.connect() as conn:
        stmt = select(inbox_table).where(inbox_table.c.consumer == consumer)
        return list(conn.execute(stmt.order_by(inbox_table.c.id)).all())


def effect_rows(engine: Engine, consumer: str) -> list[Any]:
    with engine.connect() as conn:
        stmt = select(effects).where(effects.c.consumer == consumer)
        return list(conn.execute(stmt.order_by(effects.c.id)).all())
