"""What ``bench/cost.py`` measures besides the clock: CPU of processes (``/proc``), and the
database's own counters, read before and after a drain.

CPU: ``utime + stime`` of ``/proc/<pid>/stat`` (``/proc/<pid>/task/<tid>/stat`` for one
MariaDB thread). The bench's children (workers, relay) are read once more when they have
exited but are not yet reaped (``waitid(WNOWAIT)``), so their whole life is counted. Database
server backends and threads are sampled every ``SAMPLE_SECONDS``; the last sample of each
counts, so up to that much of a backend's last moments can be missed.

The counters' own readers stay out of the figures: the PostgreSQL sessions of the bench run
with ``track_counts`` off (their commits are counted and subtracted); on MariaDB, whose
counters are global, the session counters of the bench's own connections are subtracted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.consumer_support import note

SAMPLE_SECONDS = 0.2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
Usage = dict[str, float]  # counter name -> value


def cpu_seconds(stat: str) -> float | None:
    """utime + stime of one ``/proc/.../stat`` file; None when it is gone."""
    try:
        text = Path(stat).read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name may hold spaces; state is field 3
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def pids_of(pattern: str, exact: bool = False) -> list[int]:
    """Processes whose command line matches ``pattern`` (``pgrep -f``; ``exact``: whose name
    is ``pattern``, ``pgrep -x``)."""
    option = "-x" if exact else "-f"
    found = subprocess.run(["pgrep", option, pattern], capture_output=True, text=True, check=False)
    return [int(p) for p in found.stdout.split()]


def total_cpu(pids: Sequence[int]) -> float:
    return sum(cpu_seconds(f"/proc/{pid}/stat") or 0.0 for pid in pids)


def add_usage(total: Usage, more: Usage) -> Usage:
    return {k: total.get(k, 0.0) + more.get(k, 0.0) for k in total.keys() | more.keys()}


class Children:
    """The bench's child processes by role ("workers", "relay"): CPU up to their exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[int, str] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._cpu: dict[int, float] = {}
        self._exited: set[int] = set()

    def add(self, role: str, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._roles[process.pid] = role
            self._procs[process.pid] = process
            self._cpu[process.pid] = 0.0

    def check(self) -> None:
        """Sample every live child; one that has exited: read it a last time, then reap."""
        with self._lock:
            for pid, process in self._procs.items():
                if pid in self._exited:
                    continue
                try:
                    gone = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:  # reaped elsewhere: its last sample stands
                    self._exited.add(pid)
                    continue
                self._cpu[pid] = cpu_seconds(f"/proc/{pid}/stat") or self._cpu[pid]
                if gone is not None:
                    process.wait()
                    self._exited.add(pid)

    def running(self, role: str | None = None) -> list[subprocess.Popen[bytes]]:
        with self._lock:
            return [
                p
                for pid, p in self._procs.items()
                if pid not in self._exited and role in (None, self._roles[pid])
            ]

    def all_exited(self) -> bool:
        self.check()
        return not self.running()

    def exit_codes(self) -> list[int | None]:
        with self._lock:
            return [p.returncode for p in self._procs.values()]

    def wait(self, role: str | None, timeout: float) -> bool:
        """Until every child of ``role`` (None: all) has exited, at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            if not self.running(role):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def stop(self, role: str | None = None, timeout: float = 30.0) -> None:
        """SIGTERM (the processes finish what runs), then SIGKILL after ``timeout`` s."""
        for process in self.running(role):
            process.send_signal(signal.SIGTERM)
        if not self.wait(role, timeout):
            for process in self.running(role):
                note(f"pid {process.pid} did not stop in {timeout:.0f}s: killed")
                process.kill()
            self.wait(role, 10.0)

    def cpu(self, role: str) -> float:
        with self._lock:
            return sum(c for pid, c in self._cpu.items() if self._roles[pid] == role)


class ServerThreads:
    """What one sampler pass reads of the database server: the ``/proc`` stat files of the
    backends (threads) serving the bench database. ``close`` returns the session counters
    the sampling itself added (to subtract from global counters)."""

    # A PostgreSQL backend is a new process (its CPU starts at 0); a MariaDB thread may come
    # from the thread cache, with the CPU of earlier connections: counted from first sight.
    from_first_sight = False

    def paths(self) -> list[str]:
        return []

    def close(self) -> Usage:
        return {}


class Sampler(threading.Thread):
    """Every ``SAMPLE_SECONDS``: the children's CPU, and the server's backends or threads."""

    def __init__(self, children: Children, server: ServerThreads) -> None:
        super().__init__(daemon=True, name="cost-sampler")
        self.children, self.server = children, server
        self._stop_event = threading.Event()
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.error: Exception | None = None

    def run(self) -> None:
        while True:
            try:
                self.children.check()
                self._sample_server()
            except Exception as exc:  # reported after the cell; the drain goes on
                self.error = exc
            if self._stop_event.wait(SAMPLE_SECONDS):
                return

    def _sample_server(self) -> None:
        for path in self.server.paths():
            value = cpu_seconds(path)
            if value is None:
                continue
            if path not in self._first:
                self._first[path] = value if self.server.from_first_sight else 0.0
            self._last[path] = value

    def finish(self) -> tuple[float, Usage]:
        """Stop sampling; the server's CPU (s) and the sampling's own session counters."""
        self._sample_server()
        self._stop_event.set()
        self.join()
        cpu = sum(self._last[p] - self._first[p] for p in self._last)
        return cpu, self.server.close()


def settle(
    read: Callable[[], Usage], busy: Callable[[], bool], what: str, timeout: float = 30.0
) -> Usage:
    """Counters once nothing serves the bench database any more and two reads 0.5 s apart
    agree (PostgreSQL flushes a backend's counters at most once a second, and at its exit)."""
    deadline = time.monotonic() + timeout
    last: Usage | None = None
    while True:
        now = read()
        if last == now and not busy():
            return now
        if time.monotonic() > deadline:
            note(f"{what}: counters still moving after {timeout:.0f}s; read as they are")
            return now
        last = now
        time.sleep(0.5)
