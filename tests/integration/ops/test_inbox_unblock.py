"""``outbox inbox unblock GROUP`` on every database: a halted group goes on without its dead
message, which stays failed; the audit keeps who, why and the row's last error; a group that
is not halted (a mistyped name) is exit 1, not a silent success."""

from __future__ import annotations

import json

from sqlalchemy import Engine

from outbox import states
from tests.integration.inbox.helpers import make_kit, rows, store_jobs
from tests.integration.ops.inbox_rows import inbox_row, inbox_states
from tests.integration.ops.test_inbox_cli import audits, inbox, out_json


def test_unblock_dry_run_then_for_real_with_audit(dsn: str, engine: Engine) -> None:
    # Given a group halted by a (on_dead="halt"), b behind it
    kit = make_kit(engine, on_dead="halt", max_attempts=1)
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 1), ("b", 1)])
    kit.take_outbox()
    assert kit.drain() == ["a"]
    a_id = rows(engine)["a"].id

    # A dry run names the row and changes nothing
    dry = out_json(
        inbox(dsn, "unblock", "g", "--consumer", "c1", "--reason", "r", "--dry-run", "--json")
    )
    assert (dry["halted_by"], dry["released"], dry["dry_run"]) == (a_id, False, True)
    assert rows(engine)["a"].state == states.HALTED and audits(engine) == []

    # When the operator lets the group go on without a
    out = inbox(
        dsn, "unblock", "g", "--consumer", "c1", "--reason", "INC-9: skip the bad one",
        OUTBOX_ACTOR="oncall-eve",
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert f"released group 'g' of consumer 'c1', halted by row {a_id}" in out.stdout
    assert f"outbox inbox retry --id {a_id}" in out.stdout

    # Then b runs, a stays failed, and the audit says who, why, and what a was
    assert kit.drain() == ["a", "b"]
    states_now = {m: r.state for m, r in rows(engine).items()}
    assert states_now == {"a": states.FAILED, "b": states.DONE}
    (audit,) = audits(engine)
    assert (audit["action"], audit["target"], audit["actor"], audit["reason"]) == (
        "unblock", "inbox", "oncall-eve", "INC-9: skip the bad one",
    )  # fmt: skip
    detail = (
        audit["row_ids"] if isinstance(audit["row_ids"], list) else json.loads(audit["row_ids"])
    )
    assert [(d["id"], d["state"]) for d in detail] == [(a_id, states.HALTED)]
    assert "fail" in (detail[0]["last_error"] or "").lower()


def test_unblock_of_a_group_that_is_not_halted_is_an_error(dsn: str, engine: Engine) -> None:
    store_jobs(engine, [("a", 1)])
    make_kit(engine).take_outbox()
    for group, consumer in (("g", "c1"), ("no-such-group", "c1"), ("g", "C1")):
        out = inbox(dsn, "unblock", group, "--consumer", consumer, "--reason", "r")
        assert out.exit_code == 1, (group, consumer, out.output)
        assert f"group {group!r} of consumer {consumer!r} is not halted" in out.stderr
    assert audits(engine) == []

    usage = inbox(dsn, "unblock", "g", "--consumer", "c1", "--reason", "  ")
    assert usage.exit_code == 2 and "--reason" in usage.stderr
    missing = inbox(dsn, "unblock", "g", "--reason", "r")
    assert missing.exit_code == 2 and "--consumer" in missing.stderr


def test_unblock_releases_only_the_named_group_of_the_named_consumer(
    dsn: str, engine: Engine
) -> None:
    with engine.begin() as conn:
        target = inbox_row(conn, state=states.HALTED, group="g", seq=1, last_error="E1")
        other_group = inbox_row(conn, state=states.HALTED, group="h", seq=2, last_error="E2")
        other_consumer = inbox_row(
            conn, state=states.HALTED, consumer="c2", group="g", seq=3, last_error="E3"
        )
    answer = out_json(inbox(dsn, "unblock", "g", "--consumer", "c1", "--reason", "r", "--json"))
    assert (answer["halted_by"], answer["released"], answer["dry_run"]) == (target, True, False)
    assert inbox_states_of(engine, target, other_group, other_consumer) == [
        states.FAILED, states.HALTED, states.HALTED,
    ]  # fmt: skip
    again = inbox(dsn, "unblock", "g", "--consumer", "c1", "--reason", "r", "--json")
    assert again.exit_code == 1
    assert json.loads(again.stdout)["halted_by"] is None


def inbox_states_of(engine: Engine, *ids: int) -> list[str]:
    with engine.connect() as conn:
        found = inbox_states(conn)
    return [found[i][0] for i in ids]
