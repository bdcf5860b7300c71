"""Revision 0004 on a database created by 0003, with messages in flight at upgrade time.

The rows are written the way version 0003 wrote them (its columns only): outbox rows
pending, pending after refusals with a backoff still running, and sent; inbox rows ready,
processing under a live lease, retry not yet due, halted and done. The upgrade keeps every
row as it was, with the new columns NULL (a message without the contract, which is what
they were) and the new tables empty; the relay and the worker of this version then finish
them. Downgrading to 0003 keeps the rows too, and upgrading again is clean. Both with the
default table names and with names of the application's choosing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, func, insert, inspect, select

from outbox import migrate, states
from outbox.config import DEFAULT_CONFIG, OutboxConfig
from outbox.dsn import make_engine
from outbox.migrate import VERSION_TABLE, _alembic_config
from outbox.schema import Schema, schema_for
from outbox.testing import InMemoryPublisher
from relay.relay import Relay, RelaySettings
from tests.integration.inbox.helpers import make_kit
from tests.support.databases import DatabaseFactory

CUSTOM = OutboxConfig(outbox_table="app_outbox", inbox_table="app_inbox")
CONFIGS = [
    pytest.param(DEFAULT_CONFIG, id="default-names"),
    pytest.param(CUSTOM, id="custom-names"),
]
CONSUMER = "c1"

# The columns the tables had at 0003, exactly.
OUTBOX_0003 = (
    "id",
    "event_id",
    "queue",
    "priority",
    "serial_group",
    "key",
    "type",
    "payload",
    "headers",
    "occurred_at",
    "available_at",
    "status",
    "attempts",
    "last_error",
    "sent_at",
    "store_conflicts",
)
INBOX_0003 = (
    "id",
    "event_id",
    "consumer",
    "queue",
    "priority",
    "serial_group",
    "seq",
    "type",
    "payload",
    "headers",
    "state",
    "attempts",
    "duplicates",
    "claim_token",
    "claimed_at",
    "lease_until",
    "available_at",
    "last_error",
    "occurred_at",
    "received_at",
    "finished_at",
)
CONTRACT = ("effect_key", "sequence_key", "sequence", "schema_version")
INBOX_ONLY = ("reason", "next_check")

NOW = datetime.now(UTC)
PAST = NOW - timedelta(minutes=5)
# Later than the test's end: not due, or not expired, unless a clock is moved past it.
FUTURE = NOW + timedelta(minutes=30)
LATER = timedelta(hours=2)


def _outbox_row(mark: str, status: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "event_id": uuid4(),
        "queue": "jobs",
        "priority": 1,
        "serial_group": None,
        "key": None,
        "type": "job",
        "payload": json.dumps({"mark": mark}),
        "headers": "{}",
        "occurred_at": PAST,
        "available_at": PAST,
        "status": status,
        "attempts": 0,
        "last_error": None,
        "sent_at": None,
    }
    row.update(values)
    return row


OUTBOX_ROWS = [
    _outbox_row("o-pending", states.PENDING),
    _outbox_row(
        "o-retry",
        states.PENDING,
        attempts=2,
        available_at=FUTURE,
        last_error="refused by the broker before the upgrade",
    ),
    _outbox_row("o-sent", states.SENT, sent_at=PAST),
]


def _inbox_row(mark: str, seq: int, state: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "event_id": uuid4(),
        "consumer": CONSUMER,
        "queue": "jobs",
        "priority": 1,
        "serial_group": None,
        "seq": seq,
        "type": "job",
        "payload": json.dumps({"mark": mark}),
        "headers": "{}",
        "state": state,
        "attempts": 0,
        # Every key in every row: an executemany takes its columns from the first row.
        "claim_token": None,
        "claimed_at": None,
        "lease_until": None,
        "available_at": PAST,
        "last_error": None,
        "occurred_at": PAST,
        "received_at": PAST,
        "finished_at": None,
    }
    row.update(values)
    return row


INBOX_ROWS = [
    _inbox_row("i-ready", 101, states.READY),
    # A worker held it through the upgrade; its lease runs out at FUTURE.
    _inbox_row(
        "i-processing",
        102,
        states.PROCESSING,
        attempts=1,
        claim_token=uuid4(),
        claimed_at=PAST,
        lease_until=FUTURE,
    ),
    _inbox_row(
        "i-retry",
        103,
        states.RETRY,
        attempts=1,
        available_at=FUTURE,
        last_error="RuntimeError: before the upgrade",
    ),
    _inbox_row(
        "i-halted",
        104,
        states.HALTED,
        attempts=3,
        last_error="RuntimeError: attempts exhausted before the upgrade",
        finished_at=PAST,
    ),
    _inbox_row("i-done", 105, states.DONE, attempts=1, finished_at=PAST),
]


@contextmanager
def _at_0003_in_flight(db_factory: DatabaseFactory, config: OutboxConfig) -> Iterator[Engine]:
    """A database migrated to 0003 under ``config``'s names, holding the rows in flight."""
    schema = schema_for(config)
    with db_factory.database(empty=True) as url:
        engine = make_engine(url)
        try:
            _migrate(engine, config, "0003")
            assert migrate.current_revision(engine) == "0003"
            with engine.begin() as conn:
                conn.execute(insert(schema.outbox), OUTBOX_ROWS)
                conn.execute(insert(schema.inbox), INBOX_ROWS)
            yield engine
        finally:
            engine.dispose()


def _migrate(engine: Engine, config: OutboxConfig, revision: str, down: bool = False) -> None:
    alembic = _alembic_config(config)
    with engine.begin() as conn:
        alembic.attributes["connection"] = conn
        if down:
            command.downgrade(alembic, revision)
        else:
            command.upgrade(alembic, revision)


def _snapshot(engine: Engine, schema: Schema) -> dict[str, dict[str, dict[str, Any]]]:
    """Every row's 0003 columns, by table and mark, as the database returns them."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    with engine.connect() as conn:
        for table, names in ((schema.outbox, OUTBOX_0003), (schema.inbox, INBOX_0003)):
            read = conn.execute(select(*(table.c[n] for n in names)).order_by(table.c.id))
            found[table.name] = {r.payload["mark"]: dict(r._mapping) for r in read}
    return found


def _columns(engine: Engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns(table)}


def _new_tables(schema: Schema) -> list[str]:
    return [t.name for t in (schema.outbox_sequences, schema.inbox_sequences, schema.effects)]


def _diff(engine: Engine, schema: Schema) -> list[Any]:
    """What differs between the database and the declared schema (as test_migrations.py)."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diff = compare_metadata(ctx, schema.metadata)
    return [d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]


def _assert_contract_untouched(engine: Engine, schema: Schema, rows: int) -> None:
    """The new columns are NULL on every row, and the new tables are empty."""
    with engine.connect() as conn:
        for table, names in (
            (schema.outbox, CONTRACT),
            (schema.inbox, CONTRACT + INBOX_ONLY),
        ):
            for name in names:
                column = table.c[name]
                values = conn.execute(select(column).where(column.is_not(None))).all()
                assert values == [], f"{table.name}.{name}"
        counts = {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (schema.outbox_sequences, schema.inbox_sequences, schema.effects)
        }
        total = sum(
            conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (schema.outbox, schema.inbox)
        )
    assert counts == dict.fromkeys(_new_tables(schema), 0)
    assert total == rows


@pytest.mark.parametrize("config", CONFIGS)
def test_upgrade_from_0003_keeps_rows_in_flight_and_they_finish(
    db_factory: DatabaseFactory, config: OutboxConfig
) -> None:
    schema = schema_for(config)
    outbox, inbox = schema.outbox.name, schema.inbox.name
    with _at_0003_in_flight(db_factory, config) as engine:
        before = _snapshot(engine, schema)
        assert set(before[outbox]) == {"o-pending", "o-retry", "o-sent"}
        assert not set(_new_tables(schema)) & set(inspect(engine).get_table_names())

        # When the database is upgraded to this version
        _migrate(engine, config, "head")

        # Then every row is as 0003 left it, the contract is absent, the schema is the code's
        assert migrate.current_revision(engine) == migrate.head_revision() == "0004"
        assert _snapshot(engine, schema) == before
        _assert_contract_untouched(engine, schema, len(OUTBOX_ROWS) + len(INBOX_ROWS))
        assert set(_new_tables(schema)) <= set(inspect(engine).get_table_names())
        indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes(inbox)}
        assert indexes[f"ix_{inbox}_sequence"] == ["consumer", "sequence_key", "sequence"]
        assert _diff(engine, schema) == []

        # When the relay of this version runs, later than the refused row's backoff
        publisher = InMemoryPublisher()
        relay = Relay(
            engine,
            publisher,
            RelaySettings(poll_interval=0.05, stop_when_idle=True, use_notify=False, config=config),
            clock=lambda: datetime.now(UTC) + LATER,
        )
        stats = relay.run()

        # Then it published the two pending rows once each, and the sent one not again
        published = {e.event_id: e for e in publisher.envelopes}
        assert stats.sent == 2 and len(publisher.envelopes) == 2
        assert set(published) == {before[outbox][m]["event_id"] for m in ("o-pending", "o-retry")}
        assert all(e.payload()["mark"] in ("o-pending", "o-retry") for e in published.values())
        after_relay = _snapshot(engine, schema)[outbox]
        assert {m: r["status"] for m, r in after_relay.items()} == dict.fromkeys(
            before[outbox], states.SENT
        )
        assert after_relay["o-sent"] == before[outbox]["o-sent"]
        assert after_relay["o-retry"]["attempts"] == 2

        # When a worker of this version receives them and runs what is due, later than the
        # retry's due time and the processing row's lease
        kit = make_kit(engine, CONSUMER, config=config)
        kit.ingest(publisher.envelopes)
        kit.clock.advance(LATER.total_seconds())
        ran = kit.drain()

        # Then each message in line ran once and is done; the halted and done rows are as
        # they were
        assert sorted(ran) == ["i-processing", "i-ready", "i-retry", "o-pending", "o-retry"]
        rows = _snapshot(engine, schema)[inbox]
        assert {m: r["state"] for m, r in rows.items()} == {
            "i-ready": states.DONE,
            "i-processing": states.DONE,
            "i-retry": states.DONE,
            "i-halted": states.HALTED,
            "i-done": states.DONE,
            "o-pending": states.DONE,
            "o-retry": states.DONE,
        }
        assert {m: r["attempts"] for m, r in rows.items()} == {
            "i-ready": 1,
            "i-processing": 2,
            "i-retry": 2,
            "i-halted": 3,
            "i-done": 1,
            "o-pending": 1,
            "o-retry": 1,
        }
        for mark in ("i-halted", "i-done"):
            assert rows[mark] == before[inbox][mark]
        # The processing row was taken back under a token of its own, not the dead worker's.
        token = before[inbox]["i-processing"]["claim_token"]
        assert isinstance(token, UUID) and rows["i-processing"]["claim_token"] != token

        # When the database is downgraded to 0003
        finished = _snapshot(engine, schema)
        _migrate(engine, config, "0003", down=True)

        # Then the rows are kept, and the tables are 0003's again
        assert migrate.current_revision(engine) == "0003"
        assert _snapshot(engine, schema) == finished
        assert _columns(engine, outbox) == set(OUTBOX_0003)
        assert _columns(engine, inbox) == set(INBOX_0003)
        assert not set(_new_tables(schema)) & set(inspect(engine).get_table_names())
        assert f"ix_{inbox}_sequence" not in {i["name"] for i in inspect(engine).get_indexes(inbox)}

        # And upgrading again gives the declared schema, with the rows still as they were
        _migrate(engine, config, "head")
        assert migrate.current_revision(engine) == "0004"
        assert _diff(engine, schema) == []
        assert _snapshot(engine, schema) == finished
        _assert_contract_untouched(engine, schema, len(OUTBOX_ROWS) + 2 + len(INBOX_ROWS))
