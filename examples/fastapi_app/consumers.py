"""The worker side: the ``order-mailer`` consumer and its ``async def`` handler.

    outbox worker examples.fastapi_app.consumers:consumer --dsn postgresql://...

The handler is awaited on the worker's event loop; its ``AsyncSession`` is the transaction
that marks the message done, so the ``sent_mails`` row commits with it, exactly once per
message (and once per order: the producer's ``effect_key``).
"""

from __future__ import annotations

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from examples.fastapi_app.app import ORDER_CREATED, QUEUE
from examples.fastapi_app.tables import sent_mails
from inbox import Consumer, InboxMessage

consumer = Consumer("order-mailer", queues=[QUEUE])


@consumer.handler(ORDER_CREATED)
async def order_created(session: AsyncSession, message: InboxMessage) -> None:
    """Send the confirmation mail (here: record it) for a new order."""
    order = message.payload
    # A real mailer would await its provider's API here, with the effect key as the
    # provider's idempotency key; the record below commits with the inbox's done mark.
    await session.execute(
        insert(sent_mails).values(
            order_id=order["order_id"],
            event_id=message.event_id,
            recipient=order["customer"],
            subject=f"Order {order['order_id']} received",
        )
    )
