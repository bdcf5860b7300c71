"""The message on the wire, the same for RabbitMQ and Kafka (docs/wire-format.md).

Body: the payload's JSON text, UTF-8. Headers: strings; ours carry the ``outbox-`` prefix so
they never collide with the application's own headers (which ``store()`` keeps off that
prefix). A consumer in any language needs only a JSON parser and these header names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from outbox.errors import OutboxError
from outbox.serialization import DEFAULT_SERIALIZER, decode, serialize

SCHEMA_VERSION = "1"
PREFIX = "outbox-"
H_EVENT_ID = "outbox-event-id"
H_TYPE = "outbox-type"
H_QUEUE = "outbox-queue"
H_PRIORITY = "outbox-priority"
H_SERIAL_GROUP = "outbox-serial-group"
H_KEY = "outbox-key"
H_OUTBOX_ID = "outbox-id"
H_OCCURRED_AT = "outbox-occurred-at"
H_SCHEMA_VERSION = "outbox-schema-version"  # the envelope format's own version
# The message contract, each sent only when the message has it.
H_EFFECT_KEY = "outbox-effect-key"
H_SEQUENCE_KEY = "outbox-sequence-key"
H_SEQUENCE = "outbox-sequence"
H_PAYLOAD_SCHEMA = "outbox-payload-schema"  # the payload's schema (store's schema_version)
CONTENT_TYPE = "application/json"

MAX_NAME = 255  # the inbox's type / queue / serial_group columns
_SMALLINT = (-32768, 32767)  # the priority column
_BIGINT_MAX = 2**63 - 1  # the seq (outbox id) and sequence columns
_DIGITS = re.compile(r"[0-9]+")

REQUIRED = (H_EVENT_ID, H_TYPE, H_QUEUE, H_PRIORITY, H_OUTBOX_ID, H_OCCURRED_AT, H_SCHEMA_VERSION)


class MalformedMessageError(OutboxError):
    """A message from the broker that is not in our wire format; ``field`` names the part."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True)
class Envelope:
    """One message as published: routing facts plus the payload's JSON text."""

    event_id: UUID
    type: str
    queue: str
    priority: int
    outbox_id: int
    occurred_at: datetime
    body: str
    serial_group: str | None = None
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    effect_key: str | None = None
    sequence_key: str | None = None
    sequence: int | None = None
    schema_version: str | None = None

    def wire_headers(self) -> dict[str, str]:
        # An application header under our prefix (a row written by hand: store() refuses
        # them) is dropped, not sent: the receiver would read it as ours, e.g. a sequence
        # number this message does not have.
        headers = {k: v for k, v in self.headers.items() if not is_reserved(k)}
        headers.update(
            {
                H_EVENT_ID: str(self.event_id),
                H_TYPE: self.type,
                H_QUEUE: self.queue,
                H_PRIORITY: str(self.priority),
                H_OUTBOX_ID: str(self.outbox_id),
                H_OCCURRED_AT: self.occurred_at.astimezone(UTC).isoformat(),
                H_SCHEMA_VERSION: SCHEMA_VERSION,
            }
        )
        if self.serial_group is not None:
            headers[H_SERIAL_GROUP] = self.serial_group
        if self.key is not None:
            headers[H_KEY] = self.key
        optional = (
            (H_EFFECT_KEY, self.effect_key),
            (H_SEQUENCE_KEY, self.sequence_key),
            (H_SEQUENCE, None if self.sequence is None else str(self.sequence)),
            (H_PAYLOAD_SCHEMA, self.schema_version),
        )
        headers.update({name: value for name, value in optional if value is not None})
        return headers

    def wire_body(self) -> bytes:
        return self.body.encode("utf-8")

    def payload(self) -> Any:
        """The decoded payload; raises ``MalformedMessageError`` for bad JSON."""
        try:
            return decode(self.body)
        except ValueError as exc:
            raise MalformedMessageError("body", f"not valid JSON: {exc}") from exc


def is_reserved(header: str) -> bool:
    """Is ``header`` under our prefix (any case)? Those names are the envelope's, never the
    application's."""
    return header.lower().startswith(PREFIX)


def row_headers(row: Any) -> dict[str, str]:
    """The application headers of a stored row (outbox or inbox) as strings. A row written
    by hand may hold something else than a JSON object there: refused with the reason."""
    return headers_of(row.headers)


def headers_of(value: Any) -> dict[str, str]:
    """``row_headers`` of a headers column's value."""
    headers = value or {}
    if not isinstance(headers, dict):
        raise TypeError(f"headers: expected a JSON object, got {type(headers).__name__}")
    return {str(k): str(v) for k, v in headers.items()}


def envelope_from_row(row: Mapping[Any, Any]) -> Envelope:
    """The message of an outbox row, for the relay and the database source alike.

    ``row``: the row as a mapping (``Row._mapping``): read by name from a mapping, its 14
    columns cost a fifth of what as many ``Row`` attribute lookups cost, per message.
    The column holds a JSON document (JSONB reorders keys); the body is its compact, strict
    re-serialisation, identical whatever the database. Raises ``TypeError`` or
    ``ValueError`` (``PayloadError``) for a row that cannot be a message.
    """
    return Envelope(
        event_id=row["event_id"],
        type=row["type"],
        queue=row["queue"],
        priority=row["priority"],
        outbox_id=row["id"],
        occurred_at=row["occurred_at"],
        body=serialize("payload", row["payload"], DEFAULT_SERIALIZER),
        serial_group=row["serial_group"],
        key=row["key"],
        headers=headers_of(row["headers"]),
        effect_key=row["effect_key"],
        sequence_key=row["sequence_key"],
        sequence=row["sequence"],
        schema_version=row["schema_version"],
    )


def routing_name(queue: str, priority: int) -> str:
    """Broker queue / topic of a message: ``<queue>_<priority>``."""
    return f"{queue}_{priority}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def from_wire(raw_headers: Mapping[str, Any] | None, body: bytes | str | None) -> Envelope:
    """Parse a received message, or raise ``MalformedMessageError`` naming what is wrong."""
    if raw_headers is None:
        raise MalformedMessageError("headers", "missing")
    try:
        headers = {str(k): _text(v) for k, v in raw_headers.items() if v is not None}
    except UnicodeDecodeError as exc:
        raise MalformedMessageError("headers", f"not UTF-8: {exc}") from exc
    for name in REQUIRED:
        if name not in headers:
            raise MalformedMessageError(name, "header missing")
    if headers[H_SCHEMA_VERSION] != SCHEMA_VERSION:
        raise MalformedMessageError(
            H_SCHEMA_VERSION,
            f"version {headers[H_SCHEMA_VERSION]!r} is not supported (this side reads "
            f"{SCHEMA_VERSION})",
        )
    try:
        event_id = UUID(headers[H_EVENT_ID])
    except ValueError as exc:
        raise MalformedMessageError(H_EVENT_ID, "not a UUID") from exc
    for name in (H_TYPE, H_QUEUE, H_SERIAL_GROUP):
        value = headers.get(name)
        if value is not None and not 0 < len(value) <= MAX_NAME:
            raise MalformedMessageError(
                name, f"is {len(value)} characters long; expected 1..{MAX_NAME}"
            )
    contract = _contract(headers)
    priority = _int(H_PRIORITY, headers[H_PRIORITY], *_SMALLINT)
    outbox_id = _int(H_OUTBOX_ID, headers[H_OUTBOX_ID], 0, _BIGINT_MAX)
    try:
        occurred_at = datetime.fromisoformat(headers[H_OCCURRED_AT])
    except ValueError as exc:
        raise MalformedMessageError(H_OCCURRED_AT, "not an ISO 8601 timestamp") from exc
    if occurred_at.tzinfo is None:
        raise MalformedMessageError(H_OCCURRED_AT, "has no timezone")
    if body is None:
        raise MalformedMessageError("body", "missing")
    try:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
    except UnicodeDecodeError as exc:
        raise MalformedMessageError("body", f"not UTF-8: {exc}") from exc
    envelope = Envelope(
        event_id=event_id,
        type=headers[H_TYPE],
        queue=headers[H_QUEUE],
        priority=priority,
        outbox_id=outbox_id,
        occurred_at=occurred_at.astimezone(UTC),
        body=text,
        serial_group=headers.get(H_SERIAL_GROUP),
        key=headers.get(H_KEY),
        headers={k: v for k, v in headers.items() if not is_reserved(k)},
        **contract,
    )
    envelope.payload()  # refuse bad JSON at the door, with the field named
    return envelope


def _contract(headers: Mapping[str, str]) -> dict[str, Any]:
    """The message contract's headers, checked as ``store()`` checks its arguments."""
    names = {
        "effect_key": H_EFFECT_KEY,
        "sequence_key": H_SEQUENCE_KEY,
        "schema_version": H_PAYLOAD_SCHEMA,
    }
    contract: dict[str, Any] = {}
    for attribute, name in names.items():
        value = headers.get(name)
        if value is not None:
            if not 0 < len(value) <= MAX_NAME:
                raise MalformedMessageError(
                    name, f"is {len(value)} characters long; expected 1..{MAX_NAME}"
                )
            if value != value.strip():
                raise MalformedMessageError(name, "has leading or trailing whitespace")
        contract[attribute] = value
    text = headers.get(H_SEQUENCE)
    if text is None:
        if contract["sequence_key"] is not None:
            raise MalformedMessageError(
                H_SEQUENCE, f"header missing (required with {H_SEQUENCE_KEY})"
            )
        contract["sequence"] = None
        return contract
    if contract["sequence_key"] is None:
        raise MalformedMessageError(H_SEQUENCE, f"given without {H_SEQUENCE_KEY}")
    # Digits only: int() would also take "+7", " 7", "7_000" and other scripts' digits.
    if not _DIGITS.fullmatch(text):
        raise MalformedMessageError(H_SEQUENCE, f"{text[:50]!r} is not an integer")
    contract["sequence"] = _int(H_SEQUENCE, text, 1, _BIGINT_MAX)
    return contract


def _int(name: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise MalformedMessageError(name, f"{value[:50]!r} is not an integer") from exc
    if not low <= number <= high:
        raise MalformedMessageError(name, f"{number} is outside {low}..{high}")
    return number
