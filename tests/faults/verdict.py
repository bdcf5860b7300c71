"""The fault suite's verdict: what the database recorded, turned into lost messages, double
effects, overlapping runs inside a group and duplicates the inbox absorbed."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import select

from outbox import states
from outbox.schema import inbox_table, outbox_table
from tests.faults.pipeline import Pipeline


@dataclass(frozen=True)
class InboxFact:
    event_id: UUID
    state: str
    last_error: str | None
    duplicates: int


@dataclass(frozen=True)
class Run:
    """One ``start`` or ``end`` the handler recorded (tests/support/handlers.py)."""

    grp: str | None
    mark: str
    kind: str
    pid: int
    attempt: int
    at: float


@dataclass(frozen=True)
class Verdict:
    stored: int
    done: int
    failed: int  # ended failed with a reason (inbox or outbox): accounted for, not lost
    lost: list[UUID]
    double: list[UUID]
    overlaps: list[tuple[str, str, str]]  # (group, mark running, mark started meanwhile)
    open_runs: int  # a start without its end: no process was killed mid-handler here
    duplicates_absorbed: int

    @property
    def ok(self) -> bool:
        return not (self.lost or self.double or self.overlaps or self.open_runs)

    def line(self, scenario: str, **figures: int) -> str:
        extra = "".join(f" {name}={value}" for name, value in figures.items())
        return (
            f"FAULT {scenario}: stored={self.stored} done={self.done} lost={len(self.lost)} "
            f"double={len(self.double)} overlaps={len(self.overlaps)} "
            f"duplicates_absorbed={self.duplicates_absorbed}{extra}"
            + (f" failed={self.failed}" if self.failed else "")
        )

    def detail(self) -> str:
        return (
            f"lost {self.lost[:5]}, double {self.double[:5]}, overlaps {self.overlaps[:5]}, "
            f"open runs {self.open_runs}"
        )


def judge(
    stored: Sequence[UUID],
    inbox: Sequence[InboxFact],
    outbox_failed: Mapping[UUID, str | None],
    effects: Sequence[UUID],
    runs: Sequence[Run],
) -> Verdict:
    """Lost: a stored event without (one done inbox row and its effect) and without a failed
    row that says why. Double: more than one effect, an effect whose inbox row is not done,
    an effect of no stored event, or two inbox rows of one event and consumer."""
    wanted = set(stored)
    effect_count = Counter(effects)
    rows = Counter(fact.event_id for fact in inbox)
    by_id = {fact.event_id: fact for fact in inbox}
    done = failed = 0
    lost: list[UUID] = []
    for event_id in stored:
        fact = by_id.get(event_id)
        if fact is not None and fact.state == states.DONE and effect_count[event_id] >= 1:
            done += 1
        elif _failed_with_reason(fact, outbox_failed.get(event_id)):
            failed += 1
        else:
            lost.append(event_id)
    double = sorted(
        {i for i, n in effect_count.items() if n > 1 or i not in wanted}
        | {i for i in effect_count if i in by_id and by_id[i].state != states.DONE}
        | {i for i, n in rows.items() if n > 1},
        key=str,
    )
    overlaps, open_runs = group_overlaps(runs)
    absorbed = sum(fact.duplicates for fact in inbox)
    return Verdict(len(stored), done, failed, lost, double, overlaps, open_runs, absorbed)


def _failed_with_reason(fact: InboxFact | None, outbox_error: str | None) -> bool:
    """The inbox row failed and says why, or it never arrived because the relay gave the
    outbox row up (failed, with the broker's reason)."""
    if fact is None:
        return bool(outbox_error)
    return fact.state == states.FAILED and bool(fact.last_error)


def group_overlaps(runs: Sequence[Run]) -> tuple[list[tuple[str, str, str]], int]:
    """Runs of one serial group whose [start, end] intervals intersect (wall clock of one
    host), and how many starts never got their end."""
    starts: dict[tuple[str, int, int], Run] = {}
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for run in runs:
        if run.grp is None:
            continue  # ungrouped jobs may run side by side
        key = (run.mark, run.attempt, run.pid)
        if run.kind == "start":
            starts[key] = run
        elif key in starts:
            spans[run.grp].append((starts.pop(key).at, run.at, run.mark))
    found: list[tuple[str, str, str]] = []
    for group, intervals in spans.items():
        intervals.sort()
        latest_end, latest = float("-inf"), ""
        for start, end, mark in intervals:
            if start < latest_end:
                found.append((group, latest, mark))
            if end > latest_end:
                latest_end, latest = end, mark
    return found, len(starts)


def verdict(pipeline: Pipeline) -> Verdict:
    """Read the outbox, the inbox, the effects and the recorded runs of ``pipeline``."""
    bed, inbox = pipeline.bed, inbox_table
    with bed.engine.connect() as conn:
        stored = list(
            conn.execute(
                select(outbox_table.c.event_id).where(outbox_table.c.queue == pipeline.queue)
            ).scalars()
        )
        failed = {
            r.event_id: r.last_error
            for r in conn.execute(
                select(outbox_table.c.event_id, outbox_table.c.last_error).where(
                    outbox_table.c.status == states.FAILED
                )
            )
        }
        facts = [
            InboxFact(r.event_id, r.state, r.last_error, int(r.duplicates))
            for r in conn.execute(
                select(
                    inbox.c.event_id, inbox.c.state, inbox.c.last_error, inbox.c.duplicates
                ).where(inbox.c.consumer == pipeline.consumer)
            )
        ]
    effects = [e.event_id for e in bed.effects()]
    runs = [Run(e.grp, e.mark, e.kind, e.pid, e.attempt, e.at) for e in bed.events()]
    return judge(stored, facts, failed, effects, runs)
