"""Retry delays as pure functions (shared by the relay and the consumers)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from outbox.errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: ``uniform(0, min(max, base * 2**(attempt-1)))``.

    Full jitter (not "equal" jitter) because many rows failing together must not retry together.
    """

    base_seconds: float = 1.0
    max_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.base_seconds <= 0 or self.max_seconds < self.base_seconds:
            raise ConfigError(
                f"backoff: need 0 < base_seconds <= max_seconds, got "
                f"{self.base_seconds}/{self.max_seconds}"
            )

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the delay after failed attempt number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempt: must be >= 1, got {attempt}")
        # Cap the exponent first: 2**attempt overflows float for absurd attempt counts.
        exponent = min(attempt - 1, 62)
        return float(min(self.max_seconds, self.base_seconds * (2**exponent)))

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        r = rng if rng is not None else random
        return timedelta(seconds=r.uniform(0.0, self.ceiling(attempt)))


def outage_delay(consecutive_failures: int, cap_seconds: float = 30.0) -> float:
    """Whole-process pause after a broker or database outage: 1, 2, 4 ... ``cap`` seconds.

    No jitter: one process waits, not a herd of rows.
    """
    if consecutive_failures < 1:
        return 0.0
    return float(min(cap_seconds, 2 ** min(consecutive_failures - 1, 30)))
