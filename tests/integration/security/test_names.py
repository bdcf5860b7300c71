"""Names are data, never SQL or routing syntax (bad input: "Queue, group and type names are
parameters, never SQL text").

- Group, type and consumer names with quotes, semicolons, ``%`` / ``%s`` / ``%(x)s``
  (DB-API paramstyle markers), unicode (4-byte characters included) and 255 characters go
  store -> relay -> RabbitMQ / Kafka -> ``outbox worker`` -> inbox row and handler verbatim;
  and through the database source on PostgreSQL, MariaDB and SQLite (MariaDB's GET_LOCK
  name, PostgreSQL's advisory key and NOTIFY payload all derive from them).
- Queue names end up in broker routing names (``<queue>_<priority>``): the ones a broker
  cannot take must be refused by ``store()`` with the field named, not by the relay later.
  RabbitMQ: queue names are AMQP short strings (<= 255 bytes) and ``amq.*`` is reserved.
  Apache Kafka: topic names are at most 249 characters of ``[a-zA-Z0-9._-]`` (the tansu
  broker of the test suite is laxer, so this is asserted at store time only).
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

import outbox
from outbox import states
from outbox.config import DEFAULT_CONFIG
from outbox.errors import ValidationError
from outbox.schema import outbox_table
from relay.publishers import publisher_from_url
from relay.relay import Relay, RelaySettings
from tests.integration.bad_input.support import (
    create_effects,
    effect_rows,
    inbox_rows,
    run_worker,
    source_url,
    worker_env,
)
from tests.integration.relay.publishers_fixtures import unique
from tests.integration.sources.sources_fixtures import SourceCase

TYPES = [
    'it\'s "quoted"; DROP TABLE inbox;--',
    "100% %s %(type)s ünïcödé ✓ 日本 🚀",
    "t" * 255,
    "\U0001d517" * 255,  # 255 characters, 1020 bytes in UTF-8
]
GROUPS = [
    "g'\"; DELETE FROM inbox WHERE '1'='1",
    "%(serial_group)s %s 50%",
    "ünï/日本 ✓ 🚀",
    "g" * 255,
]


def _consumer_name() -> str:
    name = f"c'\"; %s ✓ 日本 {unique('')} "
    return name + "x" * (255 - len(name))


def _store_all(engine: Engine, queue: str) -> list[tuple[str, str | None, str]]:
    """Every type in every group and ungrouped; returns (type, group, mark) in store order."""
    stored = []
    with engine.begin() as conn:
        for t_index, message_type in enumerate(TYPES):
            for g_index, group in enumerate([*GROUPS, None]):
                mark = f"m{t_index}-{g_index}"
                outbox.store(conn, queue, message_type, {"mark": mark}, serial_group=group)
                stored.append((message_type, group, mark))
    return stored


def _assert_verbatim(
    engine: Engine, consumer: str, queue: str, stored: list[tuple[str, str | None, str]]
) -> None:
    rows = inbox_rows(engine, consumer)
    assert len(rows) == len(stored)
    assert {r.state for r in rows} == {states.DONE}, [(r.type, r.last_error) for r in rows]
    assert {(r.type, r.serial_group, r.payload["mark"]) for r in rows} == set(stored)
    assert {(r.consumer, r.queue) for r in rows} == {(consumer, queue)}
    seen = {(e.type, e.grp, e.mark, e.consumer, e.queue) for e in effect_rows(engine, consumer)}
    assert seen == {(t, g, m, consumer, queue) for t, g, m in stored}


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_names_travel_verbatim_through_the_brokers(
    engine: Engine, dsn: str, broker: SourceCase
) -> None:
    queue, consumer = unique("Sec.names-"), _consumer_name()
    create_effects(engine)
    stored = _store_all(engine, queue)
    publisher = publisher_from_url(source_url(broker), confirm_timeout=10)
    relay = Relay(engine, publisher, RelaySettings(queues=(queue,), stop_when_idle=True))
    assert relay.run().sent == len(stored)
    if broker.name == "rabbitmq":
        broker.queues |= {f"{queue}_1"}  # type: ignore[attr-defined]

    proc = run_worker(dsn, source_url(broker), worker_env(consumer, [queue], TYPES))

    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_verbatim(engine, consumer, queue, stored)


def test_names_travel_verbatim_through_the_database_source(engine: Engine, dsn: str) -> None:
    queue, consumer = unique("Sec.names-"), _consumer_name()
    create_effects(engine)
    stored = _store_all(engine, queue)

    proc = run_worker(dsn, "", worker_env(consumer, [queue], TYPES))

    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_verbatim(engine, consumer, queue, stored)
    with engine.connect() as conn:
        assert set(conn.execute(select(outbox_table.c.status)).scalars()) == {states.SENT}


ROUTING_SUFFIX = len(f"_{DEFAULT_CONFIG.max_priority}")
UNROUTABLE: list[tuple[str, str]] = [
    ("trailing newline", "orders\n"),  # `$` in the name pattern matches before a final \n
    ("over Kafka's 249", "q" * (250 - ROUTING_SUFFIX)),
    ("over AMQP's 255 bytes", "q" * 255),
    ("RabbitMQ reserved amq.", "amq.orders"),
]


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("case", "queue"), UNROUTABLE, ids=[u[0] for u in UNROUTABLE])
def test_store_refuses_queue_names_a_broker_cannot_route(
    engine: Engine, case: str, queue: str
) -> None:
    with engine.begin() as conn:
        with pytest.raises(ValidationError) as raised:
            outbox.store(conn, queue, "t", {"case": case})
        assert raised.value.field == "queue"
    with engine.connect() as conn:
        assert conn.execute(select(outbox_table)).all() == []


def test_long_queue_names_that_fit_every_broker_are_accepted() -> None:
    """Whatever the exact limit chosen, 240 characters leave room for ``_<priority>`` within
    Kafka's 249 and AMQP's 255 bytes, and must stay accepted."""
    from outbox.validation import check_queue

    name = "q" * 240
    assert check_queue(name) == name
