"""Helpers of the message-contract tests: messages received as a broker source delivers them
(the consumer's database apart from the producer's), a handler recording what it applied,
and one pass of the worker's engine (its claim-and-run cycle: batched claims and runner)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from inbox import Consumer, InboxMessage
from inbox.engine.claims import BatchClaimer
from inbox.engine.cycle import ClaimAndRun
from inbox.engine.leases import LeaseKeeper
from inbox.engine.runner import BatchRunner
from inbox.ingest import InboxIngest
from outbox import inbox_table
from outbox.backoff import Backoff
from outbox.schema import inbox_sequences_table
from outbox.wire import Envelope
from tests.integration.inbox.helpers import Clock

_ids = iter(range(1, 10**9))


def change(
    mark: str,
    *,
    sequence_key: str | None = None,
    sequence: int | None = None,
    effect_key: str | None = None,
    schema_version: str | None = None,
    serial_group: str | None = None,
    type: str = "job",
) -> Envelope:
    """A message as a broker source hands it to the ingest, with a new event id."""
    return Envelope(
        event_id=uuid.uuid4(),
        type=type,
        queue="jobs",
        priority=1,
        outbox_id=next(_ids),
        occurred_at=datetime.now(UTC),
        body=f'{{"mark": "{mark}"}}',
        serial_group=serial_group,
        effect_key=effect_key,
        sequence_key=sequence_key,
        sequence=sequence,
        schema_version=schema_version,
    )


@dataclass
class ContractKit:
    engine: Engine
    consumer: Consumer
    clock: Clock
    ingest: InboxIngest
    claimer: BatchClaimer
    runner: BatchRunner
    cycle: ClaimAndRun
    applied: list[str] = field(default_factory=list)
    raise_for: dict[str, BaseException] = field(default_factory=dict)

    def receive(self, *messages: Envelope) -> None:
        self.ingest(list(messages))

    def run_pass(self) -> dict[str, str]:
        """Claim what is claimable now (up to 50) and run it: outcome by mark."""
        claims = self.cycle.claim().claims
        return {c.row.payload["mark"]: o for c, o in self.cycle.run(claims)}

    def drain(self, passes: int = 20) -> list[str]:
        for _ in range(passes):
            if not self.run_pass():
                return self.applied
        raise AssertionError("drain did not finish")

    def row(self, mark: str) -> Any:
        t = inbox_table
        with self.engine.connect() as conn:
            found = conn.execute(
                select(t).where(t.c.consumer == self.consumer.name).order_by(t.c.id)
            ).all()
        matching = [r for r in found if (r.payload or {}).get("mark") == mark]
        assert len(matching) == 1, f"{len(matching)} rows for {mark!r}"
        return matching[0]

    def last_applied(self, key: str) -> int | None:
        s = inbox_sequences_table.c
        with self.engine.connect() as conn:
            value = conn.execute(
                select(s.last).where(s.consumer == self.consumer.name, s.sequence_key == key)
            ).scalar()
        return None if value is None else int(value)


def make_contract_kit(
    engine: Engine,
    *,
    name: str = "contract",
    versions: Sequence[str] | None = None,
    isolation: str = "rerun",
    **options: Any,
) -> ContractKit:
    clock = Clock()
    options.setdefault("backoff", Backoff.fixed(1.0))
    consumer = Consumer(name, queues=["jobs"], **options)
    claimer = BatchClaimer(consumer, engine, job_queue=False, clock=clock)
    runner = BatchRunner(consumer, engine, clock=clock, isolation=isolation)  # type: ignore[arg-type]
    leases = LeaseKeeper(consumer, engine, clock=clock)
    kit = ContractKit(
        engine,
        consumer,
        clock,
        InboxIngest(consumer, engine, clock=clock),
        claimer,
        runner,
        ClaimAndRun(claimer, runner, leases, batch_size=50),
    )

    @consumer.handler("job", versions=set(versions) if versions is not None else None)
    def job(session: Session, message: InboxMessage) -> None:
        mark = message.payload["mark"]
        error = kit.raise_for.pop(mark, None)
        if error is not None:
            raise error
        kit.applied.append(mark)

    return kit
