"""The SQL that moves messages into the inbox: ingest (one statement per batch, a duplicate
``(event_id, consumer)`` bumps ``duplicates`` instead of raising: ``ON CONFLICT DO UPDATE`` on
PostgreSQL and SQLite, ``ON DUPLICATE KEY UPDATE`` on MariaDB/MySQL; on PostgreSQL the rows
travel as one JSON array, ``ingest_recordset``) and the database source's take of committed
outbox rows (on PostgreSQL the whole take in one statement, ``take_into_inbox``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    SmallInteger,
    String,
    Table,
    Update,
    any_,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import mysql, postgresql

from inbox.sql.predicates import FIRST_PARTS, point_ranges, point_values
from outbox import states
from outbox.dialect import Dialect
from outbox.queries import message_columns, per_row, recordset_columns
from outbox.wire import H_KEY

# How the reason of a type without a handler starts (``inbox.ingest.unknown_type_reason``).
UNKNOWN_TYPE = "unknown message type "

# --- ingest ---------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def ingest_returning(dialect: Dialect, table: Table) -> Any:
    """PostgreSQL / SQLite: insert; a duplicate bumps ``duplicates`` instead of raising.
    Executed with the list of rows (SQLAlchemy's "insertmanyvalues": one compiled statement,
    many rows per round trip).

    RETURNING ``duplicates``: 0 for a row inserted now, >= 1 for a duplicate.
    """
    stmt = dialect.upsert(table, ["event_id", "consumer"], {"duplicates": table.c.duplicates + 1})
    return stmt.returning(table.c.event_id, table.c.duplicates)


# The inbox columns an ingest writes (``InboxIngest._row``'s keys); their types where a JSON
# record's text is not the column's own (``ingest_recordset``).
INGESTED_COLUMNS = (
    "event_id", "consumer", "queue", "priority", "serial_group", "seq", "type", "payload",
    "headers", "state", "attempts", "available_at", "last_error", "occurred_at",
    "received_at", "finished_at", "effect_key", "sequence_key", "sequence", "schema_version",
)  # fmt: skip
_RECORD_TYPES: dict[str, Any] = {
    "event_id": postgresql.UUID(as_uuid=True),
    "priority": SmallInteger(),
    "seq": BigInteger(),
    "attempts": Integer(),
    "sequence": BigInteger(),
    "available_at": postgresql.TIMESTAMP(timezone=True),
    "occurred_at": postgresql.TIMESTAMP(timezone=True),
    "received_at": postgresql.TIMESTAMP(timezone=True),
    "finished_at": postgresql.TIMESTAMP(timezone=True),
}


@lru_cache(maxsize=64)
def ingest_recordset(table: Table) -> Any:
    """PostgreSQL: ``ingest_returning`` with the rows as ONE JSON array parameter (``rows``,
    ``as_recordset``) read by ``jsonb_to_recordset``, as ``store_many`` inserts: one
    parameter whatever the batch, where the multi-row ``VALUES`` of ``ingest_returning``
    sends twenty per row, converted again by the driver on every call."""
    values = recordset_columns(INGESTED_COLUMNS, _RECORD_TYPES)
    t = table.c
    return (
        postgresql.insert(table)
        .from_select(list(INGESTED_COLUMNS), select(*values))
        .on_conflict_do_update(
            index_elements=["event_id", "consumer"], set_={"duplicates": t.duplicates + 1}
        )
        .returning(t.event_id, t.duplicates)
    )


def as_recordset(rows: Sequence[dict[str, Any]]) -> str:
    """Inbox rows -> the JSON array ``ingest_recordset`` reads (a parameter value, never
    SQL). The documents are already JSON text: they travel as strings, cast by the server."""
    records = []
    for row in rows:
        record = dict(row)
        record["event_id"] = str(record["event_id"])
        for name in ("available_at", "occurred_at", "received_at", "finished_at"):
            moment = record[name]
            if moment is not None:
                if moment.tzinfo is None:  # as ``UTCDateTime`` refuses it on the other path
                    raise ValueError(f"{name}: naive datetime {moment!r}: pass an aware one")
                record[name] = moment.isoformat()
        records.append(record)
    return json.dumps(records, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=64)
def ingest_mysql(table: Table) -> Any:
    """MariaDB/MySQL, executed with the list of rows: rowcount = inserted + 2 x duplicates
    (the duplicate's counter changes)."""
    # A constant, not a parameter: PyMySQL's executemany takes no parameter after VALUES.
    one = literal_column("1", Integer())
    return mysql.insert(table).on_duplicate_key_update(duplicates=table.c.duplicates + one)


# --- database source ------------------------------------------------------------------------


@lru_cache(maxsize=64)
def pending_outbox(
    outbox: Table, dialect: Dialect, shape: tuple[bool, ...] = (), rest: bool = False
) -> Select[Any]:
    """Committed due pending rows of our queues, most urgent first, locked for us; with a
    ``shape`` (``predicates.point_shape``) read from positions (``inbox.positions``) rather
    than from the head of ``ix_outbox_relay``'s pending range: the first parts, or with
    ``rest`` the others (``predicates.point_ranges``). Built once per shape: building it
    costs more than running it. Parameters: ``pending_parameters``."""
    o = outbox.c
    limit = bindparam("limit", type_=Integer)
    parts = point_ranges(o.priority, o.id, shape, dialect.family == "postgresql")
    branches = [
        # SQLite: BEGIN IMMEDIATE already made us the only writer.
        dialect.skip_locked(
            select(*message_columns(outbox))
            .where(
                o.status == states.PENDING,
                o.queue.in_(bindparam("queues", expanding=True)),
                o.available_at <= bindparam("now"),
                part,
            )
            .order_by(o.priority, o.id)
            .limit(limit)
        )
        for part in (parts[FIRST_PARTS:] if rest else parts[:FIRST_PARTS])
    ]
    if not shape:
        return branches[0]
    subqueries = [select(b.subquery(f"part_{i}")) for i, b in enumerate(branches)]
    merged = union_all(*subqueries).subquery("pending")
    m = merged.c
    return select(merged).order_by(m.priority, m.id).limit(limit)


def pending_parameters(
    queues: Sequence[str], now: datetime, limit: int, points: Sequence[tuple[int, int]] = ()
) -> dict[str, Any]:
    """The parameters of ``pending_outbox`` read from ``points``."""
    return {"queues": list(queues), "now": now, "limit": limit, **point_values(points)}


def mark_outbox_sent(outbox: Table, ids: Sequence[int], now: datetime) -> Update:
    o = outbox.c
    return (
        update(outbox)
        .where(o.id.in_(list(ids)), per_row(o.status) == states.PENDING)
        .values(status=states.SENT, sent_at=now)
    )


# --- database source, in one statement (PostgreSQL) -----------------------------------------


@lru_cache(maxsize=16)
def take_into_inbox(outbox: Table, inbox: Table, sequences: Table) -> Select[Any]:
    """The database source's whole take as ONE statement run by the server (PostgreSQL's
    data-modifying CTEs): lock the due pending rows of our queues (``pending_outbox`` read
    from the head), insert them into the inbox as ``InboxIngest.within`` would (a duplicate
    ``(event_id, consumer)`` bumps ``duplicates``; a type without a handler is stored
    ``failed`` with the reason; each sequence key's counter created at 0), mark them sent,
    and wake the consumer's workers when anything was inserted. No row travels to the worker
    and back: the Python path's fetch, per-row dicts and multi-row ``VALUES`` (one parameter
    per column and row, parsed again on every call) were most of the take's cost.

    One row back: ``taken``, ``inserted``, ``duplicates``, ``failed`` (as ``IngestResult``).
    Parameters (``take_parameters``): queues, now, limit, consumer, types (the consumer's
    handled types), unknown (the text after the type in the reason of a failed row),
    channel and wake (the NOTIFY)."""
    o = outbox.c
    now = bindparam("now", type_=o.available_at.type)
    queues = bindparam("queues", type_=postgresql.ARRAY(String()))
    types = bindparam("types", type_=postgresql.ARRAY(String()))
    consumer = bindparam("consumer", type_=String())
    taken = (
        select(*message_columns(outbox))
        .where(
            o.status == states.PENDING,
            o.queue == any_(queues),
            o.available_at <= now,
        )
        .order_by(o.priority, o.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("taken")
    )
    t = taken.c
    sent = (
        update(outbox)
        .where(o.id == t.id)
        .values(status=states.SENT, sent_at=now)
        .returning(o.id)
        .cte("sent")
    )
    handled = t.type == any_(types)
    # ``InboxIngest._row``: the producer's key travels in the headers; ``||`` keeps the
    # right-hand value, as the Python path's ``headers[H_KEY] = key`` does.
    headers = case(
        (t.key.is_(None), t.headers),
        else_=t.headers.op("||", return_type=postgresql.JSONB())(
            func.jsonb_build_object(literal(H_KEY, String()), t.key)
        ),
    )
    # ``inbox.ingest.unknown_type_reason``'s text: the type quoted as an SQL literal.
    reason = (
        bindparam("unknown_type", type_=String())
        + func.replace(t.type, literal("'", String()), literal("''", String()))
        + literal("'", String())
        + bindparam("unknown", type_=String())
    )
    rows = select(
        t.event_id,
        consumer,
        t.queue,
        t.priority,
        t.serial_group,
        t.id,
        t.type,
        t.payload,
        headers,
        case((handled, literal(states.READY, String())), else_=literal(states.FAILED, String())),
        literal(0, Integer()),
        now,
        case((handled, null()), else_=reason),
        t.occurred_at,
        now,
        case((handled, null()), else_=now),
        t.effect_key,
        t.sequence_key,
        t.sequence,
        t.schema_version,
    ).order_by(t.priority, t.id)
    i = inbox.c
    insert = postgresql.insert(inbox).from_select(list(INGESTED_COLUMNS), rows)
    ingested = (
        insert.on_conflict_do_update(
            index_elements=["event_id", "consumer"], set_={"duplicates": i.duplicates + 1}
        )
        .returning(i.duplicates)
        .cte("ingested")
    )
    # In key order, as ``sequence_rows``: two takes creating the same keys wait for each
    # other in one order, never in a cycle.
    keys = (
        select(consumer, t.sequence_key, literal(0, BigInteger()))
        .where(t.sequence_key.is_not(None))
        .distinct()
        .order_by(t.sequence_key)
    )
    s = sequences.c
    counters = (
        postgresql.insert(sequences)
        .from_select(["consumer", "sequence_key", "last"], keys)
        .on_conflict_do_nothing(index_elements=["consumer", "sequence_key"])
        .returning(s.sequence_key)
        .cte("counters")
    )
    g = ingested.c
    inserted = func.count().filter(g.duplicates == 0)
    failed = select(func.count()).select_from(taken).where(~handled).scalar_subquery()
    wake = func.pg_notify(bindparam("channel", type_=String()), bindparam("wake", type_=String()))
    woken = select(wake).select_from(ingested).where(g.duplicates == 0).limit(1).cte("woken")
    return (
        select(
            select(func.count()).select_from(sent).scalar_subquery().label("taken"),
            inserted.label("inserted"),
            func.count().filter(g.duplicates > 0).label("duplicates"),
            failed.label("failed"),
            select(func.count()).select_from(woken).scalar_subquery().label("woken"),
        )
        .select_from(ingested)
        .add_cte(counters)
    )


def take_parameters(
    queues: Sequence[str],
    now: datetime,
    limit: int,
    consumer: str,
    types: Iterable[str],
    unknown: str,
    channel: str,
    wake: str,
) -> dict[str, Any]:
    """The parameters of ``take_into_inbox``."""
    return {
        "queues": list(queues),
        "now": now,
        "limit": limit,
        "consumer": consumer,
        "types": sorted(types),
        "unknown_type": UNKNOWN_TYPE + "'",
        "unknown": unknown,
        "channel": channel,
        "wake": wake,
    }
