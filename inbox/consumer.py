"""``inbox.Consumer``: a named consumer, its queues, policies and handlers by message type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from sqlalchemy.orm import Session

from inbox.contract import FailureKind, failure_kind
from inbox.rules import OnDead, OnRetry, SkipRetry
from outbox import validation
from outbox.backoff import Backoff
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.errors import ConfigError, ValidationError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


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
    # The message contract (docs/contract.md), as the producer stored it.
    effect_key: str | None = None
    sequence_key: str | None = None
    sequence: int | None = None
    schema_version: str | None = None


SyncHandler = Callable[[Session, InboxMessage], None]
# ``async def handler(session: AsyncSession, message)``: the worker awaits it on an event
# loop, in the same effect transaction (inbox/engine/handler_calls.py).
AsyncHandler = Callable[["AsyncSession", InboxMessage], Awaitable[None]]
Handler = SyncHandler | AsyncHandler

# Seconds a sent-but-not-received outbox row keeps its place in its group (broker sources).
DEFAULT_DELIVERY_WINDOW = 3600.0
# Seconds a change waits for its missing predecessor (same sequence key) before review.
DEFAULT_SEQUENCE_GAP_TIMEOUT = 300.0


@dataclass(frozen=True)
class QueuePolicy:
    """A queue's own retry and dead-letter policy and transient errors; None keeps the
    consumer's."""

    on_retry: OnRetry | None = None
    on_dead: OnDead | None = None
    transient_errors: Sequence[type[BaseException]] | None = None


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
    ``queue_policies``: ``{queue: QueuePolicy(on_retry=..., on_dead=..., transient_errors=...)}``
    (or a dict with those keys) overrides the policies for the messages of one queue. A group
    whose messages come from several queues applies each message's own queue's policy to it.
    ``transient_errors``: when given, only these exception classes retry; any other error
    sends the message to review (state ``review``, reason ``not-transient``) on its first
    failure instead of retrying a mistake. ``sequence_gap_timeout``: seconds a change waits
    for its missing predecessor (same sequence key) before review (reason ``sequence-gap``).
    A handler raising ``inbox.EffectUnknown`` leaves its message ``unknown`` (docs/contract.md).
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
        queue_policies: Mapping[str, QueuePolicy | Mapping[str, Any]] | None = None,
        transient_errors: Sequence[type[BaseException]] = (),
        sequence_gap_timeout: float = DEFAULT_SEQUENCE_GAP_TIMEOUT,
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
            ("sequence_gap_timeout", sequence_gap_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{label}: must be positive, got {value!r}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigError(
                f"backoff: expected an outbox.backoff.Backoff (e.g. Backoff(1, 300), "
                f"Backoff.fixed(10)), got {backoff!r}"
            )
        _check_errors("permanent_errors", permanent_errors)
        _check_errors("transient_errors", transient_errors)
        self.on_retry: OnRetry = on_retry
        self.on_dead: OnDead = on_dead
        self.max_attempts = max_attempts
        self.backoff = backoff if backoff is not None else Backoff()
        self.permanent_errors = tuple(permanent_errors)
        self.transient_errors = tuple(transient_errors)
        self.sequence_gap_timeout = float(sequence_gap_timeout)
        self.visibility_timeout = float(visibility_timeout)
        self.group_lock_timeout = float(group_lock_timeout)
        self.delivery_window = float(delivery_window)
        self.config = config
        self.queue_policies = _queue_policies(queue_policies or {}, self.queues)
        # Read by every claim: worked out once (queues and policies never change).
        self.skip_retry = self._skip_retry()
        self._handlers: dict[str, Handler] = {}
        self._versions: dict[str, frozenset[str]] = {}

    def on_retry_for(self, queue: str) -> OnRetry:
        policy = self.queue_policies.get(queue)
        return policy.on_retry if policy and policy.on_retry else self.on_retry

    def on_dead_for(self, queue: str) -> OnDead:
        policy = self.queue_policies.get(queue)
        return policy.on_dead if policy and policy.on_dead else self.on_dead

    def transient_for(self, queue: str) -> tuple[type[BaseException], ...]:
        """The errors that retry for ``queue``'s messages (empty: every error retries)."""
        policy = self.queue_policies.get(queue)
        if policy is not None and policy.transient_errors is not None:
            return tuple(policy.transient_errors)
        return self.transient_errors

    def failure_kind(self, error: BaseException, queue: str) -> FailureKind:
        return failure_kind(
            error, permanent=self.permanent_errors, transient=self.transient_for(queue)
        )

    def _skip_retry(self) -> SkipRetry:
        """Whose retry rows step aside while waiting out their backoff (on_retry="skip"):
        True = every queue's, False = none, or the tuple of those queues."""
        skipping = tuple(q for q in self.queues if self.on_retry_for(q) == "skip")
        if len(skipping) == len(self.queues):
            return True
        return skipping or False

    def handler(
        self, message_type: str, *, versions: Collection[str] | None = None
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(session, message)`` for ``message_type``: a function with a
        ``Session``, or an ``async def`` with an ``AsyncSession`` (``outbox-relay[asyncio]``);
        one consumer may have both. ``versions``: the
        payload schema versions it accepts (``store(schema_version=...)``); a message of
        another version, or of none, goes to review (reason ``unsupported-schema``) without
        running, never to retry. Default: any version."""
        message_type = _name("message_type", message_type)
        accepted = _versions(versions)

        def register(function: Handler) -> Handler:
            if message_type in self._handlers:
                raise ConfigError(f"handler: {message_type!r} already has a handler")
            self._handlers[message_type] = function
            if accepted is not None:
                self._versions[message_type] = accepted
            return function

        return register

    def versions_for(self, message_type: str) -> frozenset[str] | None:
        """The schema versions ``message_type``'s handler accepts; None: any."""
        return self._versions.get(message_type)

    def handler_for(self, message_type: str) -> Handler | None:
        return self._handlers.get(message_type)

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self._handlers)

    @property
    def handlers(self) -> tuple[Handler, ...]:
        return tuple(self._handlers.values())

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
    given: Mapping[str, QueuePolicy | Mapping[str, Any]], queues: Sequence[str]
) -> dict[str, QueuePolicy]:
    policies: dict[str, QueuePolicy] = {}
    for queue, policy in given.items():
        prefix = f"queue_policies[{queue!r}]."
        if queue not in queues:
            raise ConfigError(f"{prefix[:-1]}: not one of this consumer's queues {list(queues)}")
        if not isinstance(policy, QueuePolicy):
            unknown = set(policy) - {"on_retry", "on_dead", "transient_errors"}
            if unknown:
                raise ConfigError(f"{prefix[:-1]}: unknown keys {sorted(unknown)}")
            policy = QueuePolicy(
                policy.get("on_retry"), policy.get("on_dead"), policy.get("transient_errors")
            )
        _check_policies(prefix, policy.on_retry, policy.on_dead)
        if policy.transient_errors is not None:
            _check_errors(f"{prefix}transient_errors", policy.transient_errors)
        policies[queue] = policy
    return policies


def _check_errors(label: str, errors: Any) -> None:
    if isinstance(errors, type | str):
        raise ConfigError(f"{label}: give a list of exception classes, got {errors!r}")
    for error in errors:
        if not (isinstance(error, type) and issubclass(error, BaseException)):
            raise ConfigError(f"{label}: {error!r} is not an exception class")


def _versions(versions: Any) -> frozenset[str] | None:
    if versions is None:
        return None
    if isinstance(versions, str) or not isinstance(versions, Collection) or not versions:
        raise ConfigError(
            f"versions: give a non-empty set of schema version strings, got {versions!r}"
        )
    for version in versions:
        if not isinstance(version, str) or not version.strip() or len(version) > 255:
            raise ConfigError(
                f"versions: {version!r} is not a schema version (a non-empty string of at "
                "most 255 characters)"
            )
    return frozenset(versions)


def _name(label: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise ConfigError(f"{label}: must be a non-empty string of at most 255 characters")
    return value
