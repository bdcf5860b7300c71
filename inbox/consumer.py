"""``inbox.Consumer``: a named consumer, its queues, policies and handlers by message type."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.orm import Session

from inbox.rules import OnDead, OnRetry, SkipRetry
from outbox import validation
from outbox.backoff import Backoff
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.errors import ConfigError, ValidationError


@dataclass(frozen=True)
class InboxMessage:
    """What a handler receives. ``attempt`` is 1 on the first run."""

    event_id: UUID
    type: str
    payload: Any
    priority: int
    serial_group: str | None
    queue: str
    headers: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 1
    key: str | None = None
    occurred_at: datetime | None = None


Handler = Callable[[Session, InboxMessage], None]

# Seconds a sent-but-not-received outbox row keeps its place in its group (broker sources).
DEFAULT_DELIVERY_WINDOW = 3600.0


@dataclass(frozen=True)
class QueuePolicy:
    """A queue's own retry and dead-letter policy; None keeps the consumer's."""

    on_retry: OnRetry | None = None
    on_dead: OnDead | None = None


class Consumer:
    """A consumer of one or more queues. Each (event_id, consumer) takes effect once.

    ``on_retry``: while a group's head waits out a retry backoff, "block" the group (order
    kept) or "skip" to the next message. ``on_dead``: a dead head lets the group "continue" or
    "halt"s it until ``inbox.unblock``. ``permanent_errors``: exception classes that fail a
    message at once. ``backoff``: the delay before a retry (``outbox.backoff.Backoff``:
    exponential with full jitter by default; ``jitter="none"`` or ``Backoff.fixed(s)`` for a
    predictable one). ``visibility_timeout``: seconds a claim lives without a heartbeat.
    ``group_lock_timeout``: seconds to wait for a group lock before trying later.
    ``delivery_window``: with a broker, outbox rows sent this many seconds ago or less and not
    yet received still hold their group (job-queue deployment).
    ``queue_policies``: ``{queue: QueuePolicy(on_retry=..., on_dead=...)}`` (or a dict with those
    keys) overrides the two policies for the messages of one queue. A group whose messages
    come from several queues applies each message's own queue's policy to it.
    """

    def __init__(
        self,
        name: str,
        *,
        queues: Sequence[str],
        on_retry: OnRetry = "block",
        on_dead: OnDead = "continue",
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        permanent_errors: Sequence[type[BaseException]] = (),
        visibility_timeout: float = 60.0,
        group_lock_timeout: float = 5.0,
        delivery_window: float = DEFAULT_DELIVERY_WINDOW,
        queue_policies: Mapping[str, QueuePolicy | Mapping[str, str]] | None = None,
        config: OutboxConfig = DEFAULT_CONFIG,
    ) -> None:
        self.name = _name("name", name)
        if self.name != self.name.strip():
            # MariaDB compares "c" and "c " as equal (PAD SPACE): two such consumers would
            # share one dedupe key.
            raise ConfigError("name: must not start or end with whitespace")
        if isinstance(queues, str) or not queues:
            raise ConfigError("queues: give a non-empty list of queue names")
        try:
            self.queues = tuple(validation.check_queue(q) for q in queues)
        except ValidationError as exc:
            raise ConfigError(f"queues: {exc.reason}") from exc
        _check_policies("", on_retry, on_dead)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts: must be an integer >= 1, got {max_attempts!r}")
        for label, value in (
            ("visibility_timeout", visibility_timeout),
            ("group_lock_timeout", group_lock_timeout),
            ("delivery_window", delivery_window),
        ):
            if not value > 0:
                raise ConfigError(f"{label}: must be positive, got {value!r}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(
                f"backoff: expected an outbox.backoff.Backoff (e.g. Backoff(1, 300), "
                f"Backoff.fixed(10)), got {backoff!r}"
            )
        for error in permanent_errors:
            if not (isinstance(error, type) and issubclass(error, BaseException)):
                raise ConfigError(f"permanent_errors: {error!r} is not an exception class")
        self.on_retry: OnRetry = on_retry
        self.on_dead: OnDead = on_dead
        self.max_attempts = max_attempts
        self.backoff = backoff if backoff is not None else Backoff()
        self.permanent_errors = tuple(permanent_errors)
        self.visibility_timeout = float(visibility_timeout)
        self.group_lock_timeout = float(group_lock_timeout)
        self.delivery_window = float(delivery_window)
        self.config = config
        self.queue_policies = _queue_policies(queue_policies or {}, self.queues)
        # Read by every claim: worked out once (queues and policies never change).
        self.skip_retry = self._skip_retry()
        self._handlers: dict[str, Handler] = {}

    def on_retry_for(self, queue: str) -> OnRetry:
        policy = self.queue_policies.get(queue)
        return policy.on_retry if policy and policy.on_retry else self.on_retry

    def on_dead_for(self, queue: str) -> OnDead:
        policy = self.queue_policies.get(queue)
        return policy.on_dead if policy and policy.on_dead else self.on_dead

    def _skip_retry(self) -> SkipRetry:
        """Whose retry rows step aside while waiting out their backoff (on_retry="skip"):
        True = every queue's, False = none, or the tuple of those queues."""
        skipping = tuple(q for q in self.queues if self.on_retry_for(q) == "skip")
        if len(skipping) == len(self.queues):
            return True
        return skipping or False

    def handler(self, message_type: str) -> Callable[[Handler], Handler]:
        """Register ``handler(session, message)`` for ``message_type``."""
        message_type = _name("message_type", message_type)

        def register(function: Handler) -> Handler:
            if message_type in self._handlers:
                raise ConfigError(f"handler: {message_type!r} already has a handler")
            self._handlers[message_type] = function
            return function

        return register

    def handler_for(self, message_type: str) -> Handler | None:
        return self._handlers.get(message_type)

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def is_permanent(self, error: BaseException) -> bool:
        return isinstance(error, self.permanent_errors)

    def __repr__(self) -> str:
        return f"Consumer({self.name!r}, queues={list(self.queues)!r})"


def _check_policies(prefix: str, on_retry: Any, on_dead: Any) -> None:
    if on_retry not in ("block", "skip") and not (prefix and on_retry is None):
        raise ConfigError(f"{prefix}on_retry: must be 'block' or 'skip', got {on_retry!r}")
    if on_dead not in ("continue", "halt") and not (prefix and on_dead is None):
        raise ConfigError(f"{prefix}on_dead: must be 'continue' or 'halt', got {on_dead!r}")


def _queue_policies(
    given: Mapping[str, QueuePolicy | Mapping[str, str]], queues: Sequence[str]
) -> dict[str, QueuePolicy]:
    policies: dict[str, QueuePolicy] = {}
    for queue, policy in given.items():
        prefix = f"queue_policies[{queue!r}]."
        if queue not in queues:
            raise ConfigError(f"{prefix[:-1]}: not one of this consumer's queues {list(queues)}")
        if not isinstance(policy, QueuePolicy):
            unknown = set(policy) - {"on_retry", "on_dead"}
            if unknown:
                raise ConfigError(f"{prefix[:-1]}: unknown keys {sorted(unknown)}")
            policy = QueuePolicy(policy.get("on_retry"), policy.get("on_dead"))  # type: ignore[arg-type]
        _check_policies(prefix, policy.on_retry, policy.on_dead)
        policies[queue] = policy
    return policies


def _name(label: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise ConfigError(f"{label}: must be a non-empty string of at most 255 characters")
    return value
