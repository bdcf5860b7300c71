"""``python -m outbox_cli ...`` and the ``outbox`` console script (``run``)."""

from __future__ import annotations

import gc
import os
import signal
import sys

# The commands a supervisor starts and stops: stopped at any instant, they exit 0.
LONG_RUNNING = ("worker", "relay")


def run() -> None:
    """The ``outbox`` command."""
    if sys.argv[1:2] and sys.argv[1] in LONG_RUNNING:
        # First, before the imports: until the command installs its own stop handling
        # (outbox.stop_signals, once it has something to finish), a stop signal ends it with
        # 0, not by the signal's default action (killed; SIGINT: a traceback, exit code 1),
        # which would tell its supervisor that it failed. SIGTERM last: once it is caught,
        # both are (tests/acceptance/test_start_up_signals.py watches for that).
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _stopped_before_start)
    try:
        from outbox_cli.main import main

        main()
    finally:
        # The process ends here. Python's finalization would walk every object several
        # times looking for cycles (0.3 s with SQLAlchemy loaded, more on a busy machine: a
        # SIGTERMed worker's exit, every command's); frozen, they are left to the OS. atexit
        # handlers (logging's flush) still run; the objects of a cycle get no __del__, which
        # Python never promised at exit.
        gc.freeze()


def _stopped_before_start(_signum: int, _frame: object) -> None:
    # Nothing is running yet (imports, options, the consumer's module, engine objects): there
    # is nothing to finish, so no exception unwinds through whatever the main thread is in.
    os._exit(0)


if __name__ == "__main__":
    run()
