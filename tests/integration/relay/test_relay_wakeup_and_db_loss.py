"""PostgreSQL NOTIFY wake-up, and the relay riding out its database connections being killed."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine, create_engine, func, select, text

from outbox import states
from outbox.schema import outbox_table
from outbox.store import Message, store
from relay.publishers.rabbitmq import RabbitMQPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.relay.helpers import (
    RABBIT,
    read_queue,
    status_counts,
    store_rows,
    unique_queue,
    wait_for,
)
from tests.support import services


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_notify_publishes_a_commit_long_before_the_poll_interval(
    engine: Engine, rabbit_names: list[str]
) -> None:
    # Given an idle relay polling only every 5 s
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    relay = Relay(engine, RabbitMQPublisher(RABBIT), RelaySettings(poll_interval=5.0))
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: relay.stats.exit_reason == "" and thread.is_alive(), 5, "relay up")
        lags = []
        for i in range(5):
            # Let it go idle in its wait (an empty fetch happens right after start/each send)
            time.sleep(0.3)
            with engine.begin() as conn:
                store(conn, queue, "t", {"i": i})
            committed = time.monotonic()
            wait_for(
                lambda n=i + 1: status_counts(engine).get(states.SENT, 0) == n,
                10,
                f"message {i} sent",
                interval=0.002,
            )
            lags.append(time.monotonic() - committed)
    finally:
        relay.stop()
        thread.join(timeout=10)
    # Then each one went out in a small fraction of the 5 s poll interval
    assert max(lags) < 1.0, lags
    assert len(read_queue(f"{queue}_1", 5)) == 5


@pytest.mark.parametrize("dialect", ["postgresql", "mariadb"], indirect=True)
def test_killed_database_connections_lose_nothing(
    engine: Engine, dialect: str, rabbit_names: list[str]
) -> None:
    queue = unique_queue()
    rabbit_names.append(f"{queue}_1")
    total = 3000
    store_rows(engine, [Message(queue, "t", {"i": i}) for i in range(total)])
    database = engine.url.database
    admin = create_engine(
        services.PG_ADMIN_URL if dialect == "postgresql" else services.MARIADB_ADMIN_URL,
        isolation_level="AUTOCOMMIT",
    )
    relay = Relay(
        engine, RabbitMQPublisher(RABBIT), RelaySettings(batch_size=20, poll_interval=0.05)
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    kills = 0
    try:
        for threshold in (300, 900, 1500):
            wait_for(
                lambda t=threshold: status_counts(engine).get(states.SENT, 0) >= t, 60, "progress"
            )
            with admin.connect() as conn:
                kills += _kill_connections(conn, dialect, database or "")
        wait_for(lambda: status_counts(engine) == {states.SENT: total}, 120, "all sent")
    finally:
        relay.stop()
        thread.join(timeout=30)
        admin.dispose()
    assert kills >= 3
    assert relay.stats.database_errors >= 1
    with engine.connect() as conn:
        assert conn.execute(select(func.max(outbox_table.c.attempts))).scalar_one() == 0
    delivered = read_queue(f"{queue}_1", total)
    assert len({d.envelope.event_id for d in delivered}) == total


def _kill_connections(conn: object, dialect: str, database: str) -> int:
    from sqlalchemy import Connection

    assert isinstance(conn, Connection)
    if dialect == "postgresql":
        return len(
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": database},
            ).all()
        )
    ids = conn.execute(
        text("SELECT id FROM information_schema.processlist WHERE db = :db"), {"db": database}
    ).scalars()
    killed = 0
    for connection_id in ids:
        try:
            conn.execute(text("KILL :id"), {"id": int(connection_id)})
            killed += 1
        except Exception:  # it ended by itself meanwhile
            pass
    return killed
