"""What a relay is built with, apart from its code: the CLI takes its defaults from here
without importing the relay loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from outbox.backoff import OUTAGE_CAP_SECONDS, Backoff
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.errors import ConfigError


@dataclass(frozen=True)
class RelaySettings:
    """How one relay fetches, publishes and gives up; validated when built (a bad value
    raises ``ConfigError`` naming the field)."""

    batch_size: int = 100
    """Rows fetched, published and marked per transaction. Default 100."""
    poll_interval: float = 1.0
    """Seconds between polls when nothing is due (PostgreSQL also wakes on NOTIFY).
    Default 1.0."""
    max_attempts: int = 5
    """Broker refusals of one row before it is ``failed`` (kept, never deleted). Default 5."""
    backoff: Backoff = field(default_factory=Backoff)
    """The delay before a refused row is tried again. Default ``Backoff()``: full jitter
    up to ``min(300, 1 * 2**(attempt-1))`` seconds."""
    queues: tuple[str, ...] = ()
    """Publish only rows of these queues. Default ``()``: every queue."""
    time_limit: float | None = None
    """Exit cleanly after this many seconds (after the current batch), for periodic
    restarts. Default None: no limit."""
    max_messages: int | None = None
    """Exit cleanly after publishing this many messages. Default None: no limit."""
    stop_when_idle: bool = False
    """Exit as soon as nothing is due (tests, one-off drains). Default False."""
    outage_cap_seconds: float = OUTAGE_CAP_SECONDS
    """Longest pause after a broker or database outage (1, 2, 4 ... seconds). Default 30.0
    (``outbox.backoff.OUTAGE_CAP_SECONDS``, the worker's too)."""
    use_notify: bool = True
    """PostgreSQL: LISTEN for ``store()``'s notifications to wake at once. Default True."""
    pipeline: bool = True
    """PostgreSQL / MariaDB: while the broker confirms a full batch, fetch and lock the next
    one (relay/pipeline.py). Default True: one relay drained 1.01x-1.51x faster with it in
    bench/relay.py."""
    config: OutboxConfig = DEFAULT_CONFIG
    """The outbox table's name and the NOTIFY channel. Default ``OutboxConfig()``."""

    def __post_init__(self) -> None:
        if isinstance(self.queues, str):
            # A str is a sequence of one-letter queue names: the relay would publish nothing.
            raise ConfigError(f"queues: expected a sequence of names, got {self.queues!r}")
        # A tuple whatever sequence was given: the fetch statement is cached by it.
        object.__setattr__(self, "queues", tuple(self.queues))
        if self.batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.poll_interval <= 0:
            raise ConfigError(f"poll_interval: must be > 0, got {self.poll_interval}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts: must be >= 1, got {self.max_attempts}")
        if self.time_limit is not None and self.time_limit <= 0:
            raise ConfigError(f"time_limit: must be > 0, got {self.time_limit}")
        if self.max_messages is not None and self.max_messages < 1:
            raise ConfigError(f"max_messages: must be >= 1, got {self.max_messages}")
        if self.outage_cap_seconds <= 0:
            raise ConfigError(f"outage_cap_seconds: must be > 0, got {self.outage_cap_seconds}")
