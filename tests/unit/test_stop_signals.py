"""SIGTERM/SIGINT reach ``on_stop`` every time, however the main thread is waiting.

The child waits on an event with short timeouts (as the worker's and the relay's loops do)
while the test signals it a thousand times at random instants; each signal must end one wait.
A handler that set the event itself would deadlock on the event's own lock now and then
(2 of 300 SIGTERMs, one per process); here a lost or stuck signal fails the round's deadline.
The undo gives the previous handlers back."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

from tests.support.workers import ROOT

ROUNDS = 1000
CHILD = """
import signal, sys, threading
from outbox.stop_signals import install_stop_signals

stopped = threading.Event()
names = []
before = signal.getsignal(signal.SIGTERM)
undo = install_stop_signals(lambda name: (names.append(name), stopped.set()))
for _ in range({rounds}):
    print("ready", flush=True)
    while not stopped.wait(0.0002):
        pass
    stopped.clear()
undo()
assert signal.getsignal(signal.SIGTERM) is before, "the previous handler is back"
assert not any(t.name == "stop-signals" for t in threading.enumerate()), "the thread ended"
print(" ".join(sorted(set(names))), flush=True)
"""


def _line(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no answer within {timeout} s (had {line!r})")
        chunk = os.read(fd, 1)
        if not chunk:
            raise AssertionError(f"the child exited (had {line!r})")
        line += chunk
    return line.strip()


def test_every_stop_signal_ends_a_wait_of_the_main_thread() -> None:
    seed = random.randrange(2**32)
    pauses = random.Random(seed)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(rounds=ROUNDS)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    fd = child.stdout.fileno()
    try:
        for round_ in range(ROUNDS):
            assert _line(fd, 10) == b"ready", f"round {round_}, seed {seed}"
            time.sleep(pauses.random() * 0.002)
            child.send_signal(signal.SIGINT if round_ % 2 else signal.SIGTERM)
        assert _line(fd, 10) == b"SIGINT SIGTERM"
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
