"""S1, S5 and S7 (docs/architecture.md) with async handlers: the same scenarios as
test_s1_s4_ordering.py and test_s5_s7_delivery.py, run by worker processes whose consumer's
handler is ``async def`` (tests/support/handlers.py, OUTBOX_TEST_ASYNC=1), on PostgreSQL and
SQLite. Each scenario's assertions are the sync scenario's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.acceptance.test_s1_s4_ordering as ordering
import tests.acceptance.test_s5_s7_delivery as delivery
from tests.support.workers import Bed

pytestmark = pytest.mark.parametrize("dialect", ["postgresql", "sqlite"], indirect=True)


@pytest.fixture
def async_bed(bed: Bed, tmp_path: Path) -> Iterator[Bed]:
    seen = tmp_path / "async-handler-pids"
    bed.defaults = {"async": 1, "async_seen": str(seen)}
    yield bed
    # Every scenario runs its handler at least once: the async one, in a worker process.
    assert seen.exists() and seen.read_text().split(), "the async handler never ran"


def test_s1_priority_order_in_a_group_with_async_handlers(async_bed: Bed) -> None:
    ordering.run_s1(async_bed)


def test_s5_duplicate_delivery_has_one_effect_with_async_handlers(async_bed: Bed) -> None:
    delivery.test_s5_duplicate_delivery_has_one_effect(async_bed)


@pytest.mark.slow
def test_s7_worker_killed_mid_handler_with_async_handlers(async_bed: Bed) -> None:
    delivery.test_s7_worker_killed_mid_handler_holding_a_group(async_bed)
