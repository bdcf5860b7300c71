"""the message contract: effect keys, sequence keys and numbers, schema versions, review

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

New nullable columns on the outbox (``effect_key``, ``sequence_key``, ``sequence``,
``schema_version``) and the inbox (the same four, plus ``reason`` and ``next_check`` of the
manual route), an index of the inbox by (consumer, sequence key, number) (partial on
PostgreSQL and SQLite: only rows with a key), and three tables:
the producer's counter per sequence key, the consumer's last applied number per key, and
the effect ledger. Rows in flight at upgrade time keep their state: every new column is
NULL for them, which is a message without the contract (what they were).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from outbox.config import DEFAULT_CONFIG
from outbox.types import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_CONTRACT = ("effect_key", "sequence_key", "sequence", "schema_version")


def _names() -> tuple[str, str]:
    cfg = op.get_context().config
    config = cfg.attributes.get("outbox_config", DEFAULT_CONFIG) if cfg else DEFAULT_CONFIG
    return config.outbox_table, config.inbox_table


def _name() -> sa.types.TypeEngine[str]:
    binary = mysql.VARCHAR(255, collation="utf8mb4_bin")
    return sa.String(255).with_variant(binary, "mysql", "mariadb")


def _contract_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("effect_key", _name(), nullable=True),
        sa.Column("sequence_key", _name(), nullable=True),
        sa.Column("sequence", sa.BigInteger(), nullable=True),
        sa.Column("schema_version", _name(), nullable=True),
    ]


def upgrade() -> None:
    outbox, inbox = _names()
    for column in _contract_columns():
        op.add_column(outbox, column)
    for column in _contract_columns():
        op.add_column(inbox, column)
    op.add_column(inbox, sa.Column("reason", sa.String(32), nullable=True))
    op.add_column(inbox, sa.Column("next_check", sa.Text(), nullable=True))
    keyed = sa.text("sequence_key IS NOT NULL")  # partial where the database can
    op.create_index(
        f"ix_{inbox}_sequence",
        inbox,
        ["consumer", "sequence_key", "sequence"],
        postgresql_where=keyed,
        sqlite_where=keyed,
    )
    op.create_table(
        f"{outbox}_sequences",
        sa.Column("sequence_key", _name(), primary_key=True),
        sa.Column("last", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        f"{inbox}_sequences",
        sa.Column("consumer", _name(), primary_key=True),
        sa.Column("sequence_key", _name(), primary_key=True),
        sa.Column("last", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        f"{inbox}_effects",
        sa.Column("consumer", _name(), primary_key=True),
        sa.Column("effect_key", _name(), primary_key=True),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("applied_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    outbox, inbox = _names()
    op.drop_table(f"{inbox}_effects")
    op.drop_table(f"{inbox}_sequences")
    op.drop_table(f"{outbox}_sequences")
    op.drop_index(f"ix_{inbox}_sequence", table_name=inbox)
    for column in ("next_check", "reason", *reversed(_CONTRACT)):
        op.drop_column(inbox, column)
    for column in reversed(_CONTRACT):
        op.drop_column(outbox, column)
