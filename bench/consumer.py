"""The consumer side's benchmark: one run, one table, ratios against goals.

    .venv/bin/pip install -e '.[bench]'        # procrastinate, pgqueuer (else their cells: n/a)
    .venv/bin/python -m bench.consumer                              # every part, full sizes
    .venv/bin/python -m bench.consumer --part a --history 200000
    .venv/bin/python -m bench.consumer --part b,c --messages 5000 --pgbench-seconds 5

Progress lines go to stderr as each measurement starts and ends; the table to stdout.
"N" is the worker's ``--batch-size`` (handlers per database transaction): the N=1 runs pass
``--batch-size 1``, the default runs nothing. A worker without that option (its ``--help``
says so) gets no N=1 run and the cell reads n/a.

(a) head of group: the worker's head pass (full, and over the groups marked in
    ``inbox_groups``: all 1,000, or 10) vs variant B (bench/consumer_heads.py) on PostgreSQL
    and MariaDB, 20,000 unfinished rows in 1,000 groups, then with ``--history`` (1,000,000)
    done rows added. Goals: ours >= 10x faster than B; with history <= 1.2x the time without.
(b) no-op jobs/s, ``--messages`` (20,000) stored up front, 2 worker processes, database
    source on PostgreSQL, without groups and with 1,000 groups x 20 mixed priorities: ours at
    N=1 and at the default N; procrastinate (2 processes, ``--concurrency 1``, its ``lock``
    for the groups); pgqueuer with its defaults (batch size 10, 2 processes; no groups in
    pgqueuer: ungrouped only) on its psycopg driver, and on asyncpg as a report
    (``--pgqueuer-drivers``); the PostgreSQL floor: pgbench running ``BEGIN; UPDATE one row;
    INSERT one row; COMMIT;``, 2 clients, prepared, ``--pgbench-seconds`` (10), in a database
    of its own. Goals: no groups, ours (default N) >= 1.0x pgqueuer (psycopg) and >= 5x
    procrastinate; grouped ours >= 0.7x ours ungrouped; ours at N=1 >= 0.5x the floor.
(c) as (b), the handler inserting one row: ours through the session it is given (atomic with
    the message's ack); pgqueuer and procrastinate on a connection of their own (not atomic
    with their ack). Same goals.
(d) ours on MariaDB and SQLite (``--sqlite-workers``, 2: they take turns at SQLite's one
    write lock, without errors), no-op, without and with groups, the default N. Report; the
    rows name the worker count that ran.
(e) commit -> handler-done latency p50/p99 at ``--rates`` (200) messages/s for
    ``--seconds`` (10): database source, and RabbitMQ (``outbox relay`` + workers with
    ``--source amqp://...``). Goals: p50 <= 10 ms database source, <= 20 ms RabbitMQ.
(f) jobs/s through the RabbitMQ and Kafka sources (one relay each; Kafka: tansu, in memory)
    next to the database source, ``--messages`` no-op messages in one commit, 2 workers.
    Goal: each broker source >= 0.5x the database source.
(g) no-op jobs/s of an ``async def`` handler next to the same no-op as a sync handler, in the
    same run, no groups, N=1 and the default N, on PostgreSQL and SQLite, ``--workers``
    processes. Report: the cost of the event loop and the asyncio driver.

Every part creates databases (outbox_bench_consumer_*), queues and topics (outbox_bench_*) of
its own and drops them.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence

from bench.consumer_support import Row, note

PARTS = "abcdefg"


def print_table(rows: Sequence[Row], command: str) -> None:
    header = ("measurement", "result", "goal", "verdict")
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    print(f"\n$ {command}")
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def parse_parts(value: str) -> list[str]:
    if value == "all":
        return list(PARTS)
    parts = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part(s) {unknown}: choose from a..g or all")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--part", type=parse_parts, default=list(PARTS), help="comma-separated a..g, or all"
    )
    parser.add_argument("--messages", type=int, default=20_000, help="(b, c, d, f) per case")
    parser.add_argument("--history", type=int, default=1_000_000, help="(a) done rows added")
    parser.add_argument("--runs", type=int, default=7, help="(a) timed runs per query")
    parser.add_argument("--dialects", default="postgresql,mariadb", help="(a) databases")
    parser.add_argument("--workers", type=int, default=2, help="(b-f) worker processes")
    parser.add_argument("--sqlite-workers", type=int, default=2, help="(d) SQLite workers")
    parser.add_argument("--pgbench-seconds", type=float, default=10.0, help="(b, c) floor")
    parser.add_argument(
        "--pgqueuer-drivers", default="psycopg,asyncpg", help="(b, c) pgqueuer's drivers"
    )
    parser.add_argument("--rates", default="200", help="(e) messages/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="(e) seconds per rate")
    parser.add_argument("--no-rabbit", action="store_true", help="(e, f) skip RabbitMQ")
    parser.add_argument("--no-kafka", action="store_true", help="(f) skip Kafka")
    args = parser.parse_args()
    # SIGTERM unwinds like an exception, so each part's ``finally`` stops its processes and
    # drops its databases and queues.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parts: list[str] = args.part
    rows: list[Row] = []
    started = time.monotonic()
    if "a" in parts:
        from bench.consumer_heads import part_a

        for dialect in args.dialects.split(","):
            rows += part_a(dialect, args.history, args.runs)
    if "b" in parts or "c" in parts:
        from bench.consumer_parts import measure_floor, part_throughput

        floor = measure_floor(args.pgbench_seconds, 2)
        drivers = [d for d in args.pgqueuer_drivers.split(",") if d]
        for part, handler in (("b", "noop"), ("c", "effect")):
            if part in parts:
                rows += part_throughput(part, handler, args.messages, args.workers, floor, drivers)
    if "d" in parts:
        from bench.consumer_parts import part_d

        rows += part_d(args.messages, args.workers, args.sqlite_workers)
    if "e" in parts:
        from bench.consumer_brokers import part_e

        rates = [float(r) for r in args.rates.split(",")]
        rows += part_e(rates, args.seconds, args.workers, not args.no_rabbit)
    if "f" in parts:
        from bench.consumer_brokers import part_f

        rows += part_f(args.messages, args.workers, not args.no_rabbit, not args.no_kafka)
    if "g" in parts:
        from bench.consumer_parts import part_g

        rows += part_g(args.messages, args.workers)
    note(f"all parts done in {time.monotonic() - started:.0f}s")
    print_table(rows, " ".join(["python -m bench.consumer", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
