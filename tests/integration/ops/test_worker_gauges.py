"""``outbox worker --metrics-port`` for a consumer with its own ``inbox_table``: the served
inbox gauges count that table's rows, not the default inbox's."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime

from sqlalchemy import Engine

from outbox import states
from outbox.schema import schema_for
from tests.integration.ops.custom_tables import CONFIG
from tests.integration.ops.rows import SCHEMA, inbox_row
from tests.support.kafka import free_port
from tests.support.workers import ROOT

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
TARGET = "tests.integration.ops.custom_tables:consumer"


def failed_count(port: int) -> float | None:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith('inbox_failed_count{consumer="custom"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_worker_gauges_read_the_consumers_own_inbox_table(engine: Engine, dsn: str) -> None:
    # Given the consumer's own tables with two dead rows, and one dead row of the same
    # consumer name in the default inbox
    custom = schema_for(CONFIG)
    custom.metadata.create_all(engine)
    with engine.begin() as conn:
        for seq, state in enumerate([states.FAILED, states.HALTED]):
            inbox_row(
                conn, consumer="custom", state=state, seq=seq, received_at=NOW,
                table=custom.inbox,
            )  # fmt: skip
        inbox_row(conn, consumer="custom", state=states.FAILED, seq=9, received_at=NOW)
    assert SCHEMA.inbox.name != custom.inbox.name

    # When a worker of that consumer serves its metrics
    port = free_port()
    args = [
        sys.executable, "-m", "outbox_cli", "worker", TARGET, "--dsn", dsn,
        "--metrics-port", str(port), "--time-limit", "60", "--log-level", "WARNING",
    ]  # fmt: skip
    worker = subprocess.Popen(args, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        seen: float | None = None
        while time.monotonic() < deadline and seen is None:
            try:
                seen = failed_count(port)
            except OSError:
                time.sleep(0.1)
        # Then the dead rows counted are those of its own table
        assert seen == 2.0
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
