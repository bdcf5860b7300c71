"""Two operators resolving the same row at once, from two ``outbox inbox resolve`` processes:
exactly one changes it and writes the audit record; the other is told the row's new state."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import Engine, select

from outbox import states
from tests.integration.ops.review_rows import (
    SCHEMA,
    contract_row,
    last_of,
    ledger,
    row_of,
    set_last,
)
from tests.integration.ops.test_concurrent_retry import wait_until_both_blocked
from tests.integration.ops.test_inbox_cli import audits
from tests.support.workers import ROOT

# Each racer says it is ready, then waits for the go file, then runs the command: the two
# start their transactions together.
RACER = """
import pathlib, sys, time
from outbox_cli.main import main
pathlib.Path(sys.argv[1]).touch()
go = pathlib.Path(sys.argv[2])
deadline = time.monotonic() + 60
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
main(sys.argv[3:], prog_name="outbox")
"""


def wait_for_files(paths: list[Path], procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, "the racers never got ready"
        assert all(p.poll() is None for p in procs), "a racer ended before the start"
        time.sleep(0.01)


def test_two_resolves_of_one_row_change_it_once(
    engine: Engine, dsn: str, dialect: str, tmp_path: Path
) -> None:
    # Given a row whose effect is unknown, change 4 of its key (3 applied)
    with engine.begin() as conn:
        set_last(conn, "c1", "k", 3)
        row_id = contract_row(
            conn, state=states.UNKNOWN, group="g", reason="effect-unknown", effect_key="e:1",
            sequence_key="k", sequence=4,
        )  # fmt: skip
        successor = contract_row(conn, state=states.DEFERRED, seq=2, sequence_key="k", sequence=5)

    # When two operators resolve it at the same moment, one as applied and one as not applied,
    # while the test holds the row (the write lock on SQLite) until both wait for it
    env = {**os.environ, "OUTBOX_DSN": dsn}
    go = tmp_path / "go"
    ready = [tmp_path / "alice.ready", tmp_path / "bob.ready"]
    with engine.connect() as holder:
        holder.begin()
        t = SCHEMA.inbox
        if dialect != "sqlite":
            holder.execute(select(t.c.id).where(t.c.id == row_id).with_for_update())
        procs = [
            subprocess.Popen(
                [
                    sys.executable, "-c", RACER, str(flag), str(go), "inbox", "resolve",
                    str(row_id), mode, "--reason", "race", "--by", who, "--json",
                ],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for flag, who, mode in zip(
                ready, ("alice", "bob"), ("--applied", "--not-applied"), strict=True
            )
        ]  # fmt: skip
        wait_for_files(ready, procs)
        go.touch()
        wait_until_both_blocked(engine, dialect, procs)
        holder.rollback()
    outputs = [p.communicate(timeout=120) for p in procs]

    # Then one of them resolved it and the other was refused, naming the state it found
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outputs
    winner = next(i for i, p in enumerate(procs) if p.returncode == 0)
    loser_err = outputs[1 - winner][1]
    (audit,) = audits(engine)
    assert audit["actor"] == ("alice", "bob")[winner] and audit["row_ids"] == [row_id]
    row = row_of(engine, row_id)
    if winner == 0:
        assert row.state == states.DONE and audit["action"] == "resolve-applied"
        assert f"row {row_id} is done, not review or unknown" in loser_err
        assert ledger(engine) == {("c1", "e:1"): str(row.event_id)}
        assert last_of(engine, "c1", "k") == 4
        assert row_of(engine, successor).state == states.READY
    else:
        assert row.state == states.READY and audit["action"] == "resolve-not-applied"
        assert f"row {row_id} is ready, not review or unknown" in loser_err
        assert ledger(engine) == {} and last_of(engine, "c1", "k") == 3
        assert row_of(engine, successor).state == states.DEFERRED
