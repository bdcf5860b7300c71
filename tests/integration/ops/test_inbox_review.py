"""``outbox inbox review | resolve`` on every database: the listing and one row whole, each
decision with what it does to the row, the effect ledger, the sequence key, the freed
successor and the group mark; dry runs; bad input. Two operators at once:
``test_inbox_resolve_race.py``."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import click
from sqlalchemy import Engine

from inbox.cli import inbox_group
from inbox.cli.review import commands as review_commands
from outbox import states
from outbox.clock import utcnow
from tests.integration.ops.review_rows import (
    SCHEMA,
    contract_row,
    everything,
    last_of,
    ledger,
    marked_groups,
    row_of,
    set_last,
)
from tests.integration.ops.test_inbox_cli import audits, inbox, out_json

ERROR = "Traceback (most recent call last):\n  File ...\nTimeoutError: the gateway did not answer"
CHECK = "Look up invoice 417 in the gateway's console: was reminder 4 sent?"


def seed_held(engine: Engine) -> dict[str, int]:
    """An unknown change 4 of invoice-417 (last applied 3) with its deferred successor 5, a
    review row of another consumer, a stale and a deferred row, and rows no listing shows."""
    with engine.begin() as conn:
        set_last(conn, "c1", "invoice-417", 3)
        ids = {
            "unknown": contract_row(
                conn, state=states.UNKNOWN, group="g", seq=10, attempts=1,
                reason="effect-unknown", next_check=CHECK, last_error=ERROR,
                effect_key="invoice-417:reminder", sequence_key="invoice-417", sequence=4,
            ),
            "successor": contract_row(
                conn, state=states.DEFERRED, group="g2", seq=11, sequence_key="invoice-417",
                sequence=5,
            ),
            "later": contract_row(
                conn, state=states.DEFERRED, seq=12, sequence_key="invoice-417", sequence=6
            ),
            "review": contract_row(
                conn, state=states.REVIEW, consumer="c2", seq=13, attempts=3,
                reason="not-transient", next_check="Fix the address, then run it again.",
            ),
            "stale": contract_row(
                conn, state=states.STALE, seq=14, reason="stale", sequence_key="invoice-417",
                sequence=2,
            ),
            "failed": contract_row(conn, state=states.FAILED, seq=15),
            "done": contract_row(conn, state=states.DONE, seq=16),
        }  # fmt: skip
    return ids


# ---- the commands' surface (no database)


def test_registered_with_env_vars_exit_codes_json_and_the_states_explained() -> None:
    for command in review_commands:
        assert inbox_group.commands[str(command.name)] is command
        assert "Exit codes:" in (command.help or ""), command.name
        assert "--json" in {o for p in command.params for o in p.opts}
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.envvar and param.show_envvar, (command.name, param.opts)
    review_help = inbox_group.commands["review"].help or ""
    for state in ("review", "unknown", "stale", "deferred"):
        assert re.search(rf"\n\s+{state}\s\s+\S", review_help), state
    assert "resolve ID --applied" in review_help and "--not-applied" in review_help


# ---- review


def test_review_lists_review_and_unknown_by_default(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    listed = out_json(inbox(dsn, "review", "--json"))
    assert [r["id"] for r in listed["rows"]] == [ids["unknown"], ids["review"]]
    assert (listed["total"], listed["more"], listed["limit"]) == (2, 0, 50)
    first = listed["rows"][0]
    assert (first["state"], first["reason"], first["next_check"]) == (
        states.UNKNOWN, "effect-unknown", CHECK,
    )  # fmt: skip
    assert (first["sequence_key"], first["sequence"], first["attempts"]) == ("invoice-417", 4, 1)

    text = inbox(dsn, "review")
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].split() == [
        "ID", "CONSUMER", "GROUP", "TYPE", "STATE", "REASON", "ATTEMPTS", "KEY#", "NEXT", "CHECK",
    ]  # fmt: skip
    assert lines[1].split()[:8] == [
        str(ids["unknown"]), "c1", "g", "invoice.reminder", "unknown", "effect-unknown", "1",
        "invoice-417#4",
    ]  # fmt: skip
    assert lines[-1] == "2 row(s) in review, unknown"


def test_review_other_states_consumer_and_limit(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    stale = out_json(inbox(dsn, "review", "--state", "stale", "--json"))
    assert [r["id"] for r in stale["rows"]] == [ids["stale"]]
    both = out_json(inbox(dsn, "review", "--state", "deferred", "--state", "stale", "--json"))
    assert [r["id"] for r in both["rows"]] == [ids["successor"], ids["later"], ids["stale"]]
    of_c2 = out_json(inbox(dsn, "review", "--consumer", "c2", "--json"))
    assert [r["id"] for r in of_c2["rows"]] == [ids["review"]]

    cut = inbox(dsn, "review", "--limit", "1")
    assert cut.exit_code == 0, cut.output
    assert cut.stdout.splitlines()[-1] == (
        "1 row(s) in review, unknown; 1 more not shown (of 2: raise --limit)"
    )
    cut_json = out_json(inbox(dsn, "review", "--limit", "1", "--json"))
    assert (len(cut_json["rows"]), cut_json["total"], cut_json["more"]) == (1, 2, 1)

    bad = inbox(dsn, "review", "--state", "failed")
    assert bad.exit_code == 2 and "--state" in bad.stderr


def test_review_show_gives_every_field_and_what_the_keys_hold(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    holder = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            SCHEMA.effects.insert().values(
                consumer="c1", effect_key="invoice-417:reminder", event_id=holder,
                applied_at=utcnow(),
            )
        )  # fmt: skip
    shown = out_json(inbox(dsn, "review", "--show", str(ids["unknown"]), "--json"))
    assert {
        k: shown[k]
        for k in (
            "id", "state", "reason", "attempts", "last_error", "next_check", "effect_key",
            "effect_owner", "sequence_key", "sequence", "last_applied", "serial_group",
        )
    } == {
        "id": ids["unknown"], "state": states.UNKNOWN, "reason": "effect-unknown",
        "attempts": 1, "last_error": ERROR, "next_check": CHECK,
        "effect_key": "invoice-417:reminder", "effect_owner": str(holder),
        "sequence_key": "invoice-417", "sequence": 4, "last_applied": 3, "serial_group": "g",
    }  # fmt: skip
    # The key's other unfinished rows (the stale one is finished)
    assert shown["held"] == [
        {"id": ids["successor"], "sequence": 5, "state": states.DEFERRED},
        {"id": ids["later"], "sequence": 6, "state": states.DEFERRED},
    ]
    assert shown["payload"] == {"n": 10} and shown["event_id"]

    text = inbox(dsn, "review", "--show", str(ids["unknown"]))
    assert text.exit_code == 0, text.output
    assert f"last_error: {ERROR}\n" in text.stdout  # whole, every line
    assert f"next_check: {CHECK}\n" in text.stdout
    assert "last_applied: 3\n" in text.stdout

    missing = inbox(dsn, "review", "--show", "999999")
    assert missing.exit_code == 1 and "no inbox row with id 999999" in missing.stderr


# ---- resolve


def resolve(dsn: str, row_id: int, *args: str) -> dict[str, object]:
    answer: dict[str, object] = out_json(
        inbox(dsn, "resolve", str(row_id), *args, "--reason", "INC-7", "--by", "alice", "--json")
    )
    return answer


def test_resolve_applied(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    before = utcnow()
    answer = resolve(dsn, ids["unknown"], "--applied")

    row = row_of(engine, ids["unknown"])
    assert row.state == states.DONE and row.finished_at >= before - timedelta(seconds=1)
    assert row.claim_token is None and row.lease_until is None and row.attempts == 1
    assert ledger(engine) == {("c1", "invoice-417:reminder"): str(row.event_id)}
    assert last_of(engine, "c1", "invoice-417") == 4
    # The deferred next change runs now; the one after it still waits for it
    assert row_of(engine, ids["successor"]).state == states.READY
    assert row_of(engine, ids["later"]).state == states.DEFERRED
    assert marked_groups(engine) == {("c1", "g"), ("c1", "g2")}
    (audit,) = audits(engine)
    assert (audit["action"], audit["target"], audit["actor"], audit["reason"]) == (
        "resolve-applied", "inbox", "alice", "INC-7",
    )  # fmt: skip
    assert (audit["row_count"], audit["row_ids"]) == (1, [ids["unknown"]])
    assert {
        k: answer[k]
        for k in ("id", "old_state", "new_state", "last_before", "last_after", "freed",
                  "audit_id", "effect_recorded", "dry_run", "by")
    } == {
        "id": ids["unknown"], "old_state": states.UNKNOWN, "new_state": states.DONE,
        "last_before": 3, "last_after": 4, "freed": ids["successor"], "audit_id": audit["id"],
        "effect_recorded": True, "dry_run": False, "by": "alice",
    }  # fmt: skip


def test_resolve_applied_says_when_another_event_holds_the_effect(engine: Engine, dsn: str) -> None:
    other = uuid.uuid4()
    with engine.begin() as conn:
        row_id = contract_row(
            conn, state=states.UNKNOWN, effect_key="mail:1", reason="effect-unknown"
        )
        conn.execute(
            SCHEMA.effects.insert().values(
                consumer="c1", effect_key="mail:1", event_id=other, applied_at=utcnow()
            )
        )
    out = inbox(dsn, "resolve", str(row_id), "--applied", "--reason", "checked")
    assert out.exit_code == 0, out.output
    assert f"effect key 'mail:1' was already in the ledger, held by event {other}" in out.stdout
    assert ledger(engine) == {("c1", "mail:1"): str(other)}
    assert row_of(engine, row_id).state == states.DONE
    lines = out.stdout.splitlines()
    assert lines[0] == f"resolved row {row_id} of consumer 'c1' as applied: unknown -> done"
    assert lines[-1].startswith(f"audit {audits(engine)[0]['id']}: resolve-applied by ")


def test_resolve_not_applied(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    before = utcnow()
    answer = resolve(dsn, ids["unknown"], "--not-applied")

    row = row_of(engine, ids["unknown"])
    assert (row.state, row.reason, row.next_check, row.attempts) == (states.READY, None, None, 1)
    assert row.finished_at is None and row.claim_token is None
    assert row.available_at >= before - timedelta(seconds=1)
    assert ledger(engine) == {}
    assert last_of(engine, "c1", "invoice-417") == 3
    assert row_of(engine, ids["successor"]).state == states.DEFERRED
    assert marked_groups(engine) == {("c1", "g")}
    (audit,) = audits(engine)
    assert (audit["action"], audit["row_ids"]) == ("resolve-not-applied", [ids["unknown"]])
    assert (answer["new_state"], answer["last_before"], answer["last_after"], answer["freed"]) == (
        states.READY, 3, 3, None,
    )  # fmt: skip


def test_resolve_skip(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    answer = resolve(dsn, ids["unknown"], "--skip")

    row = row_of(engine, ids["unknown"])
    assert (row.state, row.reason) == (states.DONE, "skipped") and row.finished_at is not None
    assert ledger(engine) == {}
    assert last_of(engine, "c1", "invoice-417") == 4
    assert row_of(engine, ids["successor"]).state == states.READY
    assert marked_groups(engine) == {("c1", "g"), ("c1", "g2")}
    (audit,) = audits(engine)
    assert (audit["action"], audit["row_ids"]) == ("resolve-skip", [ids["unknown"]])
    assert (answer["freed"], answer["effect_recorded"]) == (ids["successor"], None)


def test_resolve_review_row_without_keys_or_group(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    answer = resolve(dsn, ids["review"], "--skip")
    assert (answer["old_state"], answer["last_before"], answer["freed"]) == (
        states.REVIEW, None, None,
    )  # fmt: skip
    assert row_of(engine, ids["review"]).state == states.DONE
    assert marked_groups(engine) == set()


def test_dry_run_changes_nothing(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    before = everything(engine)
    for mode, after, freed in [
        ("--applied", 4, ids["successor"]), ("--not-applied", 3, None),
        ("--skip", 4, ids["successor"]),
    ]:  # fmt: skip
        answer = resolve(dsn, ids["unknown"], mode, "--dry-run")
        assert (answer["dry_run"], answer["audit_id"]) == (True, None)
        assert (answer["last_before"], answer["last_after"], answer["freed"]) == (3, after, freed)
        assert everything(engine) == before, mode
    text = inbox(dsn, "resolve", str(ids["unknown"]), "--applied", "--dry-run", "--reason", "r")
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[:3] == [
        f"would resolve row {ids['unknown']} of consumer 'c1' as applied: unknown -> done",
        "sequence key 'invoice-417' (this row: 4): last applied 3 -> 4",
        f"would free row {ids['successor']}: deferred -> ready",
    ]
    assert everything(engine) == before


def test_bad_input_is_refused_and_writes_nothing(engine: Engine, dsn: str) -> None:
    ids = seed_held(engine)
    before = everything(engine)
    unknown = str(ids["unknown"])
    cases = [
        (["999999", "--applied", "--reason", "r"], 1, "no inbox row with id 999999"),
        ([str(ids["stale"]), "--skip", "--reason", "r"], 1, f"row {ids['stale']} is stale"),
        ([str(ids["failed"]), "--applied", "--reason", "r"], 1, f"row {ids['failed']} is failed"),
        ([unknown, "--reason", "r"], 2, "exactly one of --applied, --not-applied, --skip"),
        ([unknown, "--applied", "--skip", "--reason", "r"], 2, "exactly one of"),
        ([unknown, "--applied"], 2, "--reason"),
        ([unknown, "--applied", "--reason", "  "], 2, "--reason"),
        (["abc", "--applied", "--reason", "r"], 2, "ID"),
    ]
    for args, code, message in cases:
        out = inbox(dsn, "resolve", *args)
        assert out.exit_code == code, (args, out.output)
        assert message in out.stderr, (args, out.stderr)
    assert everything(engine) == before
    # A row resolved already is refused the second time, naming its new state
    resolve(dsn, ids["unknown"], "--applied")
    again = inbox(dsn, "resolve", unknown, "--not-applied", "--reason", "r")
    assert again.exit_code == 1 and f"row {unknown} is done, not review or unknown" in again.stderr
    assert len(audits(engine)) == 1


def test_groups_names_a_group_held_for_review(engine: Engine, dsn: str) -> None:
    with engine.begin() as conn:
        held = contract_row(conn, state=states.UNKNOWN, group="order-9", reason="effect-unknown")
        contract_row(conn, state=states.WAITING, group="order-9", seq=2)

    found = {g["group"]: g for g in out_json(inbox(dsn, "groups", "--json"))}

    assert found["order-9"]["head"]["id"] == held
    assert found["order-9"]["why"] == f"held by message {held} in unknown (the message contract)"
    assert f"resolve {held}" in found["order-9"]["hint"]
