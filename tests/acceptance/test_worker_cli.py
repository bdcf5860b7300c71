"""``outbox worker`` and ``outbox inbox unblock`` as an operator runs them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import func, select

from outbox import inbox_table, outbox_table, states
from outbox_cli.main import main
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
            [sys.executable, "-m", "outbox_cli", "worker", target, "--dsn", bed.dsn],
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
        ("--queue", "OUTBOX_WORKER_QUEUES"),
        ("--batch-size", "OUTBOX_WORKER_BATCH_SIZE"),
        ("--poll-interval", "OUTBOX_WORKER_POLL_INTERVAL"),
        ("--concurrency", "OUTBOX_CONCURRENCY"),
        ("--stop-when-idle", "OUTBOX_STOP_WHEN_IDLE"),
        ("--time-limit", "OUTBOX_WORKER_TIME_LIMIT"),
        ("--log-level", "OUTBOX_LOG_LEVEL"),
        ("--library-log-level", "OUTBOX_LIBRARY_LOG_LEVEL"),
    ]:
        assert option in result.output and env in result.output
    flat = " ".join(result.output.split())  # click wraps the help text
    assert "[env var: OUTBOX_LOG_LEVEL; default: INFO]" in flat
    assert "[env var: OUTBOX_LIBRARY_LOG_LEVEL; default: WARNING]" in flat


SUMMARY = re.compile(
    r"worker test-consumer exiting \((?P<reason>[^)]+)\): (?P<processed>\d+) processed "
    r"\((?P<done>\d+) done, (?P<retry>\d+) retry, (?P<failed>\d+) failed\), "
    r"(?P<duplicates>\d+) duplicates, (?P<lost>\d+) claims lost, ran (?P<seconds>[\d.]+)s$"
)


def summary(log: Path) -> dict[str, str]:
    """The worker's exit line, which must be its last."""
    lines = log.read_text().splitlines()
    found = SUMMARY.search(lines[-1]) if lines else None
    assert found is not None, lines[-5:]
    return found.groupdict()


def test_sigterm_logs_a_summary_of_the_run(bed: Bed, tmp_path: Path) -> None:
    # Given two jobs that succeed, one that fails once, one that fails for good
    store(bed, [("ok1", 1), ("ok2", 1), ("flaky", 1), ("dead", 1)], None,
          flaky={"fail": 1}, dead={"permanent": True})  # fmt: skip
    log = tmp_path / "worker.log"
    worker = bed.spawn(stop_when_idle=False, log=log, extra=["--log-level", "INFO"])

    def inbox_states() -> dict[str, int]:
        with bed.engine.connect() as conn:
            t = inbox_table
            rows = conn.execute(select(t.c.state, func.count()).group_by(t.c.state)).all()
        return {str(state): int(n) for state, n in rows}

    wait_for(lambda: inbox_states() == {states.DONE: 3, states.FAILED: 1}, 60, "all four finished")
    # And one delivered again (an operator's republish): a duplicate, not run again
    with bed.engine.connect() as conn:
        ok1 = conn.execute(select(func.min(outbox_table.c.id))).scalar_one()
    again = CliRunner().invoke(
        main, ["republish", "--id", str(ok1), "--reason", "test", "--dsn", bed.dsn]
    )
    assert again.exit_code == 0, again.output

    def duplicates() -> int:
        with bed.engine.connect() as conn:
            return int(conn.execute(select(func.sum(inbox_table.c.duplicates))).scalar() or 0)

    wait_for(lambda: duplicates() == 1, 60, "the republished row to come back as a duplicate")

    # When the worker is told to stop
    worker.send_signal(signal.SIGTERM)
    assert wait_all([worker], 60) == [0]

    # Then its last line says what it did
    line = summary(log)
    counts = {k: int(v) for k, v in line.items() if k not in ("reason", "seconds")}
    assert line["reason"] == "SIGTERM"
    assert counts == {"processed": 5, "done": 3, "retry": 1, "failed": 1, "duplicates": 1,
                      "lost": 0}  # fmt: skip
    assert float(line["seconds"]) > 0
    assert sorted(e.mark for e in bed.effects()) == ["flaky", "ok1", "ok2"]


def test_idle_and_time_limit_exits_log_a_summary_too(bed: Bed, tmp_path: Path) -> None:
    store(bed, [("one", 1)], None)
    idle_log, limit_log = tmp_path / "idle.log", tmp_path / "limit.log"
    idle = bed.spawn(log=idle_log, extra=["--log-level", "INFO"])
    assert wait_all([idle], 60) == [0]
    limited = bed.spawn(stop_when_idle=False, time_limit=1.0, log=limit_log,
                        extra=["--log-level", "INFO"])  # fmt: skip
    assert wait_all([limited], 60) == [0]
    first, second = summary(idle_log), summary(limit_log)
    assert (first["reason"], first["processed"], first["done"]) == ("idle", "1", "1")
    assert (second["reason"], second["processed"]) == ("time limit", "0")
    assert float(second["seconds"]) >= 1.0
    # At INFO the worker's log holds our lines only: the libraries stay at WARNING
    for text in (idle_log.read_text(), limit_log.read_text()):
        names = {line.split()[3].split("[")[0] for line in text.splitlines()}
        assert names and all(n.split(".")[0] in ("inbox", "outbox", "tests") for n in names), names
