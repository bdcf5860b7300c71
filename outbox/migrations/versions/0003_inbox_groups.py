"""per-group state of the inbox: which groups the head-of-group pass must look at

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

The head pass read every unfinished inbox row of the consumer to find the groups whose head
waits with nothing running. ``<inbox>_groups`` holds one row per (consumer, serial group)
with ``needs_check``, set by the transactions that may leave such a head (see
``outbox/schema.py``), so the pass reads only those groups. Built here from the rows in line
or running at upgrade time: every such group is marked, so the first head pass after the
upgrade looks at each of them once (a waiting head left by the old version is found).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from outbox.config import DEFAULT_CONFIG

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# The states that can hold or wait in a group at upgrade time.
_UNFINISHED = ("ready", "waiting", "processing", "retry", "halted")


def _names() -> tuple[str, str]:
    cfg = op.get_context().config
    config = cfg.attributes.get("outbox_config", DEFAULT_CONFIG) if cfg else DEFAULT_CONFIG
    return config.inbox_table, f"{config.inbox_table}_groups"


def upgrade() -> None:
    inbox, groups = _names()
    binary = mysql.VARCHAR(255, collation="utf8mb4_bin")
    name = sa.String(255).with_variant(binary, "mysql", "mariadb")
    table = op.create_table(
        groups,
        sa.Column("consumer", name, primary_key=True),
        sa.Column("serial_group", name, primary_key=True),
        sa.Column("needs_check", sa.Boolean(), nullable=False),
    )
    op.create_index(f"ix_{groups}_check", groups, ["consumer", "needs_check", "serial_group"])
    source = sa.table(
        inbox,
        sa.column("consumer", sa.String()),
        sa.column("serial_group", sa.String()),
        sa.column("state", sa.String()),
    )
    marked = (
        sa.select(source.c.consumer, source.c.serial_group, sa.true())
        .where(source.c.serial_group.is_not(None), source.c.state.in_(_UNFINISHED))
        .distinct()
    )
    op.execute(sa.insert(table).from_select(["consumer", "serial_group", "needs_check"], marked))


def downgrade() -> None:
    _, groups = _names()
    op.drop_index(f"ix_{groups}_check", table_name=groups)
    op.drop_table(groups)
