"""The batched engine in one process, without worker processes: where a message's time goes.

    .venv/bin/python -m bench.consumer_engine                         # the table below
    .venv/bin/python -m bench.consumer_engine --messages 20000 --sizes 1,10,50,100
    .venv/bin/python -m bench.consumer_engine --contract --sizes 1,50     # docs/contract.md

For each (batch size, isolation, groups) on PostgreSQL: store the messages, take them all
into the inbox with the database source (its rate: rows/s), then claim and run them one
batch after another with ``BatchClaimer`` and ``BatchRunner`` as a handler thread does,
timing the claim passes and the batch transactions apart (us per message) and their sum as
one thread's rate. A no-op handler; ``--fail-every K`` makes every K-th message fail once
(the cost of a raising handler in each isolation mode). Each case has a database of its own
(outbox_bench_engine_*), ANALYZEd after the store, dropped at the end.

``--contract``: the message contract's cost instead, at one priority, no groups, "rerun":
plain messages, then each with an effect key of its own (one ledger insert), then each
with a sequence key numbered by the producer (``--keys`` keys: one conditional advance and
one successor check), then both.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from bench.consumer_support import create_database, drop_database
from inbox import Consumer, InboxMessage
from inbox.engine.claims import BatchClaimer
from inbox.engine.outcomes import frees_group
from inbox.engine.runner import BatchRunner
from inbox.ingest import InboxIngest
from inbox.settings import ISOLATIONS, Isolation
from inbox.sources.database import DatabaseSource
from outbox import Message, migrate, store_many
from outbox.backoff import Backoff
from outbox.dsn import make_engine

QUEUE = "bench"


@dataclass(frozen=True)
class Measured:
    ingest: float  # rows/s
    claim_us: float
    run_us: float

    @property
    def rate(self) -> float:
        return 1e6 / (self.claim_us + self.run_us)


def consumer(fail_every: int) -> Consumer:
    made = Consumer("bench-engine", queues=[QUEUE], backoff=Backoff.fixed(0.001))

    @made.handler("noop")
    def noop(_session: Session, message: InboxMessage) -> None:
        if fail_every and message.attempt == 1 and message.payload["n"] % fail_every == 0:
            raise RuntimeError("fails once")

    return made


# --contract cases: the fields every message carries.
CONTRACTS = ("none", "effect key", "sequence key", "both")


def measure(
    messages: int,
    size: int,
    isolation: Isolation,
    groups: int,
    fail_every: int,
    contract: str | None = None,
    keys: int = 250,
) -> Measured:
    url = create_database("postgresql", "engine")
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        _store(engine, messages, groups, contract, keys)
        cons = consumer(fail_every)
        ingest = InboxIngest(cons, engine)
        source = DatabaseSource(engine, [QUEUE])
        started = time.perf_counter()
        while source._take(ingest, 100):
            pass
        ingest_rate = messages / (time.perf_counter() - started)
        claimer = BatchClaimer(cons, engine, job_queue=True)
        runner = BatchRunner(cons, engine, isolation=isolation)
        claiming = running = 0.0
        done = 0
        freed: list[str] = []
        while done < messages:
            a = time.perf_counter()
            result = claimer.claim_pass(size, freed)
            b = time.perf_counter()
            if not result.claims:
                time.sleep(0.002)  # a retry's 1 ms backoff
                freed = list(result.undecided)
                continue
            outcomes = runner.run(result.claims)
            claiming += b - a
            running += time.perf_counter() - b
            done += sum(1 for _, o in outcomes if o == "done")
            freed = list(result.undecided) + [
                c.serial_group
                for c, o in outcomes
                if c.serial_group is not None and frees_group(o, cons, c.row.queue)
            ]
        return Measured(ingest_rate, claiming / messages * 1e6, running / messages * 1e6)
    finally:
        engine.dispose()
        drop_database("postgresql", url)


def _store(engine: Engine, messages: int, groups: int, contract: str | None, keys: int) -> None:
    effect = contract in ("effect key", "both")
    sequence = contract in ("sequence key", "both")
    rows = [
        Message(
            queue=QUEUE,
            type="noop",
            payload={"n": n},
            # One priority in the contract cases: numbers are given in store order, and a
            # priority order would defer most of them (a gap), which is not the case measured.
            priority=1 if contract is not None else 1 + (n * 7) % 9,
            serial_group=f"group-{n % groups}" if groups else None,
            effect_key=f"effect-{n}" if effect else None,
            sequence_key=f"key-{n % keys}" if sequence else None,
        )
        for n in range(messages)
    ]
    with engine.begin() as conn:
        for start in range(0, messages, 1000):
            store_many(conn, rows[start : start + 1000])
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--sizes", default="1,10,50,100", help="batch sizes, comma-separated")
    parser.add_argument("--groups", type=int, default=250, help="groups of the grouped case")
    parser.add_argument("--fail-every", type=int, default=0, help="every K-th fails once")
    parser.add_argument(
        "--contract", action="store_true", help="the message contract's cost (see above)"
    )
    parser.add_argument("--keys", type=int, default=250, help="sequence keys of --contract")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"$ python -m bench.consumer_engine {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"{'case':44} {'ingest rows/s':>13} {'claim us/msg':>12} {'run us/msg':>10} "
        f"{'msgs/s, 1 thread':>16}"
    )
    if args.contract:
        for size in sizes:
            for contract in CONTRACTS:
                label = f"N={size} rerun, {contract}"
                if contract in ("sequence key", "both"):
                    label += f" ({args.keys} keys)"
                print(f"[{time.strftime('%H:%M:%S')}] {label}", file=sys.stderr)
                m = measure(args.messages, size, "rerun", 0, 0, contract, args.keys)
                print(
                    f"{label:44} {m.ingest:13,.0f} {m.claim_us:12,.0f} {m.run_us:10,.0f} "
                    f"{m.rate:16,.0f}",
                    flush=True,
                )
        return
    for groups in (0, args.groups):
        for size in sizes:
            for isolation in ISOLATIONS:
                label = (
                    f"N={size} {isolation}, "
                    + (f"{groups} groups" if groups else "no groups")
                    + (f", 1 in {args.fail_every} fails once" if args.fail_every else "")
                )
                print(f"[{time.strftime('%H:%M:%S')}] {label}", file=sys.stderr)
                m = measure(args.messages, size, isolation, groups, args.fail_every)
                print(
                    f"{label:44} {m.ingest:13,.0f} {m.claim_us:12,.0f} {m.run_us:10,.0f} "
                    f"{m.rate:16,.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
