"""Pure parsers for what operators type: durations (``7d``) and points in time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> timedelta (whole numbers, one unit)."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 90s, 15m, 12h, 7d or 2w")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def parse_since(text: str, now: datetime) -> datetime:
    """A duration back from ``now`` (``2h``) or an ISO 8601 time (UTC when no zone given)."""
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (2h, 7d) nor an ISO time (2026-11-29T03:00)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def format_age(seconds: float) -> str:
    """A short human age: ``0s``, ``42s``, ``5m03s``, ``2h10m``, ``3d4h``."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"
