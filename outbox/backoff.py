"""Retry delays as pure functions (shared by the relay and the consumers)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, get_args

from outbox.errors import ConfigError

Jitter = Literal["full", "none"]
# A delay must fit a timedelta (and a database timestamp): a century is beyond any retry.
_MAX_SECONDS = 100 * 365 * 86400.0


@dataclass(frozen=True)
class Backoff:
    """The delay after failed attempt ``n`` (1-based), from ``ceiling(n) = min(max_seconds,
    base_seconds * 2**(n-1))``: ``jitter="full"`` (the default) draws it from
    ``uniform(0, ceiling(n))``, ``jitter="none"`` waits exactly ``ceiling(n)``.

    Full jitter (not "equal" jitter) by default because many rows failing together must not
    retry together. ``"none"`` is for a delay you can predict: exponential without jitter, or
    the same delay every time with ``Backoff.fixed(seconds)`` (base = max).
    """

    base_seconds: float = 1.0
    """The ceiling after the first failed attempt, doubled after each next one. Default 1.0."""
    max_seconds: float = 300.0
    """The highest ceiling. Default 300.0."""
    jitter: Jitter = "full"
    """``"full"``: a delay drawn up to the ceiling; ``"none"``: the ceiling. Default ``"full"``."""

    def __post_init__(self) -> None:
        for label, value in (
            ("base_seconds", self.base_seconds),
            ("max_seconds", self.max_seconds),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"backoff: {label} must be a number, got {value!r}")
            if not math.isfinite(value) or value > _MAX_SECONDS:
                raise ConfigError(
                    f"backoff: {label} must be finite and at most {_MAX_SECONDS:.0f}, got {value!r}"
                )
        if self.base_seconds <= 0 or self.max_seconds < self.base_seconds:
            raise ConfigError(
                f"backoff: need 0 < base_seconds <= max_seconds, got "
                f"{self.base_seconds}/{self.max_seconds}"
            )
        if self.jitter not in get_args(Jitter):
            raise ConfigError(f"backoff: jitter must be 'full' or 'none', got {self.jitter!r}")

    @classmethod
    def fixed(cls, seconds: float) -> Backoff:
        """The same delay after every failed attempt."""
        return cls(seconds, seconds, jitter="none")

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the delay after failed attempt number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempt: must be >= 1, got {attempt}")
        # Cap the exponent first: 2**attempt overflows float for absurd attempt counts.
        exponent = min(attempt - 1, 62)
        return float(min(self.max_seconds, self.base_seconds * (2**exponent)))

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        ceiling = self.ceiling(attempt)
        if self.jitter == "none":
            return timedelta(seconds=ceiling)
        r = rng if rng is not None else random
        return timedelta(seconds=r.uniform(0.0, ceiling))


# The longest whole-process pause after an outage, unless told otherwise.
OUTAGE_CAP_SECONDS = 30.0


def outage_delay(consecutive_failures: int, cap_seconds: float = OUTAGE_CAP_SECONDS) -> float:
    """Whole-process pause after a broker or database outage: 1, 2, 4 ... ``cap`` seconds.

    No jitter: one process waits, not a herd of rows.
    """
    if consecutive_failures < 1:
        return 0.0
    return float(min(cap_seconds, 2 ** min(consecutive_failures - 1, 30)))
