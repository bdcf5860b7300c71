"""SIGTERM and SIGINT as stop requests, acted on outside the signal handler.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread
is. ``threading.Event.set()`` takes the lock of the event's condition, and ``Event.wait(t)``
holds that same lock for a few bytecodes each time a timed wait ends: a handler that sets an
event the main thread waits on with a timeout deadlocks the process now and then (a worker
that never exited after SIGTERM; 2 of 300 SIGTERMs to a loop of 0.2 ms waits). So the handler
only writes the signal's number to a pipe, which takes no lock, and a thread of ours reads it
and calls ``on_stop`` there, where taking a lock is safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_stop_signals(
    on_stop: Callable[[str], None], signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> None:
    """From now on each of ``signals`` calls ``on_stop(name)`` ("SIGTERM") in a daemon thread,
    once per signal received. Call from the main thread (``signal.signal`` requires it)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def handler(signum: int, _frame: FrameType | None) -> None:
        # BlockingIOError: 64 KiB of signals unread, so a stop is on its way already.
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, bytes([signum]))

    def deliver() -> None:
        while True:
            received = os.read(read_end, 1)
            if not received:
                return
            try:
                on_stop(signal.Signals(received[0]).name)
            except Exception:  # a failing callback must not end the delivery of the next one
                log.exception("stop request not handled")

    threading.Thread(target=deliver, name="stop-signals", daemon=True).start()
    for signum in signals:
        signal.signal(signum, handler)
