"""Concurrent producers and the PostgreSQL wake-up (not a test): prints one table.

    .venv/bin/python bench/wakeup.py [--producers 8] [--seconds 3] [--rounds 3] [--threads]

Each producer (a process, or a thread with ``--threads``) commits transactions of one
domain insert + one ``store()`` for a fixed time; commits/s of all producers together with the
wake-up (``OutboxConfig(notify=True)``, the default: every transaction notifies, and
PostgreSQL serialises the commits of notifying transactions under one lock, held through the
WAL flush) and without it (``notify=False``). Variants run interleaved, round by round, on one
database; the table shows medians. Goal: with >= 0.9x without.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from decimal import Decimal
from typing import Any

import outbox
from outbox.dsn import make_engine

try:  # run as a script (bench/wakeup.py) or as a module (python -m bench.wakeup)
    from store import PAYLOAD, TARGETS, bench_db, drop_db, orders  # type: ignore[import-not-found]
except ImportError:
    from bench.store import PAYLOAD, TARGETS, bench_db, drop_db, orders


def produce(url: str, notify: bool, start: float, seconds: float, out: Any) -> None:
    config = outbox.OutboxConfig(notify=notify)
    engine = make_engine(url, pool_size=1)

    def one() -> None:
        with engine.begin() as conn:
            conn.execute(orders.insert().values(customer="ACME", total=Decimal("10.00")))
            outbox.store(
                conn, "orders", "order.placed", PAYLOAD, serial_group="c-17", config=config
            )

    one()  # connect and warm the statement caches before the clock starts
    time.sleep(max(0.0, start - time.time()))
    end = time.monotonic() + seconds
    commits = 0
    while time.monotonic() < end:
        one()
        commits += 1
    engine.dispose()
    out.put(commits)


def round_rate(url: str, notify: bool, producers: int, seconds: float, threads: bool) -> float:
    start = time.time() + 1.0  # every producer connected before it
    if threads:
        import queue

        out: Any = queue.Queue()
        workers: list[Any] = [
            threading.Thread(target=produce, args=(url, notify, start, seconds, out))
            for _ in range(producers)
        ]
    else:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        workers = [
            ctx.Process(target=produce, args=(url, notify, start, seconds, out))
            for _ in range(producers)
        ]
        start += 2.0  # a spawned interpreter imports SQLAlchemy first
    for w in workers:
        w.start()
    total = sum(out.get() for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", action="store_true", help="threads instead of processes")
    args = parser.parse_args()
    engine, db = bench_db("postgresql", TARGETS["postgresql"])
    url = engine.url.render_as_string(hide_password=False)
    rates: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(args.rounds):
            for notify in (False, True):
                rates[notify].append(
                    round_rate(url, notify, args.producers, args.seconds, args.threads)
                )
    finally:
        drop_db("postgresql", TARGETS["postgresql"], engine, db)
    kind = "threads" if args.threads else "processes"
    print(
        f"outbox-relay bench/wakeup.py  {args.producers} producer {kind}, "
        f"{args.seconds:g} s x {args.rounds} rounds (medians), PostgreSQL"
    )
    without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
    header = f"{'commits/s without':>18}{'with':>8}{'with/without':>14}{'goal':>7}"
    print(header)
    print("-" * len(header))
    print(f"{without:>18.0f}{with_:>8.0f}{with_ / without:>14.2f}{'>=0.9':>7}")


if __name__ == "__main__":
    main()
