"""Part a of ``bench/consumer.py``: the head of each serial group.

The worker's head-of-group pass against variant B (the derived-table head query this project
started from, ported to the inbox table: ``VARIANT_B`` below) on PostgreSQL and MariaDB:
20,000 unfinished rows in 1,000 groups, then with
``--history`` (default 1,000,000) done rows added. Ours is timed three ways: the full pass
(``inbox.sql.heads.waiting_heads`` over every group: at worker start, every 300 s, before an
idle stop), and the marked pass (``HeadPass.head_pass`` itself, without the promotion: the
marked groups taken from ``inbox_groups``, their marks cleared, their waiting heads read;
the marks set again, untimed, before each run) with all 1,000 groups marked (after the
upgrade, or when every group finished a message since the last pass) and with 10 marked.
Every variant must name the same heads as B for the groups it reads (the marked pass: the
heads of the groups it took, read again untimed). Goals: ours >= 10x faster
than B; with history <= 1.2x.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy import Engine, insert, select, text, true, update

from bench.consumer_support import (
    CONSUMER,
    GROUPS,
    Row,
    analyze,
    create_database,
    drop_database,
    note,
    verdict,
)
from inbox.consumer import Consumer
from inbox.engine.heads import HeadPass
from inbox.sql import heads as inbox_queries
from outbox import migrate, states
from outbox.dialect import dialect_of
from outbox.dsn import make_engine
from outbox.schema import schema_for

UNFINISHED = 20_000
FEW_MARKED = 10
PASS_CHUNK = 300  # HeadPass.head_pass's default

# --- (a) data: 20 rows per group, mixed priorities; a tenth of the groups has a processing
# row (not a head), some rows ready, the rest waiting. ids follow seq, as ingest gives them.
PG_UNFINISHED = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at)
SELECT gen_random_uuid(), :consumer, 'bench', 1 + (g * 7) % 9, 'group-' || (g % :groups),
       :base + g, 'noop', '{}'::jsonb, '{}'::jsonb,
       CASE WHEN g <= :groups AND g % 10 = 0 THEN 'processing'
            WHEN g % 7 = 0 THEN 'ready' ELSE 'waiting' END,
       0, 0, now(), now()
FROM generate_series(1, :n) AS g ORDER BY g
"""
PG_HISTORY = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at, finished_at)
SELECT gen_random_uuid(), :consumer, 'bench', 1 + (g * 7) % 9, 'group-' || (g % :groups),
       g, 'noop', '{}'::jsonb, '{}'::jsonb, 'done', 1, 0, now(), now(), now()
FROM generate_series(1, :n) AS g
"""
MARIADB_UNFINISHED = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at)
SELECT REPLACE(UUID(), '-', ''), :consumer, 'bench', 1 + (seq * 7) % 9,
       CONCAT('group-', seq % :groups), :base + seq, 'noop', '{}', '{}',
       CASE WHEN seq <= :groups AND seq % 10 = 0 THEN 'processing'
            WHEN seq % 7 = 0 THEN 'ready' ELSE 'waiting' END,
       0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM seq_1_to_{n} ORDER BY seq
"""
MARIADB_HISTORY = """
INSERT INTO inbox (event_id, consumer, queue, priority, serial_group, seq, type, payload,
                   headers, state, attempts, duplicates, available_at, received_at, finished_at)
SELECT REPLACE(UUID(), '-', ''), :consumer, 'bench', 1 + (seq * 7) % 9,
       CONCAT('group-', seq % :groups), seq, 'noop', '{}', '{}', 'done', 1, 0,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
FROM seq_1_to_{n}
"""
# Variant B, the derived-table head query this project started from, ported: queue LIKE ->
# consumer, its job states -> the states that keep a place in the group order
# (on_retry="block"). The oldest row at the group's best priority.
VARIANT_B = """
SELECT MIN(t.id) AS id
FROM inbox t
INNER JOIN (
    SELECT serial_group, MIN(priority) AS min_priority
    FROM inbox
    WHERE consumer = :consumer AND state IN (:ready, :waiting, :retry)
    GROUP BY serial_group
) head ON head.serial_group = t.serial_group AND t.priority = head.min_priority
WHERE t.consumer = :consumer AND t.state IN (:ready, :waiting, :retry)
GROUP BY t.serial_group
ORDER BY id ASC
"""
B_PARAMS = {
    "consumer": CONSUMER,
    "ready": states.READY,
    "waiting": states.WAITING,
    "retry": states.RETRY,
}


def fill_inbox(engine: Engine, dialect: str, history: bool, rows: int) -> None:
    params = {"consumer": CONSUMER, "groups": GROUPS}
    with engine.begin() as conn:
        if history:
            sql = PG_HISTORY if dialect == "postgresql" else MARIADB_HISTORY
            conn.execute(text(sql.replace("{n}", str(rows))), {**params, "n": rows})
        else:
            sql = PG_UNFINISHED if dialect == "postgresql" else MARIADB_UNFINISHED
            # seq above any history row's: history is older than the work in line.
            args = {**params, "n": UNFINISHED, "base": 10_000_000}
            conn.execute(text(sql.replace("{n}", str(UNFINISHED))), args)
    analyze(engine, dialect, "inbox")


def heads_full(engine: Engine) -> list[int]:
    stmt = inbox_queries.waiting_heads(
        schema_for().inbox, CONSUMER, datetime.now(UTC), skip_retry=False
    )
    with engine.connect() as conn:
        return [int(r.id) for r in conn.execute(stmt)]


class _PassWithoutPromotion(HeadPass):
    """``HeadPass.head_pass`` as a worker runs it (its statements, connections and round
    trips), the promotion left out: the groups whose waiting head it would promote are kept."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(Consumer(CONSUMER, queues=["bench"]), engine, job_queue=False)
        self.found: list[str] = []

    def _promote_heads(self, groups: list[str]) -> int:
        self.found.extend(groups)
        return len(groups)


def heads_marked(marked_pass: _PassWithoutPromotion) -> list[str]:
    """The groups whose head the marked pass would promote; it clears their marks."""
    marked_pass.found = []
    marked_pass.head_pass(chunk=PASS_CHUNK)
    return marked_pass.found


def restore_marks(engine: Engine, groups: set[str]) -> None:
    """Mark ``groups`` again (untimed, between runs): each run sees the same marks."""
    table = schema_for().groups
    with engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.c.consumer == CONSUMER, table.c.serial_group.in_(sorted(groups)))
            .values(needs_check=True)
        )


def mark_groups(engine: Engine, marked: int | None) -> list[str]:
    """Every group with rows in line gets its ``inbox_groups`` row (as migration 0003 builds
    them); the first ``marked`` (None: all) are marked. Returns the marked groups."""
    schema = schema_for()
    inbox, groups = schema.inbox, schema.groups
    with engine.begin() as conn:
        conn.execute(groups.delete())
        present = select(inbox.c.consumer, inbox.c.serial_group, true()).where(
            inbox.c.serial_group.is_not(None),
            inbox.c.state.in_(states.INBOX_UNFINISHED_STATES),
        )
        conn.execute(
            insert(groups).from_select(
                ["consumer", "serial_group", "needs_check"], present.distinct()
            )
        )
        names = sorted(conn.execute(select(groups.c.serial_group)).scalars())
        if marked is not None:
            conn.execute(
                update(groups)
                .where(groups.c.serial_group.not_in(names[:marked]))
                .values(needs_check=False)
            )
            names = names[:marked]
    # Statistics as autovacuum keeps them: the planner then reads the marks by their index.
    name = engine.dialect.name
    analyze(engine, "mariadb" if name in ("mysql", "mariadb") else name, groups.name)
    return names


def heads_b(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return [int(r.id) for r in conn.execute(text(VARIANT_B), B_PARAMS)]


def expected_from_b(
    engine: Engine, b_ids: Sequence[int], among: set[str] | None = None
) -> set[int]:
    """Variant B names every group's head; ours only the waiting ones of idle groups (of
    ``among``, the marked groups, for the marked pass)."""
    inbox = schema_for().inbox
    with engine.connect() as conn:
        rows = conn.execute(
            select(inbox.c.id, inbox.c.serial_group, inbox.c.state).where(
                inbox.c.state.in_(states.INBOX_UNFINISHED_STATES)
            )
        ).all()
    busy = {r.serial_group for r in rows if r.state in (states.PROCESSING, states.HALTED)}
    state_of = {int(r.id): (r.serial_group, r.state) for r in rows}
    return {
        i
        for i in b_ids
        if state_of[i][1] == states.WAITING
        and state_of[i][0] not in busy
        and (among is None or state_of[i][0] in among)
    }


def heads_of(engine: Engine, groups: Sequence[str]) -> list[int]:
    """The waiting heads of ``groups``, by the statement the marked pass reads them with."""
    arrays = dialect_of(engine).arrays
    statement = inbox_queries.waiting_heads_among(schema_for().inbox, False, arrays=arrays)
    parameters = {"consumer": CONSUMER, "now": datetime.now(UTC), "groups": sorted(groups)}
    with engine.connect() as conn:
        return [int(r.id) for r in conn.execute(statement, parameters)] if groups else []


def timed_median(
    fns: Sequence[Callable[[], Any]], runs: int, before: Callable[[], Any] = lambda: None
) -> list[float]:
    """Interleaved runs (ours, B, ours, B, ...) after one warm-up each; medians in ms.
    ``before`` runs, untimed, before each run of the first (ours)."""
    for index, fn in enumerate(fns):
        if index == 0:
            before()
        fn()
    timings: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for index, fn in enumerate(fns):
            if index == 0:
                before()
            started = time.perf_counter()
            fn()
            timings[index].append(time.perf_counter() - started)
    return [statistics.median(t) * 1000 for t in timings]


# (label, how many groups are marked: None = the full pass, which reads them all)
VARIANTS: tuple[tuple[str, int | None], ...] = (
    ("full pass", None),
    ("marked pass, all 1,000 marked", GROUPS),
    (f"marked pass, {FEW_MARKED} marked", FEW_MARKED),
)


def _measure(engine: Engine, stage: str, runs: int, mismatches: list[str]) -> list[float]:
    """Per variant: ours, then B, interleaved; ms medians [ours per variant..., B]."""
    timings: list[float] = []
    b_ms: list[float] = []
    for label, marked in VARIANTS:
        b = heads_b(engine)
        ours: set[Any]
        expected: set[Any]
        ours_fn: Callable[[], Any]
        before: Callable[[], Any]
        if marked is None:
            ours, expected = set(heads_full(engine)), expected_from_b(engine, b)
            ours_fn, before = partial(heads_full, engine), lambda: None
        else:
            among = set(mark_groups(engine, marked))
            marked_pass = _PassWithoutPromotion(engine)
            # The heads of the groups the pass took (read again, untimed), against B's.
            ours = set(heads_of(engine, heads_marked(marked_pass)))
            expected = expected_from_b(engine, b, among)
            ours_fn = partial(heads_marked, marked_pass)
            before = partial(restore_marks, engine, among)
        if ours != expected:
            mismatches.append(f"{stage} {label}: ours {len(ours)}, B {len(expected)}")
            note(f"!!! MISMATCH {stage} {label}: ours {len(ours)} heads, B {len(expected)}")
        ours_ms, one_b_ms = timed_median((ours_fn, partial(heads_b, engine)), runs, before)
        note(f"(a) {stage} {label}: {len(ours)} heads; ours {ours_ms:.2f} ms, B {one_b_ms:.1f}")
        timings.append(ours_ms)
        b_ms.append(one_b_ms)
    return [*timings, statistics.median(b_ms)]


def part_a(dialect: str, history_rows: int, runs: int) -> list[Row]:
    note(f"(a) {dialect}: heads of group, {UNFINISHED:,} unfinished rows ...")
    url = create_database(dialect, "a")
    engine = make_engine(url)
    rows: list[Row] = []
    try:
        migrate.upgrade(engine)
        fill_inbox(engine, dialect, history=False, rows=0)
        results: dict[str, list[float]] = {}
        mismatches: list[str] = []
        for stage in ("empty", "history"):
            if stage == "history":
                started = time.perf_counter()
                fill_inbox(engine, dialect, history=True, rows=history_rows)
                seconds = time.perf_counter() - started
                note(f"(a) {dialect}: {history_rows:,} done rows in {seconds:.0f}s")
            results[stage] = _measure(engine, f"{dialect} {stage}", runs, mismatches)
        for stage, label in (("empty", "20k unfinished"), ("history", f"+{history_rows:,} done")):
            b_ms = results[stage][-1]
            for index, (variant, _) in enumerate(VARIANTS):
                ours_ms = results[stage][index]
                speedup = b_ms / ours_ms
                rows.append(
                    (
                        f"(a) {dialect} heads, {label}, {variant}",
                        f"ours {ours_ms:.2f} ms, B {b_ms:.1f} ms: {speedup:.2f}x",
                        ">= 10x faster than B",
                        verdict(speedup >= 10, f"{speedup / 10:.2f} of goal"),
                    )
                )
        for index, (variant, _) in enumerate(VARIANTS):
            growth = results["history"][index] / results["empty"][index]
            rows.append(
                (
                    f"(a) {dialect} ours with/without history, {variant}",
                    f"{growth:.2f}x (B {results['history'][-1] / results['empty'][-1]:.2f}x)",
                    "<= 1.2x",
                    verdict(growth <= 1.2, f"{growth:.2f}x"),
                )
            )
        agree = "; ".join(mismatches) or "same heads in every stage"
        rows.append(
            (f"(a) {dialect} ours vs B", agree, "same heads", verdict(not mismatches, agree))
        )
    finally:
        engine.dispose()
        drop_database(dialect, url)
    return rows
