"""``kill -USR1`` makes a relay or a worker print every thread's stack to stderr and go on:
an operator (or a test whose process did not stop in time) learns where it is stuck.

Both run against a database that does not answer, which they keep retrying until their time
limit: a process that is alive and waiting, as a stuck one would be."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from tests.integration.bad_input.support import ROOT, TARGET, worker_env
from tests.support.workers import handles_signal, wait_for

UNREACHABLE = "postgresql+psycopg://app:pw@127.0.0.1:1/app"
COMMANDS = {
    "relay": ["relay", "--dsn", UNREACHABLE, "--broker", "amqp://guest:guest@127.0.0.1:1/"],
    "worker": ["worker", TARGET, "--dsn", UNREACHABLE],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sigusr1_prints_the_stacks_and_the_process_goes_on(command: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox_cli", *COMMANDS[command], "--time-limit", "15"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=worker_env("dump-consumer", ["jobs"], ["job"]),
    )
    try:
        wait_for(
            lambda: process.poll() is not None or handles_signal(process, signal.SIGUSR1),
            60,
            f"{command} to handle SIGUSR1",
        )
        assert process.poll() is None, "exited before the signal"
        process.send_signal(signal.SIGUSR1)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = err.decode()
    # Exit 0 at its time limit: the signal neither killed it nor stopped it.
    assert process.returncode == 0, text
    # Every thread's stack; the main thread is in our own code. faulthandler names the
    # interrupted thread "Current thread" when it knows it; a signal that lands while a
    # thread is being started (the stop-signal watcher, at start-up) is dumped with plain
    # "Thread" headers: CI saw exactly that.
    assert re.search(r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):", text), text
    assert "/outbox/" in text or "/inbox/" in text or "/relay/" in text, text
