"""The relay's own cost per message (not a test): the relay with no broker vs the raw loop.

    .venv/bin/python bench/relay_inprocess.py [--rows 20000] [--rounds 3]

One PostgreSQL database holding ``--rows`` pending rows of 1 KiB. Each round, in turn: a
``Relay`` in this process with ``outbox.testing.InMemoryPublisher`` drains them (so nothing
is waited for but the database), with and without the pipeline, then the raw database loop
of bench/relay_floor.py drains them again (the relay's statements, no relay code). What
separates a relay line from the loop is the relay's own Python work per message: fetching
rows into Python, building each message, bookkeeping. Run it under a profiler to see where:
``py-spy record -o relay.svg -- .venv/bin/python bench/relay_inprocess.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relay import create_database, drop_database, fill, reset  # noqa: E402
from bench.relay_floor import raw_database_loop  # noqa: E402
from outbox.testing import InMemoryPublisher  # noqa: E402
from relay.relay import Relay, RelaySettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: int = args.rows
    rates: dict[str, list[float]] = {"no pipeline": [], "pipeline": [], "raw loop": []}
    engine, _dsn, name = create_database()
    try:
        fill(engine, "bench", rows)
        for round_ in range(args.rounds):
            for mode in ("no pipeline", "pipeline"):
                reset(engine, "bench")
                settings = RelaySettings(stop_when_idle=True, pipeline=mode == "pipeline")
                started = time.perf_counter()
                stats = Relay(engine, InMemoryPublisher(), settings).run()
                rates[mode].append(rows / (time.perf_counter() - started))
                assert stats.sent == rows, f"the relay sent {stats.sent} of {rows}"
            reset(engine, "bench")
            rates["raw loop"].append(raw_database_loop(engine, rows, 100))
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items()),
                flush=True,
            )
    finally:
        engine.dispose()
        drop_database(name)
    floor = statistics.median(rates["raw loop"])
    print()
    print(f"bench/relay_inprocess.py rows={rows} rounds={args.rounds} (medians)")
    print(f"{'case':<42}{'rows/s':>10}{'vs raw loop':>13}")
    print("-" * 65)
    for mode in ("no pipeline", "pipeline"):
        rate = statistics.median(rates[mode])
        print(f"{'relay, in-memory publisher, ' + mode:<42}{rate:>10,.0f}{rate / floor:>12.2f}x")
    print(f"{'raw database loop':<42}{floor:>10,.0f}{1:>12.2f}x")


if __name__ == "__main__":
    main()
