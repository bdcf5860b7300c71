"""Per-key chains inside one batch: cut at the first row not due, hold back after a refusal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from relay.key_order import due_prefixes, waves

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def row(id: int, key: str | None, due: bool = True, queue: str = "q", priority: int = 1) -> Any:
    at = NOW if due else NOW + timedelta(seconds=1)
    return {"id": id, "key": key, "queue": queue, "priority": priority, "available_at": at}


def test_chain_stops_at_first_row_not_due() -> None:
    rows = [row(1, "a"), row(2, "a", due=False), row(3, "a"), row(4, "b"), row(5, "b")]
    assert [r["id"] for r in due_prefixes(rows, NOW)] == [1, 4, 5]


def test_chains_are_per_queue_and_priority() -> None:
    rows = [row(1, "a", due=False), row(2, "a", priority=2), row(3, "a", queue="other")]
    assert [r["id"] for r in due_prefixes(rows, NOW)] == [2, 3]


def test_waves_hold_one_row_per_key_in_id_order() -> None:
    rows = [row(1, "a"), row(2, "a"), row(3, None), row(4, "b"), row(5, "a"), row(6, None)]
    assert [[r["id"] for r in wave] for wave in waves(rows)] == [[1, 3, 4, 6], [2], [5]]


def test_without_keys_one_wave() -> None:
    rows = [row(2, None), row(1, None)]
    assert [[r["id"] for r in wave] for wave in waves(rows)] == [[1, 2]]
