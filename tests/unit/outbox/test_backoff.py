import random
from datetime import timedelta

import pytest

from outbox.backoff import Backoff, outage_delay
from outbox.errors import ConfigError


def test_ceiling_doubles_and_caps() -> None:
    b = Backoff(base_seconds=1, max_seconds=10)
    assert [b.ceiling(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert b.ceiling(10_000) == 10  # no overflow for absurd attempt counts


def test_delay_is_full_jitter_within_ceiling() -> None:
    b = Backoff(base_seconds=2, max_seconds=60)
    rng = random.Random(7)
    delays = [b.delay(3, rng) for _ in range(2000)]
    assert all(timedelta(0) <= d <= timedelta(seconds=8) for d in delays)
    # full jitter spreads over the whole range, not just the top half
    assert min(delays) < timedelta(seconds=1) and max(delays) > timedelta(seconds=7)


def test_invalid_settings_and_attempts() -> None:
    with pytest.raises(ConfigError, match="backoff"):
        Backoff(base_seconds=0)
    with pytest.raises(ConfigError):
        Backoff(base_seconds=5, max_seconds=1)
    with pytest.raises(ValueError, match="attempt"):
        Backoff().ceiling(0)


def test_outage_delay_sequence() -> None:
    assert [outage_delay(n) for n in range(0, 8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert outage_delay(1000) == 30
