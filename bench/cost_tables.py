"""The report of ``bench/cost.py``: one Markdown table per dialect, each figure per message
(units in the column names), then per cell the top statements and the ``--windows`` figures,
and the ratio of rows scanned per message at the largest backlog to the smallest."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.consumer_support import verdict
from bench.cost_run import Cell

DIALECTS = ("postgresql", "mariadb", "sqlite")

Column = tuple[str, Callable[[Cell], str]]
GOAL = "goal <= 1.2x and <= 20 rows"
NO_STATEMENTS = (
    "Top statements and the statements' WAL: unavailable, pg_stat_statements is not in"
    " shared_preload_libraries. To enable it: bash scripts/ensure-stat-statements.sh (make"
    " bench runs it; it restarts the local PostgreSQL)."
)


def us(role: str) -> Callable[[Cell], str]:
    def cpu(cell: Cell) -> str:
        if role in ("relay", "broker") and cell.spec.path == "db":
            return "-"
        return f"{cell.per_message(cell.cpu[role]) * 1e6:,.0f}"

    return cpu


def per(key: str, digits: int = 2) -> Callable[[Cell], str]:
    return lambda cell: f"{cell.per_message(cell.usage[key]):,.{digits}f}"


def pg_wal(cell: Cell) -> str:
    text = f"{cell.per_message(cell.usage['wal']):,.0f}"
    if cell.statement_wal is not None:
        text += f" [{cell.per_message(cell.statement_wal):,.0f}]"
    return text


def maria_commits(cell: Cell) -> str:
    return f"{per('Com_commit')(cell)} ({per('Handler_commit')(cell)})"


HEAD: list[Column] = [
    ("path", lambda c: c.spec.path),
    ("backlog", lambda c: f"{c.spec.backlog:,}"),
    ("msg/s", lambda c: f"{c.spec.backlog / c.wall:,.0f}"),
    ("msg/s taken->done", lambda c: f"{c.spec.backlog / c.span:,.0f}" if c.span else "-"),
    ("drain s", lambda c: f"{c.wall:.1f}"),
    ("workers CPU us/msg", us("workers")),
]
COLUMNS: dict[str, list[Column]] = {
    "postgresql": [
        *HEAD[:2],
        ("autovacuum", lambda c: c.spec.autovacuum),
        *HEAD[2:],
        ("relay CPU us/msg", us("relay")),
        ("PG backends CPU us/msg", us("server")),
        ("broker CPU us/msg", us("broker")),
        ("commits/msg", per("xact_commit")),
        ("inserted rows/msg", per("tup_inserted")),
        ("updated rows/msg", per("tup_updated")),
        ("deleted rows/msg", per("tup_deleted")),
        ("scanned rows/msg", per("tup_returned", 1)),
        ("fetched rows/msg", per("tup_fetched", 1)),
        ("WAL bytes/msg [statements']", pg_wal),
    ],
    "mariadb": [
        *HEAD,
        ("relay CPU us/msg", us("relay")),
        ("server threads CPU us/msg", us("server")),
        ("broker CPU us/msg", us("broker")),
        ("Com_commit/msg (Handler_commit)", maria_commits),
        ("rows read/msg (Handler_read_*)", per("rows_read", 1)),
        ("Handler_write/msg", per("Handler_write")),
        ("Handler_update/msg", per("Handler_update")),
        ("Handler_delete/msg", per("Handler_delete")),
        ("redo bytes/msg", per("redo", 0)),
    ],
    "sqlite": HEAD,
}
SCANNED = {"postgresql": "tup_returned", "mariadb": "rows_read"}


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    for row in (header, ["-" * w for w in widths], *rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


def row_of(columns: Sequence[Column], cell: Cell) -> list[str]:
    if cell.error is None:
        return [fn(cell) for _, fn in columns]
    lead = [name for name, _ in columns].index("msg/s")  # path, backlog (autovacuum)
    known = [fn(cell) for _, fn in columns[:lead]]
    return [*known, f"failed: {cell.error}", *["-"] * (len(columns) - lead - 1)]


def label(cell: Cell) -> str:
    spec = cell.spec
    text = f"{spec.dialect} {spec.path} {spec.backlog:,}"
    return text + (f" autovacuum {spec.autovacuum}" if spec.dialect == "postgresql" else "")


def print_details(cells: Sequence[Cell]) -> None:
    for cell in cells:
        if cell.top:
            print(f"\nTop statements by total time, {label(cell)} (pg_stat_statements):\n")
            rows = [
                [
                    f"{s.calls:,}",
                    f"{s.total_ms:,.1f}",
                    f"{s.rows / max(1, s.calls):,.1f}",
                    f"{s.blocks / max(1, s.calls):,.1f}",
                    " ".join(s.query.split())[:100].replace("|", "\\|"),
                ]
                for s in cell.top
            ]
            markdown(["calls", "total ms", "rows/call", "shared blks hit+read/call", "query"], rows)
        if cell.windows:
            print(f"\nWindows of {cell.spec.windows:g}s, {label(cell)}:\n")
            rows = [
                [
                    f"{w.start:.1f}",
                    f"{w.end:.1f}",
                    f"{w.rate:,.0f}",
                    "-" if w.scanned is None else f"{w.scanned:,.1f}",
                ]
                for w in cell.windows
            ]
            markdown(["from s", "to s", "msg/s", "scanned (read) rows/msg"], rows)


def print_ratios(cells: Sequence[Cell], dialect: str) -> None:
    key = SCANNED[dialect]
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        if cell.error is None:
            groups.setdefault((cell.spec.path, cell.spec.autovacuum), []).append(cell)
    for (path, setting), group in groups.items():
        small = min(group, key=lambda c: c.spec.backlog)
        large = max(group, key=lambda c: c.spec.backlog)
        what = f"scanned rows/msg, {dialect} {path}" + (
            f" autovacuum {setting}" if setting != "-" else ""
        )
        if small is large:
            print(f"- {what}: one backlog only, no ratio ({GOAL})")
            continue
        a, b = small.per_message(small.usage[key]), large.per_message(large.usage[key])
        ratio = b / a if a else float("inf")
        ok = verdict(ratio <= 1.2 and b <= 20, f"{ratio:.2f}x, {b:.1f} rows")
        print(
            f"- {what}: {b:,.1f} at {large.spec.backlog:,} / {a:,.1f} at "
            f"{small.spec.backlog:,} = {ratio:.2f}x; {GOAL}: {ok}"
        )


def print_report(cells: Sequence[Cell], header: str, startup: float) -> None:
    print(f"\n{header}")
    for dialect in DIALECTS:
        mine = [c for c in cells if c.spec.dialect == dialect]
        if not mine:
            continue
        print(f"\n### {dialect}\n")
        columns = COLUMNS[dialect]
        markdown([name for name, _ in columns], [row_of(columns, c) for c in mine])
        print_details(mine)
        if dialect == "postgresql" and all(c.statement_wal is None for c in mine):
            print(f"\n{NO_STATEMENTS}")
        if dialect in SCANNED:
            print(f"\nRows scanned per message, largest backlog / smallest ({GOAL}):")
            print_ratios(mine, dialect)
    smallest = min((c.spec.backlog for c in cells), default=1)
    print(
        f"\nStart-up of one process (outbox worker --help): {startup * 1000:,.0f} ms CPU,"
        f" included in the workers' and relay's CPU ({startup / smallest * 1e6:,.0f} us/msg"
        f" per process at {smallest:,} messages)."
    )
    if any(c.spec.dialect == "mariadb" for c in cells):
        print("MariaDB's counters are global: other load on the server counts too.")
