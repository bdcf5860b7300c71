"""The example's own tables, beside (never inside) outbox-relay's migrated ones."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Uuid,
)

metadata = MetaData()

orders = Table(
    "orders",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("customer", String(200), nullable=False),
    Column("amount_cents", BigInteger(), nullable=False),
)

# What the mailer did: one row per mail, written in the handler's transaction, so it commits
# together with the inbox row that marks the message done (or not at all).
sent_mails = Table(
    "sent_mails",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("order_id", BigInteger(), ForeignKey("orders.id"), nullable=False),
    Column("event_id", Uuid(), nullable=False),
    Column("recipient", String(200), nullable=False),
    Column("subject", String(200), nullable=False),
)


def create_tables(bind: Engine | Connection) -> None:
    """Create ``orders`` and ``sent_mails`` where they do not exist yet. An ``AsyncEngine``
    runs it as ``await conn.run_sync(create_tables)``. The outbox and inbox tables come
    from ``outbox migrate``, not from here."""
    metadata.create_all(bind)
