"""The database's own limit for the relay's work (not a test): no broker, no relay code.

Each loop does what one relay batch does to the database: begin, lock-fetch the due rows
with the relay's own statement (``relay.queries.fetch_due``, compiled once, so the plan is
the relay's plan), mark the fetched rows sent, commit with ``synchronous_commit = off`` as
the relay does. It runs on psycopg directly, so the figure is the server's and the driver's
cost, without SQLAlchemy's or ours. ``connections`` loops run at once, one thread each
(psycopg releases the GIL while it waits), like that many relays.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Engine

from outbox import states
from outbox.schema import outbox_table
from relay import queries

MARK_SENT = (
    "UPDATE outbox SET status = %(sent)s, sent_at = %(now)s"
    " WHERE id = ANY(%(ids)s) AND status = %(pending)s"
)


def fetch_sql(engine: Engine, batch: int) -> tuple[str, dict[str, Any]]:
    stmt = queries.fetch_due(outbox_table, limit=batch, queues=(), lock=True)
    compiled = stmt.compile(dialect=engine.dialect)
    return str(compiled), {**compiled.params, "now": datetime.now(UTC)}


def _libpq_dsn(engine: Engine) -> str:
    url = engine.url
    return f"host={url.host} port={url.port or 5432} user={url.username} dbname={url.database}"


def raw_database_loop(
    engine: Engine,
    rows: int,
    batch: int,
    connections: int = 1,
    *,
    fetch: tuple[str, dict[str, Any]] | None = None,
    mark: str = MARK_SENT,
) -> float:
    """Drain ``rows`` pending rows in batches of ``batch``; returns rows per second.
    ``fetch`` / ``mark``: other statements than the relay's (bench/relay_mark.py's variants)."""
    sql, params = fetch or fetch_sql(engine, batch)
    now_keys = [k for k, v in params.items() if isinstance(v, datetime)]
    done = [0] * connections
    errors: list[BaseException] = []
    start = threading.Barrier(connections + 1)

    def loop(slot: int) -> None:
        try:
            with psycopg.connect(_libpq_dsn(engine)) as conn:
                start.wait()
                while True:
                    now = datetime.now(UTC)
                    with conn.transaction():
                        conn.execute("SET LOCAL synchronous_commit = off")
                        fetched = conn.execute(sql, {**params, **dict.fromkeys(now_keys, now)})
                        ids = [r[0] for r in fetched.fetchall()]
                        if not ids:
                            return
                        conn.execute(
                            mark,
                            {
                                "sent": states.SENT,
                                "pending": states.PENDING,
                                "now": now,
                                "ids": ids,
                            },
                        )
                    done[slot] += len(ids)
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    assert sum(done) == rows, f"raw loop marked {sum(done)} of {rows} rows"
    return rows / elapsed
