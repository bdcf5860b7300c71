"""outbox and inbox tables

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written by hand, frozen: later schema changes get their own revision. Table names come from
the OutboxConfig that ``outbox migrate`` passes in.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.config import DEFAULT_CONFIG
from outbox.types import JSONDocument, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _names() -> tuple[str, str]:
    cfg = op.get_context().config
    outbox_config = cfg.attributes.get("outbox_config", DEFAULT_CONFIG) if cfg else DEFAULT_CONFIG
    return outbox_config.outbox_table, outbox_config.inbox_table


def upgrade() -> None:
    outbox, inbox = _names()
    op.create_table(
        outbox,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("serial_group", sa.String(255), nullable=True),
        sa.Column("key", sa.String(255), nullable=True),
        sa.Column("type", sa.String(255), nullable=False),
        sa.Column("payload", JSONDocument(), nullable=False),
        sa.Column("headers", JSONDocument(), nullable=False),
        sa.Column("occurred_at", UTCDateTime(), nullable=False),
        sa.Column("available_at", UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.Column("store_conflicts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.UniqueConstraint("event_id", name=f"uq_{outbox}_event_id"),
    )
    op.create_index(f"ix_{outbox}_relay", outbox, ["status", "priority", "id"])
    op.create_index(
        f"ix_{outbox}_group", outbox, ["queue", "serial_group", "status", "priority", "id"]
    )
    op.create_index(f"ix_{outbox}_key", outbox, ["queue", "priority", "key", "status", "id"])

    op.create_table(
        inbox,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("consumer", sa.String(255), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("serial_group", sa.String(255), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(255), nullable=False),
        sa.Column("payload", JSONDocument(), nullable=True),
        sa.Column("headers", JSONDocument(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("duplicates", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("claim_token", sa.Uuid(), nullable=True),
        sa.Column("claimed_at", UTCDateTime(), nullable=True),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.Column("available_at", UTCDateTime(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("occurred_at", UTCDateTime(), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("event_id", "consumer", name=f"uq_{inbox}_event_consumer"),
    )
    op.create_index(f"ix_{inbox}_claim", inbox, ["consumer", "state", "priority", "seq"])
    op.create_index(
        f"ix_{inbox}_group", inbox, ["consumer", "serial_group", "state", "priority", "seq"]
    )
    op.create_index(f"ix_{inbox}_finished", inbox, ["state", "finished_at"])

    audit = f"{outbox}_audit"
    op.create_table(
        audit,
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("row_ids", JSONDocument(), nullable=False),
    )
    op.create_index(f"ix_{audit}_at", audit, ["at"])


def downgrade() -> None:
    outbox, inbox = _names()
    op.drop_table(f"{outbox}_audit")
    op.drop_table(inbox)
    op.drop_table(outbox)
