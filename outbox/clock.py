"""The one place that reads the wall clock, so tests and queries can be given ``now``."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
