"""``outbox worker`` and ``outbox relay`` start fast.

Every supervisord restart, every CLI call and every test process pays the start-up, so:

- ``--help`` of both imports none of the modules they do not need: the operator commands,
  the operator page, Alembic, the brokers' clients, the database drivers, SQLAlchemy's ORM
  (a deterministic guard: the modules a child process had loaded when it exited);
- it takes at most 1.5x ``python -c "import sqlalchemy, psycopg"``, measured in the same test
  (medians of runs that alternate, so a busy machine slows both sides alike);
- a worker and a relay that run on SQLite load no client of a broker they do not use, and
  neither psycopg nor Alembic nor the operator page;
- the group still lists every command with its line, from the modules that define them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
from click.testing import CliRunner
from sqlalchemy import create_engine

from inbox.cli import commands as inbox_commands
from inbox.cli import inbox_group
from inbox.cli.ops import commands as inbox_ops_commands
from inbox.cli.repair import commands as inbox_repair_commands
from inbox.cli.review import commands as inbox_review_commands
from outbox import migrate
from outbox.ops.cli import commands as ops_commands
from outbox_cli.main import SUBCOMMANDS, main
from outbox_ui.command import ui_cmd
from relay.cli import commands as relay_commands

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.integration.bad_input.app:consumer"

# Runs the `outbox` command as the console script does, then writes the names of the modules
# the process had loaded (at exit, whatever the exit code) to the file named by argv[1].
PROBE = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["outbox", *sys.argv[2:]]
from outbox_cli.__main__ import run
run()
"""

# Neither --help needs any of these; each costs tens of milliseconds.
NOT_FOR_HELP = (
    "alembic",
    "mako",
    "starlette",
    "jinja2",
    "uvicorn",
    "pika",
    "confluent_kafka",
    "prometheus_client",
    "psycopg",
    "pymysql",
    "greenlet",
    "sqlalchemy.orm",
    "sqlalchemy.ext.asyncio",
    "outbox_ui.app",
    "outbox.migrate",
    "outbox.metrics",
    "outbox.ops.cli",
    "outbox.ops.admin",
    "inbox.cli.ops",
    "inbox.cli.repair",
    "inbox.cli.review",
    "inbox.contract",
)
# Nor do a worker (database source) and a relay (RabbitMQ) on SQLite run these.
NOT_FOR_SQLITE = (
    "alembic",
    "mako",
    "starlette",
    "jinja2",
    "uvicorn",
    "confluent_kafka",
    "psycopg",
    "pymysql",
    "outbox_ui",
    "outbox.migrate",
    "outbox.ops.cli",
    "inbox.cli.ops",
    "inbox.cli.repair",
    "inbox.cli.review",
)
RATIO = 1.5
ROUNDS = 5


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    # The consumer of tests/integration/bad_input/app.py, configured by the environment.
    env.update(H4B_CONSUMER="start-up", H4B_QUEUES='["jobs"]', H4B_TYPES='["job"]')
    return env


def _loaded(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``outbox *args`` in a child process: its result, and the modules it loaded."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(),
        timeout=120,
    )
    return done, set(json.loads(out.read_text()))


def _among(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(m == n or m.startswith(f"{n}.") for m in loaded))


def test_help_of_worker_and_relay_loads_nothing_it_does_not_need(tmp_path: Path) -> None:
    for command in ("worker", "relay"):
        done, loaded = _loaded(tmp_path, command, "--help")
        assert done.returncode == 0, done.stderr
        assert f"Usage: outbox {command}" in done.stdout
        assert _among(loaded, NOT_FOR_HELP) == [], command


def test_a_worker_and_a_relay_on_sqlite_load_only_what_they_use(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    engine = create_engine(dsn)
    migrate.upgrade(engine)
    engine.dispose()
    limit = ["--dsn", dsn, "--time-limit", "0.2"]
    runs = {
        # The database source: no broker client at all.
        "worker": (["worker", TARGET, *limit], ("pika",)),
        # RabbitMQ on a closed port (the relay waits for it until its time limit): pika only.
        "relay": (["relay", "--broker", "amqp://u:p@127.0.0.1:1/", *limit], ()),
    }
    for name, (args, also_not) in runs.items():
        done, loaded = _loaded(tmp_path, *args)
        assert done.returncode == 0, done.stderr
        assert "exiting" in done.stderr, done.stderr
        assert _among(loaded, NOT_FOR_SQLITE + also_not) == [], name


def test_help_of_worker_and_relay_takes_at_most_1_5x_importing_sqlalchemy_and_psycopg() -> None:
    runs = {
        "import sqlalchemy, psycopg": [sys.executable, "-c", "import sqlalchemy, psycopg"],
        "worker --help": [sys.executable, "-m", "outbox_cli", "worker", "--help"],
        "relay --help": [sys.executable, "-m", "outbox_cli", "relay", "--help"],
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):  # A B C A B C ...: a burst of load hits every side
        for name, cmd in runs.items():
            started = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, env=_env(), timeout=60)
            seconds[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    base = medians.pop("import sqlalchemy, psycopg")
    for name, median in medians.items():
        assert median <= RATIO * base, f"{name}: {median:.3f}s, imports {base:.3f}s ({seconds})"


def test_the_group_lists_every_command_from_the_module_that_defines_it() -> None:
    defined = [*relay_commands, *inbox_commands, *ops_commands, ui_cmd]
    ctx = click.Context(main)
    assert set(SUBCOMMANDS) == {str(c.name) for c in defined}
    for command in defined:
        assert main.get_command(ctx, str(command.name)) is command
    assert main.list_commands(ctx) == sorted([*SUBCOMMANDS, "demo", "migrate"])
    listing = CliRunner().invoke(main, ["--help"])
    assert listing.exit_code == 0, listing.output
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None
        words = " ".join(command.get_short_help_str().split()[:3])
        assert f"  {name} " in listing.output and words in listing.output, name


def test_the_inbox_group_lists_every_inbox_command() -> None:
    defined = [*inbox_ops_commands, *inbox_repair_commands, *inbox_review_commands]
    ctx = click.Context(inbox_group)
    assert inbox_group.list_commands(ctx) == sorted(str(c.name) for c in defined)
    for command in defined:
        assert inbox_group.get_command(ctx, str(command.name)) is command
    assert inbox_group.get_command(ctx, "nosuch") is None
    listing = CliRunner().invoke(main, ["inbox", "--help"])
    assert listing.exit_code == 0, listing.output
    for command in defined:
        assert f"  {command.name} " in listing.output, command.name
