"""The message contract travels: ``store()`` -> outbox row -> relay -> RabbitMQ / Kafka, read
back with each broker's plain client (every database, both brokers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

import outbox
from outbox import states
from outbox.wire import (
    H_EFFECT_KEY,
    H_PAYLOAD_SCHEMA,
    H_SEQUENCE,
    H_SEQUENCE_KEY,
    from_wire,
    routing_name,
)
from relay.relay import Relay, RelaySettings
from tests.integration.relay.publishers_fixtures import CASES, BrokerCase, unique


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerCase]:
    broker_case = CASES[request.param](request, tmp_path)
    yield broker_case
    broker_case.cleanup()


def test_contract_fields_arrive_through_the_relay(engine: Engine, case: BrokerCase) -> None:
    # Given messages with the contract fields (numbered by store(), and given), and without
    queue = unique("contract-relay-")
    with engine.begin() as conn:
        numbered = [
            outbox.store(
                conn,
                queue,
                "invoice.reminder",
                {"i": i},
                effect_key=f"invoice-417:reminder-{i}",
                sequence_key="invoice-417",
                schema_version="2021-03",
            )
            for i in range(3)
        ]
        given = outbox.store(conn, queue, "t", {}, sequence_key="invoice-9", sequence=2**63 - 1)
        plain = outbox.store(conn, queue, "t", {}, headers={"trace": "abc"})

    # When the relay publishes them
    relay = Relay(
        engine,
        case.publisher(),
        RelaySettings(queues=(queue,), stop_when_idle=True, poll_interval=0.05),
    )
    stats = relay.run()
    assert stats.sent == 5

    # Then a plain client of the broker reads the four headers, and from_wire the fields
    received = case.read(routing_name(queue, 1), 5)
    by_event = {r.headers["outbox-event-id"]: r for r in received}
    assert len(by_event) == 5
    for i, event_id in enumerate(numbered):
        got = by_event[str(event_id)]
        assert got.headers[H_EFFECT_KEY] == f"invoice-417:reminder-{i}"
        assert got.headers[H_SEQUENCE_KEY] == "invoice-417"
        assert got.headers[H_SEQUENCE] == str(i + 1)
        assert got.headers[H_PAYLOAD_SCHEMA] == "2021-03"
        env = from_wire(got.headers, got.body)
        assert (env.effect_key, env.sequence_key, env.sequence, env.schema_version) == (
            f"invoice-417:reminder-{i}",
            "invoice-417",
            i + 1,
            "2021-03",
        )
    env = from_wire(by_event[str(given)].headers, by_event[str(given)].body)
    assert (env.sequence_key, env.sequence, env.effect_key) == ("invoice-9", 2**63 - 1, None)
    assert H_PAYLOAD_SCHEMA not in by_event[str(given)].headers
    plain_headers = by_event[str(plain)].headers
    assert not {H_EFFECT_KEY, H_SEQUENCE_KEY, H_SEQUENCE, H_PAYLOAD_SCHEMA} & set(plain_headers)
    assert from_wire(plain_headers, by_event[str(plain)].body).headers == {"trace": "abc"}
    with engine.connect() as conn:
        statuses = conn.execute(outbox.outbox_table.select()).mappings().all()
    assert {r["status"] for r in statuses} == {states.SENT}
