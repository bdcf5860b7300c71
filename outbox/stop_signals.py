"""SIGTERM and SIGINT as stop requests, acted on outside the signal handler.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread
is. ``threading.Event.set()`` takes the lock of the event's condition, and ``Event.wait(t)``
holds that same lock for a few bytecodes each time a timed wait ends: a handler that sets an
event the main thread waits on with a timeout deadlocks the process now and then (a worker
that never exited after SIGTERM; 2 of 300 SIGTERMs to a child waiting in 0.2 ms slices). So
the handler only writes the signal's number to a pipe, which takes no lock, and a thread of
ours reads it and calls ``on_stop`` there, where taking a lock is safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_stop_signals(
    on_stop: Callable[[str], None], signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> Callable[[], None]:
    """From now on each of ``signals`` calls ``on_stop(name)`` ("SIGTERM") in a thread of its
    own, once per signal received. Returns the undo: the previous handlers back, the thread
    ended (a program that runs a worker and goes on must get its own Ctrl-C back). Call both
    from the main thread (``signal.signal`` requires it)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def handler(signum: int, _frame: FrameType | None) -> None:
        # BlockingIOError: 64 KiB of signals unread, so a stop is on its way already.
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, bytes([signum]))

    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in signals:
            previous[signum] = signal.signal(signum, handler)
    except BaseException:
        _restore(previous)
        os.close(read_end)
        os.close(write_end)
        raise
    thread = threading.Thread(
        target=_deliver, args=(read_end, on_stop), name="stop-signals", daemon=True
    )
    thread.start()

    def uninstall() -> None:
        _restore(previous)
        os.close(write_end)  # the thread reads the end of the pipe and stops
        thread.join(timeout=5)

    return uninstall


def _deliver(read_end: int, on_stop: Callable[[str], None]) -> None:
    try:
        while received := os.read(read_end, 1):
            try:
                on_stop(signal.Signals(received[0]).name)
            except Exception:  # a failing callback must not end the delivery of the next one
                log.exception("stop request not handled")
    except OSError as exc:  # cannot happen on a pipe of our own; if it does, say so
        log.error("stop signals no longer delivered: %s", exc)
    finally:
        os.close(read_end)


def _restore(previous: dict[signal.Signals, Any]) -> None:
    for signum, old in previous.items():
        signal.signal(signum, old)
