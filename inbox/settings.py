"""The worker's settings, apart from its code: the CLI takes its defaults and ranges from here
without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from outbox.errors import ConfigError

Isolation = Literal["savepoint", "rerun"]
ISOLATIONS: tuple[Isolation, ...] = ("savepoint", "rerun")

# The ranges `outbox worker` offers too. Threads beyond 256 only queue for the database
# pool; a batch beyond 1000 holds its rows' locks for seconds (docs/batches.md).
MAX_CONCURRENCY = 256
MAX_BATCH_SIZE = 1000
POLL_INTERVAL_RANGE = (0.01, 60.0)


@dataclass
class WorkerOptions:
    """How one worker process receives, claims and runs; validated when built (a bad value
    raises ``ConfigError`` naming the field)."""

    concurrency: int = 1
    """Handler threads, each claiming and running its own batches. 1 to 256. Default 1."""
    poll_interval: float = 1.0
    """Seconds an idle thread waits for a wake-up (NOTIFY, local ingest, a retry falling due)
    before it looks again. 0.01 to 60. Default 1.0."""
    head_pass_interval: float = 5.0
    """Seconds between passes that promote the next message of the serial groups marked
    since the last pass (a safety net: a finishing batch promotes its groups at once).
    Default 5.0."""
    full_head_pass_interval: float = 300.0
    """Seconds between passes over every group with messages in line; one also runs at
    start. Default 300.0."""
    stop_when_idle: bool = False
    """Exit once nothing is left to receive, run or retry. Default False."""
    time_limit: float | None = None
    """Exit after this many seconds (once the running handlers finish), for periodic
    restarts. Default None: no limit."""
    batch: int = 100
    """Messages the source hands over per ingest. Default 100."""
    batch_size: int = 50
    """Handlers per database transaction: a thread claims up to this many messages and
    commits their effects and done marks together (1: one transaction per message). 1 to
    1000. Default 50 (docs/batches.md says how it was chosen)."""
    isolation: Isolation = "rerun"
    """When a handler raises: ``"rerun"`` rolls the batch back and runs it again without that
    message; ``"savepoint"`` wraps each handler in a SAVEPOINT. Default ``"rerun"``."""
    batch_seconds: float = 1.0
    """A batch whose handlers have run this long commits what is done; the rest runs in the
    next transaction. Default 1.0."""

    def __post_init__(self) -> None:
        _count("concurrency", self.concurrency, MAX_CONCURRENCY)
        _seconds("poll_interval", self.poll_interval, *POLL_INTERVAL_RANGE)
        _seconds("head_pass_interval", self.head_pass_interval)
        _seconds("full_head_pass_interval", self.full_head_pass_interval)
        if self.time_limit is not None:
            _seconds("time_limit", self.time_limit)
        _count("batch", self.batch)
        _count("batch_size", self.batch_size, MAX_BATCH_SIZE)
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"isolation: must be one of {ISOLATIONS}, got {self.isolation!r}")
        _seconds("batch_seconds", self.batch_seconds)


def _count(name: str, value: int, most: int | None = None) -> None:
    """An int from 1 to ``most`` (None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if value < 1 or (most is not None and value > most):
        bounds = f"from 1 to {most}" if most is not None else ">= 1"
        raise ConfigError(f"{name}: must be {bounds}, got {value}")


def _seconds(name: str, value: float, least: float = 0.0, most: float = float("inf")) -> None:
    """A number above 0 (or from ``least``, when given) up to ``most``; NaN is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: must be a number of seconds, got {value!r}")
    if not (value > 0 and least <= value <= most):
        bounds = f"from {least} to {most}" if least else "> 0"
        raise ConfigError(f"{name}: must be {bounds}, got {value}")
