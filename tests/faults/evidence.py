"""What a failed fault scenario leaves behind to be diagnosed: the overlapping handler runs
with the claims they ran under, the kills around them (whose connection, doing what), the
inbox rows involved, and the processes' logs, kept where CI keeps files (``build/``).

Only read after a failure (an assertion's message, an exception's note): it adds nothing to
a passing run but the connection details read just before each kill.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "build" / "fault-logs"
TAIL_LINES = 40
WINDOW = 5.0  # seconds around an overlap whose kills and runs are shown
PID_RUNS = 60  # runs shown per process involved (the latest in the window)


@dataclass(frozen=True)
class Kill:
    """One connection the test killed, as the server described it just before."""

    at: float
    role: str
    connection: int
    port: int | None  # the client's TCP port: which process held the connection
    pid: int | None  # that process, when it is one of the scenario's
    what: str  # its command / state and statement (or transaction start)


def clock(at: float) -> str:
    """Local wall time to the millisecond, as the processes' log lines print it."""
    if at == float("inf"):
        return "never"
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def socket_owner(port: int | None, pids: Iterable[int]) -> int | None:
    """Which of ``pids`` has a TCP socket bound to local ``port`` (Linux /proc)."""
    if port is None:
        return None
    inodes = _inodes_of_port(port)
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            match = re.fullmatch(r"socket:\[(\d+)\]", link)
            if match and match.group(1) in inodes:
                return pid
    return None


def _inodes_of_port(port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def describe_run(run: Any) -> str:
    taken_back = run.token is not None and run.end_token is not None and run.end_token != run.token
    return (
        f"{run.mark} [{clock(run.start)} .. {clock(run.end)}]"
        f" ({(run.end - run.start) * 1000:.1f} ms) pid={run.pid} thread={run.thread}"
        f" attempt={run.attempt} row={run.row_id} token={run.token}"
        f" lease_at_start={clock(run.lease) if run.lease is not None else None}"
        f" token_at_end={run.end_token} state_at_end={run.end_state}"
        + (" TAKEN BACK WHILE RUNNING" if taken_back else "")
        + (" (process SIGKILLed)" if run.killed else "")
    )


def explain_overlaps(
    pairs: Sequence[tuple[Any, Any]], runs: Sequence[Any], kills: Sequence[Kill]
) -> str:
    """Each overlapping pair with its claims, the group's runs and the kills around it."""
    out: list[str] = []
    for first, second in pairs[:5]:
        same_row = first.row_id is not None and first.row_id == second.row_id
        out.append(
            f"OVERLAP in group {first.group}: {first.mark} (running) and {second.mark}"
            f" (started {(second.start - first.start) * 1000:.1f} ms after it);"
            f" same inbox row: {same_row}; same token: {first.token == second.token}"
        )
        out.append(f"  running: {describe_run(first)}")
        out.append(f"  started: {describe_run(second)}")
        low = first.start - WINDOW
        high = max(second.end, first.end if first.end < float("inf") else second.end) + 1.0
        out.append(f"  runs of {first.group} from {clock(low)} to {clock(high)}:")
        for run in sorted(runs, key=lambda r: r.start):
            if run.group == first.group and run.end >= low and run.start <= high:
                out.append(f"    {describe_run(run)}")
        for pid in dict.fromkeys((first.pid, second.pid)):
            out.append(f"  runs of pid {pid} from {clock(low)} to {clock(high)}:")
            mine = [r for r in runs if r.pid == pid and r.end >= low and r.start <= high]
            for run in sorted(mine, key=lambda r: r.start)[-PID_RUNS:]:
                out.append(f"    {run.group} {describe_run(run)}")
        out.append("  kills in that window:")
        for kill in kills:
            if low <= kill.at <= high:
                out.append(f"    {describe_kill(kill)}")
    if len(pairs) > 5:
        out.append(f"... and {len(pairs) - 5} more overlapping pairs")
    return "\n".join(out)


def describe_kill(kill: Kill) -> str:
    return (
        f"{clock(kill.at)} {kill.role} connection {kill.connection} (client port {kill.port},"
        f" pid {kill.pid}): {kill.what}"
    )


def describe_rows(rows: Sequence[Any]) -> str:
    return "\n".join(
        "  inbox row " + " ".join(f"{key}={value}" for key, value in row._mapping.items())
        for row in rows
    )


def as_csv(rows: Sequence[Any]) -> str:
    """Rows of a SQLAlchemy result as CSV, with a header."""
    out = io.StringIO()
    writer = csv.writer(out)
    if rows:
        writer.writerow(rows[0]._mapping.keys())
    writer.writerows(tuple(row) for row in rows)
    return out.getvalue()


def keep_logs(label: str, logs: Sequence[Path], extra: dict[str, str] | None = None) -> str:
    """Copy ``logs`` (and ``extra`` texts, by file name) to build/fault-logs/<label>-<time>/;
    the copies' paths and each log's last lines, for a failure's message."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")[-120:]
    target = KEPT / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    target.mkdir(parents=True, exist_ok=True)
    out = [f"logs kept in {target}"]
    for filename, content in (extra or {}).items():
        (target / filename).write_text(content)
        out.append(f"  {target / filename}")
    for log in logs:
        if not log.exists():
            out.append(f"  {log}: never written")
            continue
        kept = target / log.name
        shutil.copyfile(log, kept)
        lines = log.read_text(errors="replace").splitlines()
        out.append(f"--- {kept} (last {min(TAIL_LINES, len(lines))} of {len(lines)} lines)")
        out += lines[-TAIL_LINES:]
    return "\n".join(out)


def connection_detail(conn: Any, dialect: str, connection_id: int) -> tuple[int | None, str]:
    """(client port, what it is doing) of a server connection, read just before its kill."""
    if dialect == "postgresql":
        row = conn.execute(
            text(
                "SELECT client_port, state, xact_start, left(query, 160) FROM pg_stat_activity"
                " WHERE pid = :id"
            ),
            {"id": connection_id},
        ).first()
        if row is None:
            return None, "gone"
        return row[0], f"state={row[1]} transaction_since={row[2]} last statement: {row[3]}"
    row = conn.execute(
        text(
            "SELECT p.host, p.command, p.state, t.trx_started, LEFT(p.info, 160)"
            " FROM information_schema.PROCESSLIST p LEFT JOIN information_schema.INNODB_TRX t"
            " ON t.trx_mysql_thread_id = p.id WHERE p.id = :id"
        ),
        {"id": connection_id},
    ).first()
    if row is None:
        return None, "gone"
    port = int(row[0].rsplit(":", 1)[1]) if row[0] and ":" in row[0] else None
    return port, f"command={row[1]} state={row[2]} transaction_since={row[3]} running: {row[4]}"
