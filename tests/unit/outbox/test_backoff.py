import random
import re
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


def test_without_jitter_the_delay_is_the_ceiling() -> None:
    b = Backoff(base_seconds=1, max_seconds=10, jitter="none")
    rng = random.Random(7)
    assert [b.delay(n, rng).total_seconds() for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert b.delay(1) == b.delay(1)  # no draw: every call, every process the same


def test_fixed_is_the_same_delay_after_every_attempt() -> None:
    b = Backoff.fixed(2.5)
    assert b == Backoff(2.5, 2.5, jitter="none")
    assert {b.delay(n) for n in (1, 2, 5, 100)} == {timedelta(seconds=2.5)}


def test_full_jitter_stays_the_default() -> None:
    assert Backoff().jitter == "full"
    assert Backoff(1, 1).delay(1, random.Random(3)) < timedelta(seconds=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jitter": "equal"}, "jitter must be 'full' or 'none', got 'equal'"),
        ({"base_seconds": float("nan")}, "base_seconds must be finite"),
        ({"max_seconds": float("inf")}, "max_seconds must be finite"),
        ({"max_seconds": 1e20}, "max_seconds must be finite and at most"),
        ({"base_seconds": "1"}, "base_seconds must be a number, got '1'"),
        ({"base_seconds": True}, "base_seconds must be a number"),
    ],
)
def test_bad_settings_name_the_setting(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^backoff: {re.escape(message)}"):
        Backoff(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="backoff"):
        Backoff.fixed(0)
