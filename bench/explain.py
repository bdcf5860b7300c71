"""EXPLAIN of every hot query on PostgreSQL and MariaDB, written to docs/indexes.md.

    .venv/bin/python bench/explain.py [--rows 200000] [--out docs/indexes.md]

Fills a database of its own with ``--rows`` outbox rows (1% pending, the rest sent: a table
before compaction) in 1,000 serial groups and as many inbox rows (600 unfinished), then
EXPLAINs the statements the relay, the worker and the gauges run, exactly as the code builds
them (imported from relay/queries.py, inbox/sql/heads.py, outbox/ops/queries.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, select, text, true

# bench/ holds relay.py: keep the script's folder off the import path so `relay` is the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from inbox.sql import groups as groups_q  # noqa: E402
from inbox.sql import heads as inbox_q  # noqa: E402
from outbox import migrate  # noqa: E402
from outbox.dialect import POSTGRESQL  # noqa: E402
from outbox.dsn import make_engine  # noqa: E402
from outbox.ops import queries as ops_q  # noqa: E402
from outbox.schema import schema_for  # noqa: E402
from relay import queries as relay_q  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_gauges", Path(__file__).parent / "gauges.py")
assert _spec is not None and _spec.loader is not None
_gauges = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gauges)
create_database, drop_database, fill = _gauges.create_database, _gauges.drop_database, _gauges.fill

NOW = datetime.now(UTC)
S = schema_for()

QUERIES: list[tuple[str, str, Callable[[], Any]]] = [
    (
        "Relay fetch: due pending rows, (priority, id), head of each key, SKIP LOCKED",
        "ix_outbox_relay walks pending rows already in (priority, id) order and stops at the "
        "LIMIT; the per-key NOT EXISTS is one seek on ix_outbox_key (queue, priority, key, "
        "status, id).",
        lambda: relay_q.fetch_due(S.outbox, limit=100, queues=(), lock=True).params(now=NOW),
    ),
    (
        "Worker: blocker of a grouped message (PROCESSING clause OR ahead in (priority, seq))",
        "ix_inbox_group (consumer, serial_group, state, priority, seq): only the group's "
        "unfinished rows are read, LIMIT 1, never its done history.",
        lambda: inbox_q.inbox_blocker(
            S.inbox,
            consumer="consumer1",
            group="group-7",
            row_id=10**9,
            priority=2,
            seq=10**9,
            now=NOW,
            skip_retry=False,
        ),
    ),
    (
        "Worker, job-queue deployment: an undelivered outbox row of the group ahead of me",
        "ix_outbox_group (queue, serial_group, status, priority, id): pending rows of the group "
        "only; sent rows inside the in-flight window are checked against the inbox unique key.",
        lambda: inbox_q.outbox_blocker(
            S.outbox,
            S.inbox,
            consumer="consumer1",
            queues=["queue1"],
            group="group-7",
            priority=2,
            seq=10**9,
            sent_since=NOW - timedelta(seconds=30),
        ),
    ),
    (
        "Worker: full head-of-group pass (waiting groups whose head may run)",
        "The derived table of variant B (bench/consumer_heads.py): grouped over the "
        "consumer's rows in line (ix_inbox_claim "
        "on consumer, state), so its cost follows the unfinished rows, not history. At "
        "start, every 300 s and before an idle stop.",
        lambda: inbox_q.waiting_heads(S.inbox, "consumer1", NOW, False),
    ),
    (
        "Worker: marked head-of-group pass, the groups marked for it",
        "ix_inbox_groups_check (consumer, needs_check, serial_group): marked groups in name "
        "order, however many groups and rows the consumer has. Every 5 s.",
        lambda: groups_q.to_check(S.groups, POSTGRESQL, first=False).params(
            consumer="consumer1", after="", limit=300
        ),
    ),
    (
        "Worker: marked head-of-group pass, the waiting heads of those groups",
        "ix_inbox_group (consumer, serial_group, state, ...): the marked groups' rows in line "
        "only.",
        lambda: inbox_q.waiting_heads(
            S.inbox, "consumer1", NOW, False, groups=["group-7", "group-8", "group-9"]
        ),
    ),
    (
        "Worker: claim candidates (ready rows of a consumer, most urgent first)",
        "ix_inbox_claim (consumer, state, priority, seq): an index range already in order.",
        lambda: inbox_q.candidates(S.inbox, "consumer1", NOW, 20),
    ),
    (
        "Gauges: pending count and oldest due pending age per queue/priority, failed count",
        "ix_outbox_relay (status, ...): reads pending and failed rows only, not the sent "
        "history; run at most once per refresh interval.",
        lambda: ops_q.outbox_gauges(S.outbox, NOW),
    ),
    (
        "Gauges: inbox waiting/processing/failed per consumer",
        "ix_inbox_finished (state, finished_at) and ix_inbox_claim: unfinished states only.",
        lambda: ops_q.inbox_gauges(S.inbox),
    ),
]


def explain(engine: Engine, dialect: str, build: Callable[[], Any]) -> str:
    compiled = build().compile(
        dialect=engine.dialect,
        compile_kwargs={"literal_binds": True, "render_postcompile": True},
    )
    prefix = (
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) "
        if dialect == "postgresql"
        else "EXPLAIN "
    )
    with engine.begin() as conn:
        rows = conn.execute(text(prefix + str(compiled))).all()
    if dialect == "postgresql":
        return "\n".join(r[0] for r in rows)
    header = "id | select_type | table | type | key | rows | Extra"
    lines = [header]
    for r in rows:
        m = r._mapping
        lines.append(
            f"{m['id']} | {m['select_type']} | {m['table']} | {m['type']} | {m['key']} | "
            f"{m['rows']} | {m['Extra']}"
        )
    return "\n".join(lines)


KEPT_MARKER = "<!-- not generated: bench/explain.py keeps what follows -->"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--out", default="docs/indexes.md")
    args = parser.parse_args()
    sections: dict[str, dict[str, str]] = {}
    for dialect in ("postgresql", "mariadb"):
        url = create_database(dialect)
        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
            fill(engine, dialect, args.rows, all_pending=False)
            concat = (
                "'group-' || (id % 1000)"
                if dialect == "postgresql"
                else "CONCAT('group-', id % 1000)"
            )
            with engine.begin() as conn:
                quoted_key = '"key"' if dialect == "postgresql" else "`key`"
                conn.execute(
                    text(f"UPDATE outbox SET serial_group = {concat}, {quoted_key} = {concat}")
                )
            with engine.begin() as conn:
                # Every inbox group gets its inbox_groups row, as migration 0003 builds them.
                i = S.inbox.c
                present = select(i.consumer, i.serial_group, true()).where(
                    i.serial_group.is_not(None)
                )
                columns = ["consumer", "serial_group", "needs_check"]
                conn.execute(insert(S.groups).from_select(columns, present.distinct()))
            with engine.begin() as conn:
                for name in ("outbox", "inbox_groups"):
                    analyze = "ANALYZE" if dialect == "postgresql" else "ANALYZE TABLE"
                    conn.execute(text(f"{analyze} {name}"))
            for title, _why, build in QUERIES:
                sections.setdefault(title, {})[dialect] = explain(engine, dialect, build)
        finally:
            engine.dispose()
            drop_database(dialect, url)

    out = [
        "# Indexes and the hot queries they serve",
        "",
        f"Generated by `.venv/bin/python bench/explain.py --rows {args.rows}` "
        f"({args.rows:,} outbox rows, 1% pending, the rest sent; {args.rows:,} inbox rows, 600 "
        "unfinished; 1,000 serial groups). The statements are the ones the code runs, built by "
        "the same functions. Re-run it after changing a query or an index.",
        "",
        "| table | index | columns |",
        "|---|---|---|",
    ]
    for table in (S.outbox, S.inbox, S.audit, S.groups):
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            cols = ", ".join(c.name for c in index.columns)
            out.append(f"| {table.name} | {index.name} | {cols} |")
    out.append("| outbox | uq_outbox_event_id (unique) | event_id |")
    out.append("| inbox | uq_inbox_event_consumer (unique) | event_id, consumer |")
    for title, why, _build in QUERIES:
        out += ["", f"## {title}", "", f"Why: {why}", ""]
        for dialect in ("postgresql", "mariadb"):
            out += [
                f"{'PostgreSQL 15' if dialect == 'postgresql' else 'MariaDB 10.11'}:",
                "",
                "```",
                sections[title][dialect],
                "```",
                "",
            ]
    text_out = "\n".join(out).rstrip() + "\n"
    target = Path(args.out)
    # What other benchmarks measured (the relay's mark) is kept below the marker.
    kept = target.read_text().partition(KEPT_MARKER) if target.exists() else ("", "", "")
    if kept[1]:
        text_out += "\n" + KEPT_MARKER + kept[2]
    target.write_text(text_out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
