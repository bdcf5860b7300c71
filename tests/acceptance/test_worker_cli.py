"""``outbox worker`` and ``outbox inbox unblock`` as an operator runs them."""

from __future__ import annotations

import signal
import subprocess
import sys

from click.testing import CliRunner
from sqlalchemy import select

from outbox import inbox_table, states
from outbox.cli import main
from tests.acceptance.test_s1_s4_ordering import store
from tests.support.workers import ROOT, Bed, started_order, wait_all, wait_for


def test_sigterm_lets_the_running_handler_finish_and_exits_0(bed: Bed) -> None:
    store(bed, [("long", 1)], "g", long={"sleep": 1.5})
    worker = bed.spawn(stop_when_idle=False)
    wait_for(lambda: "long" in started_order(bed.events()), 60, "the handler to start")
    worker.send_signal(signal.SIGTERM)
    assert wait_all([worker], 60) == [0]
    assert [e.kind for e in bed.events()] == ["start", "end"]
    assert [e.mark for e in bed.effects()] == ["long"]
    with bed.engine.connect() as conn:
        assert conn.execute(select(inbox_table.c.state)).scalar() == states.DONE


def test_unblock_releases_a_halted_group(bed: Bed) -> None:
    store(bed, [("dead", 1), ("next", 1)], "grp", dead={"permanent": True})
    worker = bed.spawn(on_dead="halt")
    assert wait_all([worker], 60) == [0]
    assert started_order(bed.events()) == ["dead"]  # halted: "next" did not run
    result = CliRunner().invoke(
        main,
        [
            "inbox",
            "unblock",
            "grp",
            "--consumer",
            "test-consumer",
            "--dsn",
            bed.dsn,
            "--reason",
            "INC-1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "released" in result.output
    worker = bed.spawn(on_dead="halt")
    assert wait_all([worker], 60) == [0]
    assert started_order(bed.events()) == ["dead", "next"]


def test_worker_refuses_a_target_that_is_not_a_consumer(bed: Bed) -> None:
    for target in ("tests.support.handlers:job", "no.such.module:x", "nocolon"):
        done = subprocess.run(
            [sys.executable, "-m", "outbox.cli", "worker", target, "--dsn", bed.dsn],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=bed.env(),
        )
        assert done.returncode == 2, done.stderr
        assert (
            "MODULE:CONSUMER" in done.stderr or "Consumer" in done.stderr or "import" in done.stderr
        )


def test_worker_help_lists_the_options_with_env_vars() -> None:
    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0
    for option, env in [
        ("--dsn", "OUTBOX_DSN"),
        ("--source", "OUTBOX_SOURCE"),
        ("--queue", "OUTBOX_QUEUE"),
        ("--concurrency", "OUTBOX_CONCURRENCY"),
        ("--stop-when-idle", "OUTBOX_STOP_WHEN_IDLE"),
        ("--time-limit", "OUTBOX_TIME_LIMIT"),
    ]:
        assert option in result.output and env in result.output
