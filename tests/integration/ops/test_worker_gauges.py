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


def inbox_counts(port: int) -> dict[str, float] | None:
    """The custom consumer's failed, review and unknown counts (None: not served yet)."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        for name in ("inbox_failed_count", "inbox_review_count", "inbox_unknown_count"):
            if line.startswith(f'{name}{{consumer="custom"}}'):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found if len(found) == 3 else None


def test_worker_gauges_read_the_consumers_own_inbox_table(engine: Engine, dsn: str) -> None:
    # Given the consumer's own tables with two dead rows, one in review and two unknown, and
    # one of each of the same consumer name in the default inbox
    custom = schema_for(CONFIG)
    custom.metadata.create_all(engine)
    with engine.begin() as conn:
        held = [states.FAILED, states.HALTED, states.REVIEW, states.UNKNOWN, states.UNKNOWN]
        for seq, state in enumerate(held):
            inbox_row(
                conn, consumer="custom", state=state, seq=seq, received_at=NOW,
                table=custom.inbox,
            )  # fmt: skip
        for seq, state in enumerate([states.FAILED, states.REVIEW, states.UNKNOWN], start=9):
            inbox_row(conn, consumer="custom", state=state, seq=seq, received_at=NOW)
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
        seen: dict[str, float] | None = None
        while time.monotonic() < deadline and seen is None:
            try:
                seen = inbox_counts(port)
            except OSError:
                time.sleep(0.1)
        # Then the rows counted are those of its own table
        assert seen == {
            "inbox_failed_count": 2.0, "inbox_review_count": 1.0, "inbox_unknown_count": 2.0,
        }  # fmt: skip
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
