"""Checks on a message before anything is written (the bad-input rules of docs/architecture.md).

Pure functions: they take values and the config, return normalised values or raise
``ValidationError`` naming the field.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from outbox.config import OutboxConfig
from outbox.errors import PayloadTooLargeError, ValidationError

_NAME = re.compile(r"[A-Za-z0-9._-]+")
MAX_NAME_LENGTH = 255
# A queue becomes the broker name ``<queue>_<priority>``: Apache Kafka takes topic names of at
# most 249 characters, and a SMALLINT priority adds up to 7 ("_-32768").
MAX_QUEUE_LENGTH = 249 - 7
# RabbitMQ refuses to declare queues (and exchanges) named ``amq.*`` (403 ACCESS_REFUSED).
_RESERVED_PREFIXES = ("amq.",)
# The sequence column is a signed BIGINT; 0 is the consumer's "nothing applied yet".
MAX_SEQUENCE = 2**63 - 1


def check_queue(queue: Any) -> str:
    if not isinstance(queue, str) or not queue:
        raise ValidationError("queue", "must be a non-empty string")
    if len(queue) > MAX_QUEUE_LENGTH:
        raise ValidationError(
            "queue", f"longer than {MAX_QUEUE_LENGTH} characters (broker name limits)"
        )
    if not _NAME.fullmatch(queue):
        raise ValidationError(
            "queue", f"{queue!r} has characters outside letters, digits, '.', '-', '_'"
        )
    if queue.lower().startswith(_RESERVED_PREFIXES):
        raise ValidationError("queue", f"{queue!r}: the 'amq.' prefix is reserved by RabbitMQ")
    return queue


def check_type(message_type: Any) -> str:
    if not isinstance(message_type, str) or not message_type.strip():
        raise ValidationError("type", "must be a non-empty string")
    if len(message_type) > MAX_NAME_LENGTH:
        raise ValidationError("type", f"longer than {MAX_NAME_LENGTH} characters")
    return message_type


def check_priority(priority: Any, config: OutboxConfig) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValidationError("priority", f"must be an integer, got {type(priority).__name__}")
    if not config.min_priority <= priority <= config.max_priority:
        raise ValidationError(
            "priority",
            f"{priority} is outside the configured range "
            f"{config.min_priority}..{config.max_priority} ({config.min_priority} = most urgent)",
        )
    return priority


def check_optional_name(field: str, value: Any, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "must be a non-empty string or None")
    if len(value) > limit:
        raise ValidationError(field, f"is {len(value)} characters long; the limit is {limit}")
    return value


def check_contract_name(field: str, value: Any) -> str | None:
    """``effect_key``, ``sequence_key``, ``schema_version``: None or a trimmed name.

    Surrounding whitespace is refused, not stripped: MariaDB/MySQL compare with PAD SPACE,
    so "a" and "a " would be one key there and two on PostgreSQL and SQLite.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "must be a non-empty string or None")
    if len(value) > MAX_NAME_LENGTH:
        raise ValidationError(
            field, f"is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if value != value.strip():
        raise ValidationError(field, f"{value!r} has leading or trailing whitespace")
    return value


def check_sequence(sequence: Any, sequence_key: str | None) -> int | None:
    """An explicit number of ``sequence_key``; None lets ``store()`` assign the next one."""
    if sequence is None:
        return None
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise ValidationError("sequence", f"must be an integer, got {type(sequence).__name__}")
    if not 1 <= sequence <= MAX_SEQUENCE:
        raise ValidationError("sequence", f"{sequence} is outside 1..{MAX_SEQUENCE}")
    if sequence_key is None:
        raise ValidationError("sequence", "given without a sequence_key (a number of what?)")
    return sequence


def check_event_id(event_id: Any) -> UUID:
    if event_id is None:
        return uuid4()
    if isinstance(event_id, UUID):
        return event_id
    if isinstance(event_id, str):
        try:
            return UUID(event_id)
        except ValueError:
            pass
    raise ValidationError("event_id", f"{event_id!r} is not a UUID")


def check_delay(delay: Any, now: datetime) -> datetime:
    if delay is None:
        return now
    if isinstance(delay, int | float) and not isinstance(delay, bool):
        delay = timedelta(seconds=delay)
    if not isinstance(delay, timedelta):
        raise ValidationError("delay", "must be a timedelta or a number of seconds")
    if delay < timedelta(0):
        raise ValidationError("delay", "must not be negative")
    return now + delay


def check_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise ValidationError("headers", "must be a dict of str to str")
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValidationError("headers", f"entry {k!r} must map a str to a str")
        if k.lower().startswith("outbox-"):
            raise ValidationError("headers", f"{k!r}: the 'outbox-' prefix is reserved")
    return dict(headers)


def check_payload_size(text: str, config: OutboxConfig) -> None:
    size = len(text.encode("utf-8"))
    if size > config.max_payload_bytes:
        raise PayloadTooLargeError(
            "payload", f"is {size} bytes serialised; the limit is {config.max_payload_bytes}"
        )
