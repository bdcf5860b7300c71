"""Durations and times as operators type them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from outbox.ops.parse import format_age, parse_duration, parse_since

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(days=14)),
        (" 30D ", timedelta(days=30)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "7y", "1.5h", "-1d", "7d2h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_parse_since_duration_counts_back_from_now() -> None:
    assert parse_since("2h", NOW) == datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def test_parse_since_iso_naive_is_utc_and_zoned_is_converted() -> None:
    assert parse_since("2026-11-28T10:00", NOW) == datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    plus_two = timezone(timedelta(hours=2))
    assert parse_since("2026-11-28T10:00+02:00", NOW) == datetime(
        2026, 11, 28, 10, 0, tzinfo=plus_two
    )
    assert parse_since("2026-11-28T10:00+02:00", NOW).tzinfo == UTC


def test_parse_since_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="neither a duration"):
        parse_since("yesterday", NOW)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-3, "0s"), (0, "0s"), (42.9, "42s"), (303, "5m03s"), (7800, "2h10m"), (273600, "3d4h")],
)
def test_format_age(seconds: float, text: str) -> None:
    assert format_age(seconds) == text
