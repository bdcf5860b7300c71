"""Parts b, c and d of ``bench/consumer.py``: jobs/s with every message stored up front.

Ours: ``outbox worker bench.consumer_handlers:consumer --stop-when-idle``, database source;
jobs/s = n / (first message taken -> last handler done), so process start-up is not counted.
``--batch-size N`` (handlers per database transaction) is passed only for the N=1 runs; the
default runs pass nothing (and drop OUTBOX_WORKER_BATCH_SIZE, and the older OUTBOX_BATCH_SIZE,
from the environment). A worker whose ``--help`` has no ``--batch-size`` gets no N=1 run: its
column reads n/a.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from functools import partial

from bench.consumer_handlers import effect_metadata
from bench.consumer_peers import (
    Measured,
    check_effects,
    pgbench_floor,
    run_pgqueuer,
    run_procrastinate,
)
from bench.consumer_support import (
    GROUPS,
    PEER_MISSING,
    Row,
    analyze,
    create_database,
    drop_database,
    dsn_of,
    inbox_span,
    note,
    ratio_verdict,
    scalar,
    spawn_ours,
    stop_all,
    store_messages,
    wait_for_count,
    worker_batch_default,
)
from outbox import migrate
from outbox.dsn import make_engine

Result = float | str  # jobs/s, or why there is no number
NO_BATCH_OPTION = "n/a (worker has no --batch-size yet)"
Floor = tuple[float, str] | None


def run_ours(
    dialect: str,
    messages: int,
    grouped: bool,
    workers: int,
    handler: str,
    batch: int | None,
    target: str = "bench.consumer_handlers:consumer",
) -> Measured:
    url = create_database(dialect, "ours")
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        if handler == "effect":
            effect_metadata.create_all(engine)
        store_messages(engine, "bench", handler, messages, grouped)
        analyze(engine, dialect, "outbox")
        started = time.perf_counter()
        processes = [
            spawn_ours(dsn_of(url), ["--poll-interval", "0.1"], batch=batch, handlers=target)
            for _ in range(workers)
        ]
        try:
            done_sql = "SELECT count(*) FROM inbox WHERE state = 'done'"
            count = partial(scalar, engine, done_sql)
            wait_for_count(count, messages, "our workers", processes)
            wall = time.perf_counter() - started
        finally:
            stop_all(processes)
        bad = scalar(engine, "SELECT count(*) FROM inbox WHERE state <> 'done'")
        if bad:
            note(f"!!! {bad} inbox rows not done")
        if handler == "effect":
            check_effects(engine, messages, "ours")
        return messages / inbox_span(engine), wall
    finally:
        engine.dispose()
        drop_database(dialect, url)


def attempt(label: str, fn: Callable[[], Measured | None], missing: str = PEER_MISSING) -> Result:
    """Run one measurement with progress lines; a failure becomes the row's text."""
    note(f"{label}: starting")
    try:
        got = fn()
    except Exception as exc:
        note(f"{label}: FAILED {exc!r}")
        return f"failed: {str(exc)[:70]}"
    if got is None:
        note(f"{label}: {missing}")
        return missing
    note(f"{label}: {got[0]:,.0f} jobs/s (wall {got[1]:.1f}s)")
    return got[0]


def rate_text(value: Result, unit: str = "jobs/s") -> str:
    return f"{value:,.0f} {unit}" if isinstance(value, float) else value


def goal_row(
    what: str,
    value: Result,
    ref: Result,
    ref_name: str,
    goal: float | None,
    ref_unit: str = "jobs/s",
) -> Row:
    """``value`` as a ratio of ``ref``; with ``goal`` a verdict, without it a report."""
    wanted = f">= {goal:g}x {ref_name}" if goal is not None else "(report)"
    if isinstance(value, float) and isinstance(ref, float):
        ratio = value / ref
        measured = f"{value:,.0f} jobs/s = {ratio:.2f}x {ref_name} ({ref:,.0f} {ref_unit})"
        return what, measured, wanted, ratio_verdict(ratio, goal) if goal is not None else "-"
    measured = f"{rate_text(value)}; {ref_name}: {rate_text(ref, ref_unit)}"
    return what, measured, wanted, "n/a" if goal is not None else "-"


def floor_result(floor: Floor) -> Result:
    return floor[0] if floor is not None else "n/a (no pgbench)"


def measure_floor(seconds: float, clients: int) -> Floor:
    note(f"(b/c) pgbench floor, {clients} clients, {seconds:g}s: starting")
    try:
        floor = pgbench_floor(seconds, clients)
    except Exception as exc:
        note(f"pgbench floor: FAILED {exc!r}")
        return None
    note(f"pgbench floor: {floor[0]:,.0f} tps" if floor else "pgbench floor: no pgbench binary")
    return floor


def part_throughput(
    part: str,
    handler: str,
    messages: int,
    workers: int,
    floor: Floor,
    pgq_drivers: Sequence[str] = ("psycopg", "asyncpg"),
) -> list[Row]:
    """(b) with ``handler`` noop, (c) with effect: ours at N=1 and N=default, the peers."""
    default = worker_batch_default()
    n_name = f"N={default} (default)" if default else "worker's default"
    kind = "no-op" if handler == "noop" else "1-row insert"
    head = f"({part}) {messages:,} {kind}"
    grouped_name = f"{GROUPS:,} groups x {max(1, messages // GROUPS)}"
    results: dict[tuple[bool, str], Result] = {}
    for grouped in (False, True):
        case = grouped_name if grouped else "no groups"
        one: Result = NO_BATCH_OPTION
        if default is not None:
            one = attempt(
                f"{head}, {case}, ours N=1",
                partial(run_ours, "postgresql", messages, grouped, workers, handler, 1),
            )
        results[grouped, "one"] = one
        results[grouped, "default"] = attempt(
            f"{head}, {case}, ours {n_name}",
            partial(run_ours, "postgresql", messages, grouped, workers, handler, None),
        )
        results[grouped, "procrastinate"] = attempt(
            f"{head}, {case}, procrastinate",
            partial(run_procrastinate, messages, grouped, workers, handler),
        )
        for driver in pgq_drivers if not grouped else ():
            results[grouped, driver] = attempt(
                f"{head}, {case}, pgqueuer ({driver} driver)",
                partial(run_pgqueuer, messages, workers, handler, driver),
            )
    tps = floor_result(floor)
    plain, groups = f"{head}, no groups", f"{head}, {grouped_name}"
    pgq = results.get((False, "psycopg"), "not run (--pgqueuer-drivers)")
    rows: list[Row] = [
        goal_row(f"{plain}: ours N=1", results[False, "one"], tps, "floor", 0.5, "tps"),
        goal_row(
            f"{plain}: ours {n_name}", results[False, "default"], pgq, "pgqueuer/psycopg", 1.0
        ),
        goal_row(
            f"{plain}: ours {n_name}",
            results[False, "default"],
            results[False, "procrastinate"],
            "procrastinate",
            5.0,
        ),
        *(
            (
                f"{plain}: pgqueuer ({d} driver, batch {os.environ.get('BENCH_PGQ_BATCH', '10')})",
                rate_text(results[False, d]),
                "(peer)" if d == "psycopg" else "(report)",
                "-",
            )
            for d in pgq_drivers
        ),
        (
            f"{plain}: procrastinate",
            rate_text(results[False, "procrastinate"]),
            "(peer)",
            "-",
        ),
        goal_row(f"{groups}: ours N=1", results[True, "one"], tps, "floor", None, "tps"),
        goal_row(
            f"{groups}: ours {n_name}",
            results[True, "default"],
            results[False, "default"],
            "ours ungrouped",
            0.7,
        ),
        goal_row(
            f"{groups}: procrastinate (lock)",
            results[True, "procrastinate"],
            results[True, "default"],
            "ours grouped",
            None,
        ),
        (f"{groups}: pgqueuer", "n/a: no serial groups in pgqueuer, run ungrouped only", "-", "-"),
    ]
    if floor is not None:
        rows.append((f"({part}) PostgreSQL floor: {floor[1]}", rate_text(tps, "tps"), "-", "-"))
    else:
        rows.append((f"({part}) PostgreSQL floor: pgbench", rate_text(tps), "-", "-"))
    if handler == "effect":
        rows.append(
            (
                f"({part}) atomicity of the inserted row",
                "ours: in the handler's transaction, with the ack; pgqueuer, procrastinate:"
                " own connection, NOT atomic with their ack",
                "-",
                "-",
            )
        )
    return rows


def part_d(messages: int, workers: int, sqlite_workers: int) -> list[Row]:
    """Ours on MariaDB and SQLite, no-op, without and with groups, the default batch size."""
    default = worker_batch_default()
    n_name = f"N={default}" if default else "worker's default N"
    rows: list[Row] = []
    for dialect, count in (("mariadb", workers), ("sqlite", sqlite_workers)):
        head = f"(d) {dialect}, {messages:,} no-op, {count} worker(s), {n_name}"
        plain = attempt(
            f"{head}, no groups",
            partial(run_ours, dialect, messages, False, count, "noop", None),
        )
        grouped = attempt(
            f"{head}, groups",
            partial(run_ours, dialect, messages, True, count, "noop", None),
        )
        rows.append((f"{head}, no groups", rate_text(plain), "(report)", "-"))
        rows.append(goal_row(f"{head}, {GROUPS:,} groups", grouped, plain, "ungrouped", None))
    return rows


ASYNC_TARGET = "bench.consumer_handlers:async_consumer"


def part_g(
    messages: int, workers: int, dialects: Sequence[str] = ("postgresql", "sqlite")
) -> list[Row]:
    """No-op jobs/s of an ``async def`` handler next to the sync one, same run, no groups,
    at N=1 and the default N: what running handlers on an event loop costs."""
    default = worker_batch_default()
    rows: list[Row] = []
    for dialect in dialects:
        for batch, n_name in ((1, "N=1"), (None, f"N={default}" if default else "default N")):
            head = f"(g) {dialect}, no-op, no groups, {workers} workers, {n_name}"
            plain = attempt(
                f"{head}, sync handler",
                partial(run_ours, dialect, messages, False, workers, "noop", batch),
            )
            awaited = attempt(
                f"{head}, async handler",
                partial(run_ours, dialect, messages, False, workers, "noop", batch, ASYNC_TARGET),
            )
            rows.append((f"{head}, sync handler", rate_text(plain), "(report)", "-"))
            rows.append(goal_row(f"{head}, async handler", awaited, plain, "sync", None))
    return rows
