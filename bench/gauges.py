"""How long the database gauge refresh takes at 1,000,000 outbox rows.

    .venv/bin/python bench/gauges.py                       # PostgreSQL, healthy + backlog
    .venv/bin/python bench/gauges.py --dialect mariadb
    .venv/bin/python bench/gauges.py --rows 200000 --keep  # keep the database to explore

Creates a database of its own (outbox_bench_gauges_*), migrates it, fills the outbox and inbox
tables server-side (INSERT ... SELECT over generate_series / MariaDB's seq_1_to_N) and times
``outbox.metrics.read_snapshot`` (the two grouped queries a refresh runs). Two shapes:

- healthy: 1% of the rows pending, 0.1% failed, the rest sent (compaction not yet run);
- backlog: every row pending (a long broker outage), the worst case for the pending query.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url

from outbox import migrate
from outbox.dsn import make_engine
from outbox.metrics import read_snapshot
from outbox.ops import queries
from outbox.schema import schema_for

ADMIN = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/mysql",
}

PG_FILL = """
INSERT INTO outbox (event_id, queue, priority, type, payload, headers, occurred_at,
                    available_at, status, attempts, sent_at)
SELECT gen_random_uuid(), 'queue' || (g % 5), 1 + (g % 3), 'bench', '{}'::jsonb, '{}'::jsonb,
       t, t, s, CASE WHEN s = 'failed' THEN 5 ELSE 0 END, CASE WHEN s = 'sent' THEN t END
FROM (
  SELECT g, now() - make_interval(secs => (:n - g) / 10.0) AS t,
         CASE WHEN :all_pending OR g > :n - :pending THEN 'pending'
              WHEN g % 1000 = 0 THEN 'failed' ELSE 'sent' END AS s
  FROM generate_series(1, :n) AS g
) AS src
"""
PG_INBOX = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at, finished_at)
SELECT gen_random_uuid(), 'consumer' || (g % 3), 'queue' || (g % 5), 1 + (g % 3),
       'group-' || (g % 1000), g, 'bench', '{}'::jsonb, '{}'::jsonb,
       CASE WHEN g > :n - 300 THEN 'waiting' WHEN g > :n - 600 THEN 'ready' ELSE 'done' END,
       1, 0, now(), now() - make_interval(secs => (:n - g) / 10.0),
       CASE WHEN g <= :n - 600 THEN now() END
FROM generate_series(1, :n) AS g
"""
MARIADB_FILL = """
INSERT INTO outbox (event_id, queue, priority, type, payload, headers, occurred_at,
                    available_at, status, attempts, sent_at)
SELECT REPLACE(UUID(), '-', ''), CONCAT('queue', seq % 5), 1 + (seq % 3), 'bench', '{}', '{}',
       t, t, s, IF(s = 'failed', 5, 0), IF(s = 'sent', t, NULL)
FROM (
  SELECT seq, UTC_TIMESTAMP(6) - INTERVAL ((:n - seq) / 10) SECOND AS t,
         CASE WHEN :all_pending OR seq > :n - :pending THEN 'pending'
              WHEN seq % 1000 = 0 THEN 'failed' ELSE 'sent' END AS s
  FROM seq_1_to_{n}
) AS src
"""
MARIADB_INBOX = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at, finished_at)
SELECT REPLACE(UUID(), '-', ''), CONCAT('consumer', seq % 3), CONCAT('queue', seq % 5),
       1 + (seq % 3), CONCAT('group-', seq % 1000), seq, 'bench', '{}', '{}',
       CASE WHEN seq > :n - 300 THEN 'waiting' WHEN seq > :n - 600 THEN 'ready' ELSE 'done' END,
       1, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL ((:n - seq) / 10) SECOND,
       IF(seq <= :n - 600, UTC_TIMESTAMP(6), NULL)
FROM seq_1_to_{n}
"""


def create_database(dialect: str) -> URL:
    name = f"outbox_bench_gauges_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ADMIN[dialect], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        else:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    admin.dispose()
    return make_url(ADMIN[dialect]).set(database=name)


def drop_database(dialect: str, url: URL) -> None:
    admin = create_engine(ADMIN[dialect], isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
        else:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{url.database}`"))
    admin.dispose()


def fill(engine: Engine, dialect: str, rows: int, all_pending: bool) -> float:
    started = time.perf_counter()
    params = {"n": rows, "pending": rows // 100, "all_pending": all_pending}
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM outbox"))
        conn.execute(text("DELETE FROM inbox"))
        if dialect == "postgresql":
            conn.execute(text(PG_FILL), params)
            conn.execute(text(PG_INBOX), params)
        else:
            conn.execute(text(MARIADB_FILL.replace("{n}", str(rows))), params)
            conn.execute(text(MARIADB_INBOX.replace("{n}", str(rows))), params)
    # Fresh statistics, as autovacuum/InnoDB would have after a while in production.
    if dialect == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE outbox"))
            conn.execute(text("VACUUM ANALYZE inbox"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE TABLE outbox, inbox"))
    return time.perf_counter() - started


def explain(engine: Engine, dialect: str) -> str:
    schema = schema_for()
    stmt = queries.outbox_gauges(schema.outbox, datetime.now(UTC))
    compiled = stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True})
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if dialect == "postgresql" else "EXPLAIN "
    with engine.connect() as conn:
        return "\n".join(str(r) for r in conn.execute(text(prefix + str(compiled))))


def time_refresh(engine: Engine, runs: int) -> list[float]:
    schema = schema_for()
    read_snapshot(engine, schema, datetime.now(UTC))  # warm the pool and the cache
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        read_snapshot(engine, schema, datetime.now(UTC))
        timings.append(time.perf_counter() - started)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialect", choices=sorted(ADMIN), default="postgresql")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="Do not drop the database.")
    parser.add_argument("--explain", action="store_true", help="Print the query plan.")
    parser.add_argument("--shape", choices=("healthy", "backlog", "both"), default="both")
    parser.add_argument(
        "--covering-index",
        action="store_true",
        help="First add an index on outbox (status, queue, priority, available_at), to see "
        "what an index-only gauge query would cost.",
    )
    args = parser.parse_args()

    url = create_database(args.dialect)
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        if args.covering_index:
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "CREATE INDEX ix_outbox_gauges"
                        " ON outbox (status, queue, priority, available_at)"
                    )
                )
        shapes = [("healthy", False), ("backlog", True)]
        for shape, all_pending in shapes:
            if args.shape not in (shape, "both"):
                continue
            filled = fill(engine, args.dialect, args.rows, all_pending)
            timings = time_refresh(engine, args.runs)
            extra = " with the covering index" if args.covering_index else ""
            print(
                f"{args.dialect} {shape}{extra}: {args.rows:,} outbox rows"
                f" + {args.rows:,} inbox rows "
                f"(filled in {filled:.1f}s); gauge refresh over {args.runs} runs: "
                f"median {statistics.median(timings) * 1000:.1f} ms, "
                f"max {max(timings) * 1000:.1f} ms"
            )
            if args.explain:
                print(explain(engine, args.dialect))
    finally:
        engine.dispose()
        if args.keep:
            print(f"kept {url.render_as_string(hide_password=True)}")
        else:
            drop_database(args.dialect, url)


if __name__ == "__main__":
    main()
