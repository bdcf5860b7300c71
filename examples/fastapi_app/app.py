"""The web side: POST /orders stores the order and its ``order.created`` event in one
asyncio transaction, so the event exists if and only if the order does.

    app = create_app("postgresql://user:pass@host/db")
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated
from uuid import UUID

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import async_sessionmaker

import outbox
from examples.fastapi_app.tables import create_tables, orders
from outbox.aio import make_async_engine

QUEUE = "orders"
ORDER_CREATED = "order.created"


class NewOrder(BaseModel):
    """The request body; anything else (a missing field, a string amount, an unknown key)
    is a 422 that names the field, before any database work."""

    model_config = ConfigDict(extra="forbid")

    customer: Annotated[str, Field(min_length=1, max_length=200)]
    amount_cents: Annotated[StrictInt, Field(gt=0, le=100_000_000)]


class CreatedOrder(BaseModel):
    order_id: int
    event_id: UUID


class OrderFailed(Exception):
    """Raised inside the order's transaction after the insert and the store: it shows that
    the rollback takes the event with the order (answered 500)."""


def create_app(dsn: str) -> FastAPI:
    """The app on the database ``dsn`` (any outbox-relay DSN; it must be migrated with
    ``outbox migrate``). Its startup creates the example's tables; its shutdown closes the
    engine's connections."""
    engine = make_async_engine(dsn)
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(create_tables)
        yield
        await engine.dispose()

    app = FastAPI(title="outbox-relay FastAPI example", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(OrderFailed)
    async def order_failed(request: Request, exc: OrderFailed) -> JSONResponse:
        return JSONResponse(status_code=500, content={"detail": str(exc)})

    @app.post("/orders", status_code=201)
    async def create_order(
        order: NewOrder,
        fail_after_store: Annotated[bool, Query()] = False,
    ) -> CreatedOrder:
        async with sessions() as session, session.begin():
            result = await session.execute(
                insert(orders)
                .values(customer=order.customer, amount_cents=order.amount_cents)
                .returning(orders.c.id)
            )
            order_id = int(result.scalar_one())
            # Joins the session's transaction and never commits: the block's end does.
            event_id = await outbox.store_async(
                session,
                QUEUE,
                ORDER_CREATED,
                {
                    "order_id": order_id,
                    "customer": order.customer,
                    "amount_cents": order.amount_cents,
                },
                effect_key=f"order:{order_id}",
            )
            if fail_after_store:
                raise OrderFailed(
                    f"failed after storing order {order_id} and event {event_id}: "
                    "both were rolled back"
                )
        return CreatedOrder(order_id=order_id, event_id=event_id)

    return app
