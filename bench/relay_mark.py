"""What the relay's mark-sent costs the database, per table layout (not a test).

    .venv/bin/python bench/relay_mark.py [--rows 30000] [--history 100000] [--rounds 3]

Each variant is a PostgreSQL database of its own, migrated, holding ``--history`` rows already
sent (a hot table's past) and ``--rows`` pending rows that the raw database loop of
bench/relay_floor.py drains (lock-fetch a batch with the relay's statement, mark it sent,
commit): no broker and no relay code, so the figure is the layout's. Variants, round by round
on the same machine:
- today: the migrated schema; every mark is an UPDATE of an indexed column (status), so
  PostgreSQL cannot make it a HOT update and writes a new entry into all five indexes;
- batch 500: the same, five times fewer statements and commits per row;
- fillfactor 70: room on each page for HOT updates (none happen while status is indexed);
- partial: the relay's two indexes hold pending rows only (``WHERE status = 'pending'``), so a
  row leaving ``pending`` writes no entry into them; the fetch names 'pending' as a literal,
  which the planner needs to prove the index applies;
- archive: mark moves the row to a table of sent rows (DELETE ... RETURNING into INSERT), so
  the hot table only ever holds what is due.
Columns: rows/s (median of the rounds), WAL bytes written per row, and that rate against
"today".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.relay_floor import MARK_SENT, fetch_sql, raw_database_loop  # noqa: E402
from outbox import migrate  # noqa: E402
from outbox.dsn import make_engine  # noqa: E402
from outbox.store import Message, store_many  # noqa: E402

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PAYLOAD = {"pad": "x" * 1000}

PARTIAL = (
    "DROP INDEX ix_outbox_relay",
    "DROP INDEX ix_outbox_key",
    "CREATE INDEX ix_outbox_relay ON outbox (priority, id) WHERE status = 'pending'",
    "CREATE INDEX ix_outbox_key ON outbox (queue, priority, key, id) WHERE status = 'pending'",
)
FILLFACTOR = ("ALTER TABLE outbox SET (fillfactor = 70)", "VACUUM FULL outbox")
ARCHIVE = ("CREATE TABLE outbox_sent (LIKE outbox INCLUDING DEFAULTS)",)
MOVE_SENT = (
    "WITH moved AS (DELETE FROM outbox WHERE id = ANY(%(ids)s) AND status = %(pending)s"
    " RETURNING *) INSERT INTO outbox_sent SELECT * FROM moved"
)
# The archive loop's mark carries these two parameters too; it leaves them unused.
MOVE_SENT += " WHERE %(sent)s::text IS NOT NULL AND %(now)s::timestamptz IS NOT NULL"


@dataclass
class Variant:
    name: str
    setup: tuple[str, ...] = ()
    batch: int = 100
    literal_pending: bool = False
    mark: str = MARK_SENT
    rates: list[float] = field(default_factory=list)
    wal: list[float] = field(default_factory=list)


VARIANTS = (
    Variant("today"),
    Variant("batch 500", batch=500),
    Variant("fillfactor 70", FILLFACTOR),
    Variant("partial", PARTIAL, literal_pending=True),
    Variant("partial + batch 500", PARTIAL, batch=500, literal_pending=True),
    Variant("archive", ARCHIVE, mark=MOVE_SENT),
)


def create(admin: Engine) -> tuple[Engine, str]:
    name = f"outbox_mark_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(PG_ADMIN.rsplit("/", 1)[0] + "/" + name)
    migrate.upgrade(engine)
    return engine, name


def fill(engine: Engine, rows: int, status: str) -> None:
    chunk = [Message("bench", "bench", PAYLOAD) for _ in range(1000)]
    for start in range(0, rows, 1000):
        with engine.begin() as conn:
            store_many(conn, chunk[: min(1000, rows - start)])
    if status != "pending":
        with engine.begin() as conn:
            conn.execute(text("UPDATE outbox SET status = 'sent', sent_at = now()"))


def autocommit(engine: Engine, *statements: str) -> None:
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for sql in statements:
            conn.execute(text(sql))


def reset(engine: Engine, variant: Variant, rows: int) -> None:
    """The rows the last round drained are pending again, the table vacuumed."""
    with engine.begin() as conn:
        if variant.mark is MOVE_SENT:
            conn.execute(text("UPDATE outbox_sent SET status = 'pending', sent_at = NULL"))
            conn.execute(text("INSERT INTO outbox SELECT * FROM outbox_sent"))
            conn.execute(text("TRUNCATE outbox_sent"))
        else:
            conn.execute(
                text(
                    "UPDATE outbox SET status = 'pending', sent_at = NULL WHERE id IN "
                    "(SELECT id FROM outbox ORDER BY id DESC LIMIT :rows)"
                ),
                {"rows": rows},
            )
    autocommit(engine, "VACUUM ANALYZE outbox")


def wal_position(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())


def fetch_for(engine: Engine, variant: Variant) -> tuple[str, dict[str, Any]]:
    sql, params = fetch_sql(engine, variant.batch)
    if variant.literal_pending:
        for name in [k for k, v in params.items() if v == "pending"]:
            sql = sql.replace(f"%({name})s", "'pending'")
            del params[name]
    return sql, params


def measure(engine: Engine, variant: Variant, rows: int) -> None:
    with engine.connect() as conn:
        before = wal_position(conn)
    rate = raw_database_loop(
        engine, rows, variant.batch, fetch=fetch_for(engine, variant), mark=variant.mark
    )
    with engine.connect() as conn:
        variant.wal.append((wal_position(conn) - before) / rows)
    variant.rates.append(rate)


def plan(engine: Engine, variant: Variant) -> str:
    sql, params = fetch_for(engine, variant)
    raw: Any = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(
            "EXPLAIN (COSTS OFF) " + sql.replace(" FOR UPDATE OF outbox SKIP LOCKED", ""), params
        )
        return "\n".join(r[0] for r in cur.fetchall())
    finally:
        raw.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=30_000, help="pending rows drained per round")
    parser.add_argument("--history", type=int, default=100_000, help="sent rows already there")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plans", action="store_true", help="print each variant's fetch plan")
    args = parser.parse_args()
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    made: list[tuple[Variant, Engine, str]] = []
    try:
        for variant in VARIANTS:
            print(f"preparing {variant.name} ...", flush=True)
            engine, name = create(admin)
            made.append((variant, engine, name))
            fill(engine, args.history, "sent")
            fill(engine, args.rows, "pending")
            autocommit(engine, *variant.setup, "VACUUM ANALYZE outbox")
            if args.plans:
                print(plan(engine, variant))
        for round_ in range(args.rounds):
            for variant, engine, _ in made:
                if round_:
                    reset(engine, variant, args.rows)
                measure(engine, variant, args.rows)
            print(
                f"round {round_ + 1}: "
                + ", ".join(f"{v.name} {v.rates[-1]:,.0f}" for v, _, _ in made)
            )
    finally:
        for _, engine, name in made:
            engine.dispose()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    median: Callable[[list[float]], float] = statistics.median
    base = median(made[0][0].rates)
    print()
    print(f"bench/relay_mark.py rows={args.rows} history={args.history} rounds={args.rounds}")
    print(f"{'variant':<22}{'rows/s':>10}{'WAL B/row':>11}{'vs today':>10}")
    print("-" * 53)
    for variant, _, _ in made:
        rate = median(variant.rates)
        print(f"{variant.name:<22}{rate:>10,.0f}{median(variant.wal):>11,.0f}{rate / base:>9.2f}x")


if __name__ == "__main__":
    main()
