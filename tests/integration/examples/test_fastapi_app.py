"""examples/fastapi_app against PostgreSQL: an order and its message commit together or not
at all (one AsyncSession transaction around store_async), and a worker process runs the
consumer's async handler once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from examples.fastapi_app.app import create_app
from examples.fastapi_app.tables import orders, sent_mails
from outbox import inbox_table, outbox_table, states

pytestmark = [pytest.mark.db, pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)]

ROOT = Path(__file__).resolve().parents[3]


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def post_orders(dsn: str, requests: list[tuple[dict[str, Any], dict[str, str]]]) -> list[Any]:
    """Each (body, query) posted in turn to the app, lifespan included."""

    async def run() -> list[Any]:
        app = create_app(dsn)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return [
                    await client.post("/orders", json=body, params=query)
                    for body, query in requests
                ]

    return asyncio.run(run())


def test_an_order_and_its_message_commit_together_and_the_async_handler_runs_once(
    engine: Engine, dsn: str
) -> None:
    good = {"customer": "ada@example.com", "amount_cents": 1299}
    created, failed, bad = post_orders(
        dsn,
        [
            (good, {}),
            ({"customer": "bob@example.com", "amount_cents": 500}, {"fail_after_store": "true"}),
            ({"customer": "eve@example.com", "amount_cents": "lots"}, {}),
        ],
    )
    # A request that succeeds leaves one order and one outbox row, with its effect key
    assert created.status_code == 201, created.text
    order_id = created.json()["order_id"]
    with engine.connect() as conn:
        row = conn.execute(select(outbox_table)).one()
    assert (row.type, row.effect_key, str(row.event_id)) == (
        "order.created",
        f"order:{order_id}",
        created.json()["event_id"],
    )
    # A request whose endpoint raises after the store leaves neither; bad input, nothing
    assert failed.status_code == 500
    assert bad.status_code == 422 and "amount_cents" in bad.text
    assert (count(engine, orders), count(engine, outbox_table)) == (1, 1)

    # Then a worker process runs the async handler once and stops when idle
    worker = subprocess.run(
        [
            sys.executable, "-m", "outbox_cli", "worker", "examples.fastapi_app.consumers:consumer",
            "--dsn", dsn, "--stop-when-idle", "--poll-interval", "0.05", "--time-limit", "120",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    with engine.connect() as conn:
        mails = conn.execute(select(sent_mails)).all()
        inbox = conn.execute(select(inbox_table.c.state, inbox_table.c.attempts)).all()
    assert [(m.order_id, m.recipient) for m in mails] == [(order_id, "ada@example.com")]
    assert [(i.state, i.attempts) for i in inbox] == [(states.DONE, 1)]
