"""A failed fault scenario says which claims overlapped and keeps its logs (evidence.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.faults import evidence
from tests.faults.evidence import Kill, explain_overlaps, keep_logs
from tests.faults.tally import runs_from, tally


def test_an_overlap_is_traced_to_its_claims_and_the_kills_around_it() -> None:
    def event(kind: str, at: float, pid: int, attempt: int, token: str) -> SimpleNamespace:
        return SimpleNamespace(
            mark="m7", grp="g7", kind=kind, at=at, pid=pid, attempt=attempt, thread="inbox-h-0",
            row_id=41, token=token, row_state="processing", lease=at + 3.0,
        )  # fmt: skip

    events = [
        event("start", 100.0, pid=1, attempt=1, token="tok-a"),
        event("start", 100.5, pid=2, attempt=2, token="tok-b"),  # took the claim back
        event("end", 100.6, pid=2, attempt=2, token="tok-b"),
        event("end", 100.9, pid=1, attempt=1, token="tok-b"),  # its claim was gone by then
    ]
    runs = runs_from(events, {})
    result = tally([], [], [], runs)
    assert result.overlaps == [("m7", "m7")]
    killed = [
        Kill(99.0, "worker", 12, 40000, 1, "command=Query running: UPDATE inbox SET lease_until"),
        Kill(50.0, "worker", 13, 40001, 2, "long before: not shown"),
    ]
    text = explain_overlaps(result.overlap_runs, runs, killed)
    assert "same inbox row: True; same token: False" in text
    first, second = (
        line
        for line in text.splitlines()
        if line.startswith("  running") or line.startswith("  started")
    )
    assert "pid=1" in first and "token=tok-a" in first and "token_at_end=tok-b" in first
    assert "TAKEN BACK WHILE RUNNING" in first
    assert "pid=2" in second and "TAKEN BACK" not in second
    assert "UPDATE inbox SET lease_until" in text and "long before" not in text


def test_the_logs_are_kept_with_their_tails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evidence, "KEPT", tmp_path / "kept")
    log = tmp_path / "worker0.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    text = keep_logs("tests/x.py::test[a-b]", [log, tmp_path / "worker1.log"], {"k.txt": "k"})
    (kept,) = (tmp_path / "kept").iterdir()
    assert (kept / "worker0.log").read_text() == log.read_text()
    assert (kept / "k.txt").read_text() == "k"
    assert "line 99" in text and "line 59" not in text  # the last 40 lines
    assert "worker1.log: never written" in text
