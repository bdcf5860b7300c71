"""``outbox worker --metrics-port``: a real worker process serves what it did on /metrics."""

from __future__ import annotations

import signal
import time
import urllib.request

import pytest

from outbox import Message, store_many
from tests.support.kafka import free_port
from tests.support.workers import Bed


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return str(response.read().decode())


def value(text: str, prefix: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"], indirect=True)
def test_worker_serves_processed_counters_and_inbox_gauges(bed: Bed) -> None:
    # Given three jobs, one of which fails every time
    with bed.engine.begin() as conn:
        store_many(
            conn,
            [
                Message("jobs", "job", {"mark": "a"}),
                Message("jobs", "job", {"mark": "b"}, priority=2),
                Message("jobs", "job", {"mark": "c", "permanent": True}),
            ],
        )
    port = free_port()
    worker = bed.spawn(stop_when_idle=False, time_limit=60, extra=["--metrics-port", str(port)])
    try:
        # When the worker has processed them (polling its endpoint, with a deadline)
        deadline = time.monotonic() + 45
        text = ""
        while time.monotonic() < deadline:
            try:
                text = scrape(port)
            except OSError:
                text = ""
            if value(text, "inbox_processed_total{") >= 3:
                break
            time.sleep(0.1)
        # Then the counters, the histograms and the inbox gauges are there
        assert value(text, "inbox_processed_total{") == 3, text
        assert 'result="failed"' in text
        assert value(text, "inbox_handler_seconds_count{") == 3
        assert value(text, "inbox_end_to_end_seconds_count{") == 2
        assert "inbox_waiting_count" in text
        assert "outbox_pending_count" not in text  # the relay exports the outbox half
        assert "outbox_relay_batch_seconds" not in text and "outbox_published" not in text
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
