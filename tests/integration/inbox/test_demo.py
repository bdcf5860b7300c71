"""The consumer half of ``outbox demo`` on its embedded default, a SQLite file."""

from __future__ import annotations

import itertools
from pathlib import Path

from outbox_cli.demo import run_demo
from outbox_cli.demo_consumer import run_workers


def test_two_workers_run_s1_in_order_on_sqlite(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'demo.db'}"
    run_demo(dsn, echo=lambda _: None)
    runs = run_workers(dsn, workers=2, time_limit=60)
    assert [r.mark for r in runs] == ["a", "b", "d", "e", "g", "c", "f"]
    # never two at once: each started after the previous one finished
    assert all(b.started >= a.finished for a, b in itertools.pairwise(runs))
