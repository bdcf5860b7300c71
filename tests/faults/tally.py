"""The verdict of the worker and connection fault scenarios, read from the database only:
every stored event_id has one done inbox row or a failed one with its reason, one effect per
done row and none for a failed one, no two runs of a group overlapping in wall time (each run
with the claim it ran under, to trace an overlap), and the duplicates the inbox absorbed."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from outbox import inbox_table, states
from outbox.schema import outbox_table
from tests.support.handlers import effects

if TYPE_CHECKING:
    from tests.faults.worker_harness import FaultBed

SHORT = {"postgresql": "pg", "mariadb": "mariadb"}


@dataclass(frozen=True)
class Run:
    mark: str
    group: str | None
    start: float
    end: float  # the end event, or the SIGKILL of its process, or +inf: never ended
    killed: bool = False  # its process was SIGKILLed inside the handler
    # Where it ran and under which claim (tests/support/handlers.py ``claim_seen``), to trace
    # an overlap to its claims; None where the recorder did not read the row (SQLite).
    pid: int = 0
    attempt: int = 0
    thread: str | None = None
    row_id: int | None = None
    token: str | None = None  # the row's claim token at the start: the claim it ran under
    lease: float | None = None  # that claim's lease_until at the start
    end_token: str | None = None  # at the end: another token = taken back while it ran
    end_state: str | None = None


@dataclass(frozen=True)
class Tally:
    stored: int
    done: int
    failed: int
    lost: list[str]
    double: list[str]
    overlaps: list[tuple[str, str]]
    duplicates: int
    killed_in_handler: int = 0
    overlap_runs: list[tuple[Run, Run]] = field(default_factory=list)  # the runs of ``overlaps``
    # Near misses, not failures: runs whose claim another worker took back while they ran
    # (their finish was fenced off), and the least lease a run had left when it started.
    taken_back: int = 0
    lease_margin: float | None = None

    def problems(self) -> list[str]:
        found = []
        if self.lost:
            found.append(f"{len(self.lost)} lost, e.g. {self.lost[:5]}")
        if self.double:
            found.append(f"{len(self.double)} with a wrong effect count, e.g. {self.double[:5]}")
        if self.overlaps:
            found.append(f"{len(self.overlaps)} overlapping runs, e.g. {self.overlaps[:5]}")
        return found

    def line(self, scenario: str, dialect: str, source: str, **extra: int) -> str:
        tail = "".join(f" {k}={v}" for k, v in extra.items())
        return (
            f"FAULT {scenario} {SHORT.get(dialect, dialect)} {source}: stored={self.stored}"
            f" done={self.done} lost={len(self.lost)} double={len(self.double)}"
            f" overlaps={len(self.overlaps)} duplicates_absorbed={self.duplicates}{tail}"
        )


def tally(
    stored: Sequence[Any],
    inbox: Sequence[Any],
    effect_ids: Sequence[Any],
    runs: Sequence[Run],
) -> Tally:
    """``stored``: event ids of the outbox; ``inbox``: rows (event_id, state, last_error,
    duplicates) of the consumer; ``effect_ids``: the event_id of every effect row."""
    rows = {r.event_id: r for r in inbox}
    effect_count = Counter(effect_ids)
    lost, double = [], []
    for event_id in stored:
        row = rows.get(event_id)
        if row is None or not (
            row.state == states.DONE or (row.state == states.FAILED and row.last_error)
        ):
            lost.append(str(event_id))  # no row, unfinished, or failed without a reason
        elif row.state == states.DONE and effect_count[event_id] == 0:
            lost.append(str(event_id))  # done, but its effect is missing
        elif effect_count[event_id] != (1 if row.state == states.DONE else 0):
            double.append(str(event_id))
    double += [str(e) for e in effect_count if e not in rows]  # an effect nobody stored
    pairs = overlapping_runs(runs)
    return Tally(
        stored=len(stored),
        done=sum(1 for r in inbox if r.state == states.DONE),
        failed=sum(1 for r in inbox if r.state == states.FAILED),
        lost=lost,
        double=double,
        overlaps=[(a.mark, b.mark) for a, b in pairs],
        duplicates=sum(int(r.duplicates) for r in inbox),
        killed_in_handler=sum(1 for r in runs if r.killed),
        overlap_runs=pairs,
        taken_back=sum(1 for r in runs if r.end_token not in (None, r.token)),
        lease_margin=min((r.lease - r.start for r in runs if r.lease is not None), default=None),
    )


def runs_from(events: Sequence[Any], kill_times: dict[int, float]) -> list[Run]:
    """Handler runs from the recorded events; a run without an end event ended when its
    process was SIGKILLed, or never (+inf, which overlaps everything after it)."""
    open_runs: dict[tuple[str, int, int], Any] = {}
    runs = []
    for e in events:
        key = (e.mark, e.attempt, e.pid)
        if e.kind == "start":
            open_runs[key] = e
        elif key in open_runs:
            s = open_runs.pop(key)
            runs.append(_run(s, e.at, end=e))
    for s in open_runs.values():
        end = kill_times.get(s.pid, math.inf)
        runs.append(_run(s, end, killed=end < math.inf))
    return runs


def _run(start: Any, until: float, *, end: Any = None, killed: bool = False) -> Run:
    """A run from its start event (and its end event, if any). Events fabricated by the
    verdict's own test carry no claim columns."""
    return Run(
        start.mark,
        start.grp,
        start.at,
        until,
        killed=killed,
        pid=start.pid,
        attempt=start.attempt,
        thread=getattr(start, "thread", None),
        row_id=getattr(start, "row_id", None),
        token=getattr(start, "token", None),
        lease=getattr(start, "lease", None),
        end_token=getattr(end, "token", None),
        end_state=getattr(end, "row_state", None),
    )


def group_overlaps(runs: Sequence[Run]) -> list[tuple[str, str]]:
    """Pairs of runs of one serial group whose wall-time intervals intersect (marks)."""
    return [(a.mark, b.mark) for a, b in overlapping_runs(runs)]


def overlapping_runs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """Pairs of runs of one serial group whose wall-time intervals intersect: (the one
    running, the one that started meanwhile)."""
    by_group: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.group is not None:
            by_group[run.group].append(run)
    found: list[tuple[Run, Run]] = []
    for group_runs in by_group.values():
        group_runs.sort(key=lambda r: r.start)
        active: list[Run] = []
        for run in group_runs:
            active = [a for a in active if a.end > run.start]
            found += [(a, run) for a in active]
            active.append(run)
    return found


def measure(faults: FaultBed) -> Tally:
    bed = faults.bed
    with bed.engine.connect() as conn:
        stored = list(
            conn.execute(
                select(outbox_table.c.event_id).where(outbox_table.c.queue == faults.queue)
            ).scalars()
        )
        inbox = conn.execute(
            select(
                inbox_table.c.event_id,
                inbox_table.c.state,
                inbox_table.c.last_error,
                inbox_table.c.duplicates,
            ).where(inbox_table.c.consumer == faults.consumer)
        ).all()
        effect_ids = list(conn.execute(select(effects.c.event_id)).scalars())
    return tally(stored, inbox, effect_ids, runs_from(bed.events(), faults.kill_times))
