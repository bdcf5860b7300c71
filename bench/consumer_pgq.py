"""pgqueuer's worker for ``bench/consumer.py`` (a bench-only install, not a dependency):

    BENCH_PGQ_DSN=postgresql://... python -m bench.consumer_pgq

That is ``pgq run bench.consumer_pgq:create`` through ``pgqueuer.run`` (the same supervisor
and defaults, on uvloop when installed, as ``pgq run`` picks): ``pgq run`` itself fails at
start with pgqueuer 1.6 and typer 0.29 (its ``--log-level`` parser hands a str to
``setup_fancy_logger``). Its defaults but for the driver, which the bench names:
``PsycopgDriver`` on one autocommit psycopg connection (what ``pgq`` falls back to without
asyncpg), batch size 10, dequeue timeout 30 s. Entrypoints: ``noop`` does nothing;
``effect`` inserts the ``bench_effect`` row on a second connection of its own, so the row
commits before, and apart from, pgqueuer's acknowledgement (its log / delete of the job):
not atomic with it.

BENCH_PGQ_DRIVER=asyncpg runs it on ``AsyncpgDriver`` instead (what ``pgq`` picks first when
asyncpg is installed). On ``PsycopgDriver`` one connection serves both the dequeue queries and
the LISTEN watcher, whose ``notifies(timeout=1.0)`` holds the connection's lock: a job that
awaits anything leaves the next dequeue waiting for a NOTIFY or that second, so ``effect``
runs at tens of jobs/s there against hundreds on asyncpg (seen in the smoke runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from bench.consumer_handlers import EFFECT_SQL

if TYPE_CHECKING:
    from pgqueuer import QueueManager


@asynccontextmanager
async def create() -> AsyncIterator[Any]:
    """A QueueManager on the driver BENCH_PGQ_DRIVER names: psycopg (default) or asyncpg."""
    dsn = os.environ["BENCH_PGQ_DSN"]
    if os.environ.get("BENCH_PGQ_DRIVER", "psycopg") == "asyncpg":
        async with asyncpg_manager(dsn) as manager:
            yield manager
    else:
        async with psycopg_manager(dsn) as manager:
            yield manager


@asynccontextmanager
async def psycopg_manager(dsn: str) -> AsyncIterator[Any]:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager

    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as effect_connection,
    ):
        manager = QueueManager(Queries(PsycopgDriver(connection)))

        async def insert(ref: str) -> None:
            await effect_connection.execute(EFFECT_SQL, (ref,))

        register(manager, insert)
        yield manager


@asynccontextmanager
async def asyncpg_manager(dsn: str) -> AsyncIterator[Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    connection = await asyncpg.connect(dsn)
    effect_connection = await asyncpg.connect(dsn)
    lock = asyncio.Lock()  # one asyncpg connection runs one query at a time
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        async def insert(ref: str) -> None:
            async with lock:
                await effect_connection.execute(EFFECT_SQL.replace("%s", "$1"), ref)

        register(manager, insert)
        yield manager
    finally:
        await effect_connection.close()
        await connection.close()


def register(manager: QueueManager, insert: Callable[[str], Awaitable[None]]) -> None:
    @manager.entrypoint("noop", accepts_context=False)
    async def noop(job: Any) -> None:
        """Nothing, like our ``noop``."""

    @manager.entrypoint("effect", accepts_context=False)
    async def effect(job: Any) -> None:
        await insert(f"pgqueuer-{job.id}")


async def enqueue(dsn: str, entrypoint: str, n: int, chunk: int = 1000) -> None:
    """``n`` jobs with the bench's mixed priorities (pgqueuer: larger is more urgent), through
    its batch ``enqueue``, ``chunk`` per call (autocommit: one commit each)."""
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    from bench.consumer_support import priority_of

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        queries = Queries(PsycopgDriver(connection))
        for start in range(0, n, chunk):
            ids = range(start + 1, min(n, start + chunk) + 1)
            await queries.enqueue(
                [entrypoint] * len(ids),
                [f'{{"i": {i}}}'.encode() for i in ids],
                [10 - priority_of(i) for i in ids],
            )


def main() -> None:
    from pgqueuer import run

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    # BENCH_PGQ_BATCH: pgqueuer's batch size (its default 10; its tuned runs use 100).
    batch = int(os.environ.get("BENCH_PGQ_BATCH", "10"))
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(create, batch_size=batch))
    else:
        uvloop.run(run(create, batch_size=batch))


if __name__ == "__main__":
    main()
