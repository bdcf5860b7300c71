"""``outbox relay --metrics-port``: a real relay process serves its counters, histograms and the
outbox gauges of the database (the public metric names of docs/architecture.md)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import Engine

from outbox import Message
from tests.integration.relay.helpers import (
    RelayProcess,
    all_sent,
    read_queue,
    store_rows,
    unique_queue,
    wait_for,
)
from tests.support.kafka import free_port


def _sum(text: str, prefix: str) -> float:
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix))


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_relay_serves_spec_metrics(
    engine: Engine, dsn: str, tmp_path: Path, rabbit_names: list[str]
) -> None:
    # Given 5 messages in one queue
    queue = unique_queue("rm")
    rabbit_names.append(f"{queue}_1")
    store_rows(engine, [Message(queue, "t", {"i": i}) for i in range(5)])
    port = free_port()
    relay = RelayProcess(dsn, tmp_path / "relay.log", "--metrics-port", str(port)).start()
    try:
        # When the relay has published them
        wait_for(lambda: all_sent(engine, 5), 60, "all sent")
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                text = resp.read().decode()
            if _sum(text, f'outbox_published_total{{priority="1",queue="{queue}"}}') == 5:
                break
            time.sleep(0.1)
        # Then the public names are there with queue/priority labels
        assert _sum(text, f'outbox_published_total{{priority="1",queue="{queue}"}}') == 5, text
        assert _sum(text, f'outbox_delivery_lag_seconds_count{{priority="1",queue="{queue}"}}') == 5
        assert _sum(text, "outbox_relay_batch_seconds_count") >= 1
        assert "outbox_pending_count" in text and "outbox_pending_seconds" in text
        assert "outbox_failed_count" in text
        assert "inbox_waiting_count" not in text  # the worker exports the inbox half
        assert "inbox_processed_total" not in text and "inbox_handler_seconds" not in text
    finally:
        assert relay.stop() == 0
    assert len(read_queue(f"{queue}_1", 5)) == 5
