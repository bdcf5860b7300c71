"""The ``outbox`` and ``inbox`` tables, declared once.

``outbox.metadata`` holds them under their default names so users can add them to their own
Alembic history; ``schema_for(config)`` builds them under configured names. Migrations in
``outbox/migrations/`` must produce exactly this (a test compares them on every dialect).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects import mysql

from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.types import JSONDocument, UTCDateTime

# SQLite only auto-increments an INTEGER PRIMARY KEY; BIGINT elsewhere.
Id = BigInteger().with_variant(Integer(), "sqlite")
NAME_LENGTH = 255
# Queue, group, key, type, consumer: compared byte for byte. MariaDB/MySQL's default collation
# is case- and accent-insensitive: consumers "Billing" and "billing" would share one dedupe
# key, queues "Orders" and "orders" one fetch. (utf8mb4_bin still pads: "a" = "a ".)
BINARY_COLLATION = "utf8mb4_bin"
Name = String(NAME_LENGTH).with_variant(
    mysql.VARCHAR(NAME_LENGTH, collation=BINARY_COLLATION), "mysql", "mariadb"
)


@dataclass(frozen=True)
class Schema:
    metadata: MetaData
    outbox: Table
    inbox: Table
    audit: Table
    groups: Table
    outbox_sequences: Table
    inbox_sequences: Table
    effects: Table


def _outbox_table(metadata: MetaData, name: str) -> Table:
    return Table(
        name,
        metadata,
        # The id is the order: (priority, id) inside a group, id inside a key.
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("event_id", Uuid(), nullable=False),
        Column("queue", Name, nullable=False),
        Column("priority", SmallInteger(), nullable=False),
        Column("serial_group", Name, nullable=True),
        Column("key", Name, nullable=True),
        Column("type", Name, nullable=False),
        Column("payload", JSONDocument(), nullable=False),
        Column("headers", JSONDocument(), nullable=False),
        Column("occurred_at", UTCDateTime(), nullable=False),
        Column("available_at", UTCDateTime(), nullable=False),
        Column("status", String(16), nullable=False, server_default=text("'pending'")),
        Column("attempts", Integer(), nullable=False, server_default=text("0")),
        Column("last_error", Text(), nullable=True),
        Column("sent_at", UTCDateTime(), nullable=True),
        # MariaDB/MySQL only: how many stores were refused as duplicates. The no-op
        # ON DUPLICATE KEY UPDATE must change something, or the rowcount cannot tell a
        # duplicate from an insert under CLIENT_FOUND_ROWS (SQLAlchemy's default).
        Column("store_conflicts", Integer(), nullable=False, server_default=text("0")),
        # The message contract (docs/contract.md): the effect that must happen once, the
        # object whose changes are ordered and this change's number, the payload's schema.
        Column("effect_key", Name, nullable=True),
        Column("sequence_key", Name, nullable=True),
        Column("sequence", BigInteger(), nullable=True),
        Column("schema_version", Name, nullable=True),
        UniqueConstraint("event_id", name=f"uq_{name}_event_id"),
        # Relay fetch: due pending rows, most urgent first, then id.
        Index(f"ix_{name}_relay", "status", "priority", "id"),
        # Group predecessors (job-queue deployment): status before (priority, id) so the
        # "undelivered row ahead of me?" probe reads pending rows, not the group's history.
        Index(f"ix_{name}_group", "queue", "serial_group", "status", "priority", "id"),
        # Per-key publish order: an earlier unsent row of the same key holds later ones back.
        # status before id: the relay's "earlier pending row of this key?" probe is then one
        # index seek, however many sent rows the key has accumulated.
        Index(f"ix_{name}_key", "queue", "priority", "key", "status", "id"),
    )


def _inbox_table(metadata: MetaData, name: str) -> Table:
    return Table(
        name,
        metadata,
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("event_id", Uuid(), nullable=False),
        Column("consumer", Name, nullable=False),
        Column("queue", Name, nullable=False),
        Column("priority", SmallInteger(), nullable=False),
        Column("serial_group", Name, nullable=True),
        # The producer's outbox id: the order inside a group (with priority).
        Column("seq", BigInteger(), nullable=False),
        Column("type", Name, nullable=False),
        Column("payload", JSONDocument(), nullable=True),
        Column("headers", JSONDocument(), nullable=False),
        Column("state", String(16), nullable=False),
        Column("attempts", Integer(), nullable=False, server_default=text("0")),
        # Duplicate deliveries absorbed for this (event_id, consumer).
        Column("duplicates", Integer(), nullable=False, server_default=text("0")),
        Column("claim_token", Uuid(), nullable=True),
        Column("claimed_at", UTCDateTime(), nullable=True),
        Column("lease_until", UTCDateTime(), nullable=True),
        Column("available_at", UTCDateTime(), nullable=False),
        Column("last_error", Text(), nullable=True),
        Column("occurred_at", UTCDateTime(), nullable=True),
        Column("received_at", UTCDateTime(), nullable=False),
        Column("finished_at", UTCDateTime(), nullable=True),
        # The message contract, as the producer stored it (docs/contract.md).
        Column("effect_key", Name, nullable=True),
        Column("sequence_key", Name, nullable=True),
        Column("sequence", BigInteger(), nullable=True),
        Column("schema_version", Name, nullable=True),
        # Why a message left the automatic path (review, unknown, stale, a duplicate effect):
        # one of inbox.contract.REASONS; and the check an operator must make before resolving.
        Column("reason", String(32), nullable=True),
        Column("next_check", Text(), nullable=True),
        UniqueConstraint("event_id", "consumer", name=f"uq_{name}_event_consumer"),
        # Claim: a consumer's ready rows by (priority, seq).
        Index(f"ix_{name}_claim", "consumer", "state", "priority", "seq"),
        # Blockers and head of group: state before (priority, seq) so a group's lookups read its
        # unfinished rows only, never its finished history.
        Index(f"ix_{name}_group", "consumer", "serial_group", "state", "priority", "seq"),
        # Retention (prune) and finished-work gauges.
        Index(f"ix_{name}_finished", "state", "finished_at"),
        # A sequence key's rows by number: the successor freed by an applied change, the
        # predecessor a gap waits for. Partial where the database can (rows without a key
        # are not in it): every claim and finish updates an inbox row's indexed state, and a
        # fifth full index made grouped claims a third slower (bench.consumer_engine).
        Index(
            f"ix_{name}_sequence",
            "consumer",
            "sequence_key",
            "sequence",
            postgresql_where=text("sequence_key IS NOT NULL"),
            sqlite_where=text("sequence_key IS NOT NULL"),
        ),
    )


def _groups_table(metadata: MetaData, name: str) -> Table:
    """One row per (consumer, serial group) the inbox has seen: does the head-of-group pass
    need to look at this group? Set (written blind, never read first) by every transaction
    that may leave the group's head waiting with nothing running: a finish, a claim that
    set rows waiting, an unblock. Cleared by the head pass, before it reads the group's rows.
    The pass then reads only the groups that changed, however many rows are in line."""
    return Table(
        name,
        metadata,
        Column("consumer", Name, primary_key=True),
        Column("serial_group", Name, primary_key=True),
        Column("needs_check", Boolean(), nullable=False),
        # serial_group last: the pass reads marked groups in name order, 500 at a time.
        Index(f"ix_{name}_check", "consumer", "needs_check", "serial_group"),
    )


def _outbox_sequences_table(metadata: MetaData, name: str) -> Table:
    """The producer's counter per sequence key: ``store(sequence_key=...)`` without a number
    takes ``last + 1`` and keeps the row locked until the caller's transaction ends, so the
    committed numbers of a key have no gap and no duplicate (a rollback gives its number back).
    """
    return Table(
        name,
        metadata,
        Column("sequence_key", Name, primary_key=True),
        Column("last", BigInteger(), nullable=False),
    )


def _inbox_sequences_table(metadata: MetaData, name: str) -> Table:
    """The last number applied per (consumer, sequence key), advanced in the handler's own
    transaction by a conditional UPDATE (``last = n - 1``): two runs of one number cannot both
    commit. Created at 0 when the key's first message is received."""
    return Table(
        name,
        metadata,
        Column("consumer", Name, primary_key=True),
        Column("sequence_key", Name, primary_key=True),
        Column("last", BigInteger(), nullable=False, server_default=text("0")),
    )


def _effects_table(metadata: MetaData, name: str) -> Table:
    """The effect ledger: one row per (consumer, effect key) whose effect committed, inserted
    in the handler's transaction before the handler runs. A second message with that key (any
    event id) finds it and is acknowledged without running; two at once: the second insert
    waits for the first transaction and then finds the row."""
    return Table(
        name,
        metadata,
        Column("consumer", Name, primary_key=True),
        Column("effect_key", Name, primary_key=True),
        Column("event_id", Uuid(), nullable=False),
        Column("applied_at", UTCDateTime(), nullable=False),
    )


def _audit_table(metadata: MetaData, name: str) -> Table:
    """Who did what to which rows, and why: written by ``outbox retry`` and the other operator
    commands that change rows by hand. Never written by the relay or the worker."""
    return Table(
        name,
        metadata,
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("at", UTCDateTime(), nullable=False),
        Column("actor", Name, nullable=False),
        Column("action", String(32), nullable=False),
        Column("target", String(16), nullable=False),
        Column("reason", Text(), nullable=False),
        Column("row_count", Integer(), nullable=False),
        # The ids touched, as a JSON list.
        Column("row_ids", JSONDocument(), nullable=False),
        Index(f"ix_{name}_at", "at"),
    )


@lru_cache(maxsize=16)
def _build(outbox_name: str, inbox_name: str) -> Schema:
    metadata = MetaData()
    return Schema(
        metadata,
        _outbox_table(metadata, outbox_name),
        _inbox_table(metadata, inbox_name),
        _audit_table(metadata, f"{outbox_name}_audit"),
        _groups_table(metadata, f"{inbox_name}_groups"),
        _outbox_sequences_table(metadata, f"{outbox_name}_sequences"),
        _inbox_sequences_table(metadata, f"{inbox_name}_sequences"),
        _effects_table(metadata, f"{inbox_name}_effects"),
    )


def schema_for(config: OutboxConfig = DEFAULT_CONFIG) -> Schema:
    return _build(config.outbox_table, config.inbox_table)


_default = schema_for(DEFAULT_CONFIG)
metadata = _default.metadata
outbox_table = _default.outbox
inbox_table = _default.inbox
audit_table = _default.audit
groups_table = _default.groups
outbox_sequences_table = _default.outbox_sequences
inbox_sequences_table = _default.inbox_sequences
effects_table = _default.effects
