"""``store()`` and ``store_many()``: write messages inside the caller's transaction.

They never commit, never flush the caller's ORM session and never open a connection of
their own: the message exists if and only if the caller's transaction commits (G1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Insert, Table
from sqlalchemy.orm import Session

from outbox import driver_path, queries, sequences, states, validation
from outbox.aio import is_async_bind
from outbox.clock import utcnow
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.dialect import Dialect, dialect_of
from outbox.errors import DuplicateEventError, ValidationError
from outbox.schema import schema_for
from outbox.serialization import DEFAULT_SERIALIZER, Serializer, serialize


@dataclass(frozen=True)
class Message:
    """One message for ``store_many()``; the fields mean what ``store()``'s arguments mean."""

    queue: str
    type: str
    payload: Any
    priority: int = 1
    serial_group: str | None = None
    key: str | None = None
    headers: Mapping[str, str] | None = None
    event_id: UUID | str | None = None
    delay: timedelta | float | None = None
    effect_key: str | None = None
    sequence_key: str | None = None
    sequence: int | None = None
    schema_version: str | None = None


def store(
    conn_or_session: Connection | Session,
    queue: str,
    type: str,
    payload: Any,
    *,
    priority: int = 1,
    serial_group: str | None = None,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    event_id: UUID | str | None = None,
    delay: timedelta | float | None = None,
    effect_key: str | None = None,
    sequence_key: str | None = None,
    sequence: int | None = None,
    schema_version: str | None = None,
    config: OutboxConfig = DEFAULT_CONFIG,
    serializer: Serializer = DEFAULT_SERIALIZER,
) -> UUID:
    """Store one message in the caller's transaction and return its ``event_id``.

    ``priority``: 1 = most urgent. ``serial_group``: at most one message of the group is
    processing at a time per consumer, in (priority, id) order. ``key``: publish-order and
    partition key, defaults to ``serial_group``. ``delay``: publish no earlier than now + delay.

    The message contract (each at most 255 characters, no surrounding whitespace):
    ``effect_key``: the effect that must happen at most once per consumer, whatever the
    event ids. ``sequence_key``: the object whose changes apply in order; ``sequence``: this
    change's number (1 .. 2**63-1). Without ``sequence``, the next number of the key is
    assigned in the caller's transaction, gap-free among committed messages: the key's
    counter row stays locked until the transaction ends, so producers of one key wait for
    each other (keep such transactions short; one transaction numbering several keys in
    different orders than another can deadlock) and a rollback gives the number back.
    ``schema_version``: the payload's schema, checked by the consumer's handler.

    Raises ``outbox.errors.ValidationError`` (naming the field) before writing anything, and
    ``DuplicateEventError`` when ``event_id`` exists; the transaction stays usable either way.
    """
    conn = _connection(conn_or_session)
    message = Message(
        queue,
        type,
        payload,
        priority=priority,
        serial_group=serial_group,
        key=key,
        headers=headers,
        event_id=event_id,
        delay=delay,
        effect_key=effect_key,
        sequence_key=sequence_key,
        sequence=sequence,
        schema_version=schema_version,
    )
    row = _row(message, config, serializer, utcnow())
    return _insert(conn, [row], config)[0]


def store_many(
    conn_or_session: Connection | Session,
    messages: Iterable[Message | Mapping[str, Any]],
    *,
    config: OutboxConfig = DEFAULT_CONFIG,
    serializer: Serializer = DEFAULT_SERIALIZER,
) -> list[UUID]:
    """Store several messages with one statement; all of them or none.

    Each item is a ``Message`` or a mapping with ``store()``'s argument names. A bad item
    raises ``ValidationError`` naming its index and field; nothing is written. Messages of
    one ``sequence_key`` without a ``sequence`` get consecutive numbers in their order.
    """
    conn = _connection(conn_or_session)
    now = utcnow()
    rows = []
    for index, item in enumerate(messages):
        message = _as_message(index, item)  # its errors already name the index
        try:
            rows.append(_row(message, config, serializer, now))
        except ValidationError as exc:
            raise exc.within(f"messages[{index}]") from exc
    if not rows:
        return []
    repeated = [e for e, n in Counter(r["event_id"] for r in rows).items() if n > 1]
    if repeated:
        raise DuplicateEventError(repeated)
    return _insert(conn, rows, config)


def _insert(conn: Connection, rows: list[dict[str, Any]], config: OutboxConfig) -> list[UUID]:
    event_ids: list[UUID] = [r["event_id"] for r in rows]
    schema = schema_for(config)
    dialect = dialect_of(conn)
    taken = sequences.number(conn, dialect, schema.outbox_sequences, rows)
    try:
        _insert_rows(conn, dialect, schema.outbox, rows, config)
    except DuplicateEventError:
        sequences.give_back(conn, schema.outbox_sequences, taken)
        raise
    return event_ids


def _insert_rows(
    conn: Connection,
    dialect: Dialect,
    table: Table,
    rows: list[dict[str, Any]],
    config: OutboxConfig,
) -> None:
    """Insert the rows; refuses them all (``DuplicateEventError``) if one event id exists."""
    event_ids: list[UUID] = [r["event_id"] for r in rows]
    if dialect.notifies:
        channel = config.notify_channel if config.notify else None
        if len(rows) == 1:
            found = _execute_one(conn, queries.insert_postgresql_one(table, channel), rows[0])
        else:
            parameters = {"rows": queries.as_recordset(rows)}
            found = conn.execute(queries.insert_postgresql(table, channel), parameters).all()
        inserted = {r[0] for r in found}
        duplicates = [e for e in event_ids if e not in inserted]
    elif dialect.returning:
        inserted = {r[0] for r in conn.execute(queries.insert_sqlite(table), rows)}
        duplicates = [e for e in event_ids if e not in inserted]
    else:
        rowcount = conn.execute(queries.insert_mysql(table), rows).rowcount
        inserted = set(event_ids)
        duplicates = []
        if rowcount != len(rows):
            existing = conn.execute(queries.existing_event_ids(table, event_ids)).scalars()
            duplicates = list(existing)
            inserted = set(event_ids) - set(duplicates)

    if duplicates:
        if inserted:
            conn.execute(queries.delete_events(table, list(inserted)))
        raise DuplicateEventError(duplicates)


def _execute_one(conn: Connection, statement: Insert, row: dict[str, Any]) -> Sequence[Any]:
    """The rows ``statement`` returns for the parameters ``row``.

    Through SQLAlchemy's ``Connection.execute`` this costs about as much Python as the
    round trip itself (bench/store.py); where nothing needs that machinery, the statement
    compiled once (``queries.driver_statement``) goes straight to the driver's cursor.
    """
    if not driver_path.usable(conn):
        return conn.execute(statement, row).all()
    compiled = queries.driver_statement(statement, conn.dialect)
    parameters = {**row, **compiled.fixed}
    for name, process in compiled.processors:
        parameters[name] = process(parameters[name])
    return driver_path.execute(conn, compiled.sql, parameters)


def _connection(conn_or_session: Connection | Session) -> Connection:
    if isinstance(conn_or_session, Session):
        # Session.connection() joins (or autobegins) the session's transaction without a flush.
        return conn_or_session.connection()
    if isinstance(conn_or_session, Connection):
        return conn_or_session
    if is_async_bind(conn_or_session):
        raise TypeError(
            f"conn_or_session: got an asyncio {type(conn_or_session).__name__}; use "
            "await outbox.store_async() / store_many_async() with it"
        )
    raise TypeError(
        "conn_or_session: expected a SQLAlchemy Session or Connection, got "
        f"{type(conn_or_session).__name__}"
    )


def _row(
    message: Message, config: OutboxConfig, serializer: Serializer, now: datetime
) -> dict[str, Any]:
    """Validate one message and turn it into an outbox row; raises before any write."""
    queue = validation.check_queue(message.queue)
    message_type = validation.check_type(message.type)
    priority = validation.check_priority(message.priority, config)
    group = validation.check_optional_name(
        "serial_group", message.serial_group, config.max_serial_group_length
    )
    key = validation.check_optional_name("key", message.key, validation.MAX_NAME_LENGTH)
    headers = validation.check_headers(message.headers)
    event_id = validation.check_event_id(message.event_id)
    available_at = validation.check_delay(message.delay, now)
    effect_key = validation.check_contract_name("effect_key", message.effect_key)
    sequence_key = validation.check_contract_name("sequence_key", message.sequence_key)
    sequence = validation.check_sequence(message.sequence, sequence_key)
    schema_version = validation.check_contract_name("schema_version", message.schema_version)
    payload = serialize("payload", message.payload, serializer)
    validation.check_payload_size(payload, config)
    return {
        "event_id": event_id,
        "queue": queue,
        "priority": priority,
        "serial_group": group,
        "key": key if key is not None else group,
        "type": message_type,
        "payload": payload,
        "headers": serialize("headers", headers, serializer) if headers else "{}",
        "occurred_at": now,
        "available_at": available_at,
        "status": states.PENDING,
        "attempts": 0,
        "effect_key": effect_key,
        "sequence_key": sequence_key,
        # None until ``sequences.number`` assigns the key's next number.
        "sequence": sequence,
        "schema_version": schema_version,
    }


_FIELDS = frozenset(Message.__dataclass_fields__)


def _as_message(index: int, item: Message | Mapping[str, Any]) -> Message:
    if isinstance(item, Message):
        return item
    if not isinstance(item, Mapping):
        raise ValidationError(f"messages[{index}]", "must be an outbox.Message or a mapping")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise ValidationError(f"messages[{index}]", f"unknown field(s): {', '.join(unknown)}")
    missing = sorted({"queue", "type", "payload"} - set(item))
    if missing:
        raise ValidationError(f"messages[{index}]", f"missing field(s): {', '.join(missing)}")
    return Message(**item)
