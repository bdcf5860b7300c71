"""names compared byte for byte on MariaDB/MySQL

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

MariaDB's default collation (utf8mb4_general_ci) is case- and accent-insensitive: consumers
"Billing" and "billing" shared one dedupe key (the second never ran its effect), queues and
groups differing in case were mixed. The name columns become utf8mb4_bin. Other databases
already compare bytes: nothing to do there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from outbox.config import DEFAULT_CONFIG

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (column, nullable) per table
_OUTBOX = (("queue", False), ("serial_group", True), ("key", True), ("type", False))
_INBOX = (("consumer", False), ("queue", False), ("serial_group", True), ("type", False))
_AUDIT = (("actor", False),)


def _tables() -> list[tuple[str, tuple[tuple[str, bool], ...]]]:
    cfg = op.get_context().config
    config = cfg.attributes.get("outbox_config", DEFAULT_CONFIG) if cfg else DEFAULT_CONFIG
    outbox, inbox = config.outbox_table, config.inbox_table
    return [(outbox, _OUTBOX), (inbox, _INBOX), (f"{outbox}_audit", _AUDIT)]


def _collate(collation: str | None) -> None:
    if op.get_context().dialect.name not in ("mysql", "mariadb"):
        return
    for table, columns in _tables():
        for column, nullable in columns:
            op.alter_column(
                table,
                column,
                type_=mysql.VARCHAR(255, collation=collation),
                existing_type=sa.String(255),
                nullable=nullable,
            )


def upgrade() -> None:
    _collate("utf8mb4_bin")


def downgrade() -> None:
    _collate(None)
