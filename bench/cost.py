"""What draining a backlog costs, per message: CPU, commits, rows, WAL (not a test).

    .venv/bin/python bench/cost.py                        # PostgreSQL and MariaDB, 10k and 100k
    .venv/bin/python bench/cost.py --path db --backlog 300000 --autovacuum off --windows 10
    .venv/bin/python bench/cost.py --path db --backlog 150000 --hold-snapshot --windows 10

Each cell (path x dialect x backlog x autovacuum) stores ``backlog`` no-op messages in a
database of its own (``outbox_bench_cost_*``) before any process starts, runs VACUUM ANALYZE
(MariaDB, SQLite: ANALYZE), reads the counters, drains the backlog (bench/cost_run.py) and
reads them again. One Markdown table per dialect; every figure is per message except msg/s
(backlog / seconds from the processes' start to the last message done; "taken->done": from
the first message taken to the last handler done, start-up left out) and the drain time.
CPU columns (microseconds per message): the workers and the relay from start to exit, start-up
included (its size is printed); PostgreSQL's backends serving the bench database (autovacuum
workers included); MariaDB's threads serving it; the broker's processes (RabbitMQ's serve
whoever else uses the server too). PostgreSQL counters come from ``pg_stat_database`` of the
bench database; WAL bytes from ``pg_current_wal_lsn()`` (the whole server's) and, in
brackets, from ``pg_stat_statements`` (the bench database's statements only). MariaDB's come
from global status (bench/cost_counters.py). SQLite: one worker, its CPU and the time only.
Below the tables: the five statements of the most time per cell (pg_stat_statements), the
``--windows`` figures, and the ratio of rows scanned per message at the largest backlog to
the smallest, against the goal "<= 1.2x and <= 20 rows". The bench prints; it asserts nothing.

The server's autovacuum is switched with ALTER SYSTEM + reload for the cells that ask for it,
and put back as it was at the end, also after an error or Ctrl-C.

Parts: bench/cost_run.py (one cell), bench/cost_probe.py (CPU), bench/cost_counters.py (the
databases' counters), bench/cost_tables.py (the report).
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.consumer_support import ADMIN, note, python_env  # noqa: E402
from bench.cost_counters import pg_link  # noqa: E402
from bench.cost_probe import Children  # noqa: E402
from bench.cost_run import Cell, Spec, run_cell  # noqa: E402
from bench.cost_tables import DIALECTS, NO_STATEMENTS, label, print_report  # noqa: E402

PATHS = ("db", "rabbitmq", "kafka")
BOOLEAN = re.compile(r"^(on|off|true|false|yes|no|1|0)$")


class Autovacuum:
    """The server's ``autovacuum``: switched by ALTER SYSTEM + ``pg_reload_conf()`` (it is
    reloadable), and put back: the value ``postgresql.auto.conf`` had, or RESET if none;
    left alone if someone else has set it meanwhile."""

    def __init__(self) -> None:
        self.link = pg_link(make_url(ADMIN["postgresql"]))
        self.original = self.show()
        self.auto_conf = self.in_auto_conf()
        source = self.link.rows(
            "SELECT source, coalesce(sourcefile, '') FROM pg_settings WHERE name = 'autovacuum'"
        )[0]
        self.source = f"{source[0]} {source[1]}".strip()
        self.mine: str | None = None  # what this run wrote, if it wrote anything

    def show(self) -> str:
        return str(self.link.one("SHOW autovacuum"))

    def in_auto_conf(self) -> str | None:
        sql = "SELECT setting FROM pg_file_settings WHERE name = 'autovacuum'"
        sql += " AND sourcefile LIKE %s ORDER BY seqno DESC LIMIT 1"
        rows = self.link.rows(sql, "%postgresql.auto.conf")
        return str(rows[0][0]).lower() if rows else None

    def _reload(self, expected: str) -> None:
        self.link.rows("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while self.show() != expected and time.monotonic() < deadline:
            time.sleep(0.1)

    def set(self, value: str) -> None:
        if self.show() == value:
            return
        literal = {"on": "on", "off": "off"}[value]  # ours, not the input's text
        self.link.rows(f"ALTER SYSTEM SET autovacuum = {literal}")
        self.mine = literal
        self._reload(value)
        print(f"autovacuum switched to {value} (ALTER SYSTEM; now {self.show()})", flush=True)

    def restore(self) -> None:
        try:
            if self.mine is None:
                return
            found = self.in_auto_conf()
            if found != self.mine:
                print(f"autovacuum: set to {found} by someone else meanwhile; left as it is")
                return
            if self.auto_conf is not None and BOOLEAN.match(self.auto_conf):
                self.link.rows(f"ALTER SYSTEM SET autovacuum = {self.auto_conf}")
            else:
                self.link.rows("ALTER SYSTEM RESET autovacuum")
            self._reload(self.original)
            print(f"autovacuum restored: {self.show()} (was {self.original})", flush=True)
        finally:
            self.link.close()


def startup_cpu() -> float:
    """CPU seconds of one ``outbox worker --help``: about what each process's start costs."""
    children = Children()
    args = [sys.executable, "-m", "outbox_cli", "worker", "--help"]
    children.add(
        "start", subprocess.Popen(args, cwd=ROOT, env=python_env(), stdout=subprocess.DEVNULL)
    )
    children.wait(None, 60)
    return children.cpu("start")


def choices(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"{what}: choose from {', '.join(allowed)}")
    return items


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--path",
        type=lambda v: choices(v, PATHS, "--path"),
        default=list(PATHS),
        help="Comma-separated paths: db (workers read the database), rabbitmq, kafka (a relay"
        " publishes, workers read the broker); SQLite runs db only. Default: all three.",
    )
    parser.add_argument(
        "--dialect",
        type=lambda v: choices(v, DIALECTS, "--dialect"),
        default=["postgresql", "mariadb"],
        help="Comma-separated databases: postgresql, mariadb, sqlite. Default: postgresql,mariadb.",
    )
    parser.add_argument(
        "--backlog",
        type=lambda v: [int(b.replace("_", "")) for b in v.split(",") if b.strip()],
        default=[10_000, 100_000],
        help="Comma-separated numbers of messages stored before each drain. Default: 10000,100000.",
    )
    parser.add_argument(
        "--big", action="store_true", help="Add a backlog of 1,000,000 messages (long)."
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="Worker processes per cell (SQLite: always 1). Default: 2.",
    )
    parser.add_argument(
        "--autovacuum",
        choices=("on", "off", "both", "server"),
        default="both",
        help="Run the PostgreSQL cells with autovacuum on, off, each (both), or as the server"
        " has it (server). Default: both.",
    )
    parser.add_argument(
        "--hold-snapshot",
        action="store_true",
        help="Keep a REPEATABLE READ transaction that has read one row open during each drain"
        " (PostgreSQL, MariaDB).",
    )
    parser.add_argument(
        "--windows",
        type=float,
        metavar="S",
        help="Also print msg/s and rows scanned per message in each S-second window of a drain"
        " (PostgreSQL, MariaDB; scanned rows lag up to 1 s on PostgreSQL).",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="Keep the bench databases and RabbitMQ queues (their names go to stderr).",
    )
    return parser.parse_args()


def specs_for(args: argparse.Namespace, dialect: str, autovacuum: str) -> list[Spec]:
    backlogs = sorted(set(args.backlog) | ({1_000_000} if args.big else set()))
    paths = ["db"] if dialect == "sqlite" else args.path
    workers = 1 if dialect == "sqlite" else args.workers
    hold = args.hold_snapshot and dialect != "sqlite"
    return [
        Spec(dialect, path, backlog, workers, autovacuum, hold, args.windows, args.keep)
        for path in paths
        for backlog in backlogs
    ]


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks run
    command = shlex.join(sys.orig_argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    cells: list[Cell] = []
    settings: list[str] = []
    autovacuum = Autovacuum() if "postgresql" in args.dialect else None
    started = time.monotonic()
    try:
        if autovacuum is not None:
            print(f"server autovacuum: {autovacuum.original} ({autovacuum.source})", flush=True)
            if "pg_stat_statements" not in str(
                autovacuum.link.one("SHOW shared_preload_libraries")
            ):
                print(NO_STATEMENTS, flush=True)
            wanted = {"both": ["on", "off"], "server": [autovacuum.original]}
            settings = wanted.get(args.autovacuum, [args.autovacuum])
            for setting in settings:
                autovacuum.set(setting)
                for spec in specs_for(args, "postgresql", setting):
                    cells.append(run_cell(spec))
                    if (now := autovacuum.show()) != setting:
                        print(
                            f"!!! autovacuum was {now} after {label(cells[-1])}: changed by"
                            " someone else",
                            flush=True,
                        )
        for dialect in (d for d in args.dialect if d != "postgresql"):
            cells += [run_cell(s) for s in specs_for(args, dialect, "-")]
    finally:
        if autovacuum is not None:
            autovacuum.restore()
    note(f"all cells done in {time.monotonic() - started:.0f}s")
    header = f"{time.strftime('%Y-%m-%d %H:%M')}, commit {commit or '?'}, autovacuum "
    header += ", ".join(settings) if settings else "n/a"
    print_report(cells, f"{header}, $ {command}", startup_cpu())


if __name__ == "__main__":
    main()
