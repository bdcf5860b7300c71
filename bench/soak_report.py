"""The soak's totals table and verdict (exit code)."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bench.soak_stats import Probe, Totals, held_behind, median, quantile
from outbox.dsn import mask

if TYPE_CHECKING:
    from bench.soak import Broker
    from bench.soak_procs import Fleet
    from bench.soak_producer import Producer

MUST = "MUST be 0"


def print_totals(
    args: argparse.Namespace,
    broker: Broker,
    t: Totals,
    probe: Probe,
    fleet: Fleet,
    codes: dict[str, int | None],
    producer: Producer,
    outage: tuple[float, float] | None,
) -> int:
    """Print the table; 0 when every guarantee held, 1 otherwise."""
    lost_note = MUST
    if t.lost:
        by_state = Counter(lost.inbox_state for lost in t.lost)
        lost_note += " (inbox: " + ", ".join(f"{n} {s}" for s, n in by_state.most_common()) + ")"
    if t.lost and outage is not None and broker.real and broker.tansu is not None:
        down = datetime.fromtimestamp(outage[0], UTC)
        gone = [lost for lost in t.lost if lost.inbox_state == "not received"]
        held = sum(1 for lost in gone if lost.sent_at and lost.sent_at <= down)
        lost_note += (
            f"; {held} of the {len(gone)} not received were confirmed before tansu's SIGKILL"
            f" (in-memory storage); {held_behind(t.lost)} received ones wait behind one of"
            " those in their group (G5)"
        )
    e2e = t.end_to_end
    achieved = producer.stored / producer.seconds if producer.seconds else 0.0
    exits = {name: code for name, code in codes.items() if code != 0}
    restart = "none"
    if outage is not None:
        restart = f"1 ({broker.describe()}, down {outage[1] - outage[0]:.1f}s"
        restart += f", {broker.dropped} connections dropped)" if broker.dropped else ")"
    rows: list[tuple[str, str, str]] = [
        (
            "stored",
            f"{t.stored}",
            f"by {producer.transactions} transactions, {achieved:.0f}/s achieved",
        ),
        ("published", f"{t.published}", f"relay dead letters {t.publish_failed}"),
        ("duplicate deliveries absorbed", f"{t.duplicates}", "sum of inbox.duplicates"),
        ("done", f"{t.done}", ""),
        ("failed", f"{t.failed}", f"poison stored {len(producer.poison)}"),
        ("failed, not poison", f"{len(t.unexpected_failed)}", MUST),
        ("lost", f"{len(t.lost)}", lost_note),
        ("double effects", f"{t.double}", MUST),
        ("effects not matching state", f"{t.wrong_effects}", f"{MUST} (done w/o, failed with)"),
        ("group overlaps", f"{t.overlaps}", MUST),
        (
            "rolled back, yet present",
            f"{t.phantoms}",
            f"{MUST} ({len(producer.rolled_back)} rolled back)",
        ),
        (
            "max lag (oldest unfinished)",
            f"{probe.max_lag:.1f}s",
            "sampled every progress line"
            + (f"; {probe.errors} samples: database unavailable" if probe.errors else ""),
        ),
        (
            "end-to-end p50/p99/max",
            f"{median(e2e):.2f}/{quantile(e2e, 0.99):.2f}/{(e2e[-1] if e2e else 0):.2f}s",
            "occurred_at -> handler end",
        ),
        (
            "kills (SIGKILL + restart)",
            f"{fleet.kills()}",
            f"relay {fleet.kills('relay')}, worker {fleet.kills('worker')};"
            f" crashes {fleet.crashes()}",
        ),
        ("broker restarts", restart.split(" ", 1)[0], restart.partition(" ")[2].strip("()")),
        ("exit codes at SIGTERM", "all 0" if not exits else f"{exits}", ""),
        ("producer errors", f"{len(producer.errors)}", "; ".join(producer.errors[:2])),
    ]
    broken = (
        len(t.lost)
        + t.double
        + t.wrong_effects
        + t.overlaps
        + t.phantoms
        + len(t.unexpected_failed)
    )
    rows.append(
        ("verdict", "PASS" if broken == 0 else "FAIL", "exit 0" if broken == 0 else "exit 1")
    )
    width = max(len(r[0]) for r in rows)
    value = max(len(r[1]) for r in rows)
    print(
        f"\nsoak totals: {args.duration:.0f}s at {args.rate:g}/s, broker {mask(broker.direct)},"
        f" {args.relays} relays, {args.workers} workers x {args.concurrency}, {args.groups} groups"
        f" (machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    print("-" * (width + value + 40))
    for what, measured, note in rows:
        print(f"{what:<{width}}  {measured:>{value}}  {note}".rstrip())
    for lost in t.lost[:5]:
        print(
            f"  lost: {lost.event_id} outbox {lost.status} at {lost.sent_at},"
            f" inbox {lost.inbox_state}"
        )
    for event_id in t.unexpected_failed[:5]:
        print(f"  failed, not poison: {event_id}")
    return 0 if broken == 0 else 1
