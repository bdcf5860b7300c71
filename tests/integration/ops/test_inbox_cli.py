"""``outbox inbox failed | retry | prune | groups`` on every database (unblock:
``test_inbox_unblock.py``).

Commands run in-process through click's runner (fast). Two tests run them as an operator
does, ``outbox`` processes with the DSN in the environment: the masked database error, and
two concurrent ``retry --all``.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from datetime import timedelta
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import URL

import outbox
from inbox.cli import inbox_group
from inbox.cli.ops import commands as ops_commands
from inbox.cli.repair import commands as repair_commands
from outbox import schema, states
from outbox_cli.main import main
from tests.integration.inbox.helpers import make_kit, rows, store_jobs
from tests.integration.ops.inbox_rows import (
    NOW,
    OLD,
    SCHEMA,
    inbox_row,
    inbox_states,
    pending_outbox_row,
)
from tests.integration.ops.test_cli import OUTBOX
from tests.integration.ops.test_concurrent_retry import wait_until_both_blocked
from tests.integration.relay.publishers_fixtures import unique

RECENT = NOW - timedelta(minutes=10)


def inbox(dsn: str, *args: str, **env: str) -> Result:
    """``outbox inbox ARGS`` in-process, the DSN from the environment as under cron."""
    return CliRunner().invoke(main, ["inbox", *args], env={"OUTBOX_DSN": dsn, **env})


def out_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def audits(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return [r._mapping for r in conn.execute(select(SCHEMA.audit).order_by(SCHEMA.audit.c.id))]


# ---- the commands' surface (no database)


def test_registered_on_inbox_with_env_vars_exit_codes_and_json() -> None:
    assert {"failed", "retry", "prune", "groups", "unblock"} <= set(inbox_group.commands)
    for command in [*ops_commands, *repair_commands]:
        assert inbox_group.commands[str(command.name)] is command
        assert "Exit codes:" in (command.help or ""), command.name
        opts = {o for p in command.params for o in p.opts}
        assert "--json" in opts, command.name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.envvar and param.show_envvar, (command.name, param.opts)
    prune_help = inbox_group.commands["prune"].help or ""
    assert "redelivery window" in prune_help and "retry window" in prune_help
    assert "unblock" in (inbox_group.commands["retry"].help or "")


# ---- failed


@pytest.fixture
def dead(engine: Engine) -> dict[str, int]:
    with engine.begin() as conn:
        return {
            "a": inbox_row(
                conn, state=states.FAILED, group="g1", attempts=5, seq=1,
                last_error="RuntimeError: SMTP 550 mailbox unavailable\nTraceback ...",
                payload={"to": "a@example.org"},
            ),
            "halted": inbox_row(
                conn, state=states.HALTED, group="g2", attempts=1, seq=2,
                last_error="ValueError: bad", finished_at=RECENT,
            ),
            "sms": inbox_row(
                conn, state=states.FAILED, consumer="c2", type_="sms", attempts=3, seq=3,
                last_error="timeout", finished_at=RECENT,
            ),
            "done": inbox_row(conn, state=states.DONE, seq=4),
            "waiting": inbox_row(conn, state=states.WAITING, group="g2", seq=5),
        }  # fmt: skip


def test_failed_lists_dead_and_halted_rows_with_filters(dsn: str, dead: dict[str, int]) -> None:
    everything = out_json(inbox(dsn, "failed", "--json"))
    assert [r["id"] for r in everything] == [dead["a"], dead["halted"], dead["sms"]]
    assert {r["state"] for r in everything} == {states.FAILED, states.HALTED}

    def ids(*args: str, **env: str) -> list[int]:
        return [r["id"] for r in out_json(inbox(dsn, "failed", "--json", *args, **env))]

    assert ids("--consumer", "c2") == [dead["sms"]]
    assert ids(OUTBOX_TYPE="sms") == [dead["sms"]]  # every option reads its env var
    assert ids("--group", "g2") == [dead["halted"]]
    assert ids("--error-like", "550") == [dead["a"]]
    assert ids("--error-like", "%") == []  # text, not a LIKE pattern
    assert ids("--since", "1h") == [dead["halted"], dead["sms"]]  # died in the last hour
    assert ids("--limit", "1") == [dead["a"]]

    listing = inbox(dsn, "failed")
    assert listing.exit_code == 0, listing.stderr
    assert "SMTP 550 mailbox unavailable" in listing.stdout and "Traceback" not in listing.stdout
    assert "halted" in listing.stdout and "3 dead row(s)" in listing.stdout


def test_failed_show_and_errors(dsn: str, dead: dict[str, int]) -> None:
    row = out_json(inbox(dsn, "failed", "--show", str(dead["a"]), "--json"))
    assert row["payload"] == {"to": "a@example.org"} and row["headers"] == {"trace": "t-1"}
    assert (row["attempts"], row["consumer"], row["serial_group"]) == (5, "c1", "g1")
    assert row["last_error"].startswith("RuntimeError: SMTP 550") and row["event_id"]

    text = inbox(dsn, "failed", "--show", str(dead["a"]))
    assert text.exit_code == 0 and '"to": "a@example.org"' in text.stdout

    missing = inbox(dsn, "failed", "--show", "999999")
    assert missing.exit_code == 1 and "no inbox row with id 999999" in missing.stderr
    bad = inbox(dsn, "failed", "--since", "yesterday")
    assert bad.exit_code == 2 and "--since" in bad.stderr


# ---- retry


def test_retry_dry_run_then_by_id_with_audit(
    dsn: str, engine: Engine, dead: dict[str, int]
) -> None:
    dry = out_json(inbox(dsn, "retry", "--all", "--dry-run", "--json", "--reason", "look"))
    assert dry["ids"] == [dead["a"], dead["halted"], dead["sms"]] and dry["dry_run"]
    assert dry["released"] == [{"consumer": "c1", "group": "g2", "halted_by": dead["halted"]}]
    with engine.connect() as conn:
        assert inbox_states(conn)[dead["a"]] == (states.FAILED, 5)
    assert audits(engine) == []

    # --id of a dead row and of a done row: the dead one is retried, the other named, exit 1
    out = inbox(
        dsn, "retry", "--id", str(dead["a"]), "--id", str(dead["done"]),
        "--reason", "INC-7: mailbox fixed", OUTBOX_ACTOR="oncall-bob",
    )  # fmt: skip
    assert out.exit_code == 1
    assert f"retried 1 row(s): {dead['a']}" in out.stdout
    assert str(dead["done"]) in out.stderr and "not retried" in out.stderr
    with engine.connect() as conn:
        row = conn.execute(select(SCHEMA.inbox).where(SCHEMA.inbox.c.id == dead["a"])).one()
    assert (row.state, row.attempts, row.finished_at) == (states.READY, 0, None)
    assert row.available_at >= NOW - timedelta(minutes=1)
    (audit,) = audits(engine)
    assert (audit["actor"], audit["action"], audit["target"], audit["row_count"]) == (
        "oncall-bob", "retry", "inbox", 1,
    )  # fmt: skip
    assert audit["reason"] == "INC-7: mailbox fixed"
    (kept,) = audit["row_ids"]
    assert (kept["id"], kept["state"], kept["attempts"]) == (dead["a"], states.FAILED, 5)
    assert kept["last_error"].startswith("RuntimeError: SMTP 550")

    # Conditional: the row is no longer dead, a second retry changes nothing
    again = inbox(dsn, "retry", "--id", str(dead["a"]), "--reason", "twice")
    assert again.exit_code == 1 and len(audits(engine)) == 1

    for usage in (["--reason", "x"], ["--all", "--id", "1", "--reason", "x"], ["--all"]):
        assert inbox(dsn, "retry", *usage).exit_code == 2, usage
    assert inbox(dsn, "retry", "--all", "--reason", " ").exit_code == 2


def test_retry_all_with_filters_and_a_group_halted_by_another_row(dsn: str, engine: Engine) -> None:
    with engine.begin() as conn:
        older = inbox_row(conn, state=states.FAILED, group="g", seq=1, last_error="x")
        holder = inbox_row(conn, state=states.HALTED, group="g", seq=2, last_error="y")
        other_type = inbox_row(conn, state=states.FAILED, group="g", seq=3, type_="sms")
    out = out_json(
        inbox(dsn, "retry", "--id", str(older), "--reason", "r", "--json", "--by", "ann")
    )
    assert out["ids"] == [older] and out["released"] == []
    assert out["still_halted"] == [{"consumer": "c1", "group": "g", "halted_by": holder}]
    text = inbox(dsn, "retry", "--all", "--type", "sms", "--group", "g", "--reason", "r")
    assert text.exit_code == 0, text.stderr
    assert f"stays halted by row {holder}" in text.stdout
    assert "outbox inbox unblock g --consumer c1" in text.stdout
    with engine.connect() as conn:
        found = inbox_states(conn)
    assert found[older] == found[other_type] == (states.READY, 0)
    assert found[holder][0] == states.HALTED
    nothing = inbox(dsn, "retry", "--all", "--consumer", "nobody", "--reason", "r")
    assert nothing.exit_code == 0 and "retried 0 row(s)" in nothing.stdout


def test_retrying_a_halted_head_releases_its_group_in_order(dsn: str, engine: Engine) -> None:
    # Given a group halted by a (on_dead="halt"), b behind it, and u, more urgent, arriving
    # while it is halted. Names of its own: MariaDB's GET_LOCK names are server-wide, and a
    # test in another database holding the lock of ("c1", "g") would defer the promotion
    # this test waits for.
    consumer, name = unique("c-"), unique("g-")
    kit = make_kit(engine, consumer, on_dead="halt", max_attempts=1)
    kit.fail = {"a": 1}
    store_jobs(engine, [("a", 2), ("b", 2)], group=name)
    kit.take_outbox()
    assert kit.drain() == ["a"]
    store_jobs(engine, [("u", 1)], group=name)
    assert kit.take_outbox() == 1
    assert kit.drain() == ["a"]
    a_id = rows(engine, consumer)["a"].id
    (group,) = out_json(inbox(dsn, "groups", "--json"))
    assert group["why"] == f"halted by dead message {a_id}" and group["head"]["id"] == a_id

    # When the fix is deployed and the operator retries a
    kit.fail = {}
    dry = inbox(dsn, "retry", "--id", str(a_id), "--reason", "fixed", "--dry-run")
    assert (
        f"would release group {name!r} of consumer {consumer!r}, halted by row {a_id}" in dry.stdout
    )
    out = inbox(dsn, "retry", "--id", str(a_id), "--reason", "fixed")
    assert out.exit_code == 0, out.stderr
    assert f"released group {name!r} of consumer {consumer!r}, halted by row {a_id}" in (out.stdout)

    # Then the group goes on in (priority, seq) order, a in its place before b
    assert kit.drain() == ["a", "u", "a", "b"]
    found = rows(engine, consumer)
    assert {m: r.state for m, r in found.items()} == dict.fromkeys("abu", states.DONE)
    assert out_json(inbox(dsn, "groups", "--json")) == []


# ---- prune


def test_prune_forgets_group_rows_with_nothing_to_check(dsn: str, engine: Engine) -> None:
    groups = schema.groups_table
    with engine.begin() as conn:
        conn.execute(
            groups.insert(),
            [
                {"consumer": "c1", "serial_group": "idle", "needs_check": False},
                {"consumer": "c1", "serial_group": "marked", "needs_check": True},
                {"consumer": "c2", "serial_group": "idle", "needs_check": False},
            ],
        )

    def left() -> set[tuple[str, str]]:
        with engine.connect() as conn:
            return {
                tuple(r) for r in conn.execute(select(groups.c.consumer, groups.c.serial_group))
            }

    one = out_json(inbox(dsn, "prune", "--older-than", "30d", "--consumer", "c1", "--json"))
    assert one["groups_forgotten"] == 1
    assert left() == {("c1", "marked"), ("c2", "idle")}
    text = inbox(dsn, "prune", "--older-than", "30d")
    assert "1 idle group row(s) forgotten" in text.stdout, text.output
    assert left() == {("c1", "marked")}


def test_prune_deletes_only_old_done_rows_in_batches(dsn: str, engine: Engine) -> None:
    with engine.begin() as conn:
        old_done = [
            inbox_row(conn, state=states.DONE, consumer=c, seq=i)
            for i, c in enumerate(["c1", "c2", "c2", "c2"])
        ]
        kept = [
            inbox_row(conn, state=states.DONE, seq=10, finished_at=RECENT),
            *(inbox_row(conn, state=s, seq=11, group="g") for s in
              (states.FAILED, states.HALTED, states.WAITING, states.READY, states.RETRY)),
            inbox_row(conn, state=states.PROCESSING, seq=12, lease_until=NOW),
        ]  # fmt: skip

    dry = out_json(inbox(dsn, "prune", "--older-than", "30d", "--dry-run", "--json"))
    assert (dry["dry_run"], dry["would_delete"]) == (True, 4)
    text_dry = inbox(dsn, "prune", "--older-than", "30d", "--dry-run", "--consumer", "c1")
    assert "would delete 1 done row(s) of consumer 'c1'" in text_dry.stdout

    one = out_json(inbox(dsn, "prune", "--older-than", "30d", "--consumer", "c1", "--json"))
    assert (one["deleted"], one["batches"]) == (1, 1)
    batched = out_json(
        inbox(dsn, "prune", "--json", OUTBOX_INBOX_PRUNE_OLDER_THAN="30d",
              OUTBOX_INBOX_PRUNE_BATCH="2")
    )  # fmt: skip
    assert (batched["deleted"], batched["batches"]) == (3, 2)
    assert batched["rows_per_second"] > 0
    with engine.connect() as conn:
        assert sorted(inbox_states(conn)) == sorted(kept)
    assert set(old_done).isdisjoint(kept)

    text = inbox(dsn, "prune", "--older-than", "1m")  # the recent done row goes too
    assert text.exit_code == 0, text.stderr
    assert "deleted 1 done row(s) older than 1m" in text.stdout and "rows/s" in text.stdout
    assert inbox(dsn, "prune", "--older-than", "a month").exit_code == 2
    assert inbox(dsn, "prune", "--older-than", "1d", "--batch", "0").exit_code == 2


# ---- groups


def test_groups_names_what_holds_each_group(dsn: str, engine: Engine) -> None:
    with engine.begin() as conn:
        ids = {
            "halted": inbox_row(conn, state=states.HALTED, group="gh", seq=1, received_at=OLD),
            "processing": inbox_row(
                conn, state=states.PROCESSING, group="gp", seq=1, claimed_at=RECENT,
                lease_until=NOW + timedelta(hours=1),
            ),
            "expired": inbox_row(
                conn, state=states.PROCESSING, group="gx", seq=1, claimed_at=RECENT,
                lease_until=RECENT,
            ),
            "retry": inbox_row(
                conn, state=states.RETRY, group="gr", seq=1, available_at=NOW + timedelta(hours=1),
            ),
            "later": inbox_row(conn, state=states.WAITING, group="gw", priority=2, seq=1),
            "urgent": inbox_row(conn, state=states.WAITING, group="gw", priority=1, seq=2),
            "behind_outbox": inbox_row(conn, state=states.WAITING, group="go", seq=10**9),
            "running_alone": inbox_row(
                conn, state=states.PROCESSING, group="ok", seq=1, lease_until=NOW
            ),
            "other_consumer": inbox_row(conn, state=states.WAITING, group="gw", consumer="c2"),
        }  # fmt: skip
        for group in ("gh", "gp", "gx", "gr"):
            inbox_row(conn, state=states.WAITING, group=group, seq=2, received_at=RECENT)
        inbox_row(conn, state=states.DONE, group="done-history", seq=1)
        outbox_id = pending_outbox_row(conn, group="go")

    found = {(g["consumer"], g["group"]): g for g in out_json(inbox(dsn, "groups", "--json"))}
    assert set(found) == {("c1", g) for g in ("gh", "gp", "gx", "gr", "gw", "go")} | {("c2", "gw")}
    why = {group: g["why"] for (_, group), g in found.items() if _ == "c1"}
    head = {group: g["head"]["id"] for (_, group), g in found.items() if _ == "c1"}
    assert why["gh"] == f"halted by dead message {ids['halted']}"
    assert "unblock gh --consumer c1" in found[("c1", "gh")]["hint"]
    assert why["gp"].startswith("head is processing since") and "lease" not in why["gp"]
    assert "lease expired at" in why["gx"]
    assert why["gr"].startswith(f"waiting behind retry {ids['retry']} due at")
    assert why["gw"] == "waiting: head not yet promoted"
    assert why["go"] == f"waiting for outbox row {outbox_id}: ahead in the group, not delivered yet"
    assert head == {
        "gh": ids["halted"], "gp": ids["processing"], "gx": ids["expired"],
        "gr": ids["retry"], "gw": ids["urgent"], "go": ids["behind_outbox"],
    }  # fmt: skip
    gw = found[("c1", "gw")]
    assert gw["waiting"] == 2 and gw["head"] == {
        "id": ids["urgent"], "type": "job", "priority": 1, "seq": 2, "state": states.WAITING,
    }  # fmt: skip
    assert found[("c1", "gh")]["head"]["state"] == states.HALTED

    only_c2 = out_json(inbox(dsn, "groups", "--consumer", "c2", "--json"))
    assert [(g["consumer"], g["group"]) for g in only_c2] == [("c2", "gw")]
    text = inbox(dsn, "groups", "--limit", "2")
    assert text.exit_code == 0, text.stderr
    assert "WHY" in text.stdout and "2 group(s) (limit reached)" in text.stdout


def groups_process(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``outbox inbox groups ARGS`` as an operator runs it: its own process, DSN from the env."""
    done = subprocess.run(
        [OUTBOX, "inbox", "groups", *args], env={**os.environ, "OUTBOX_DSN": dsn},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def test_groups_lists_groups_nobody_runs_and_groups_still_in_the_outbox(
    dsn: str, engine: Engine
) -> None:
    # Given group g's two messages and a delayed one of group gd, stored; no relay, no worker
    store_jobs(engine, [("a", 2), ("b", 2)])
    with engine.begin() as conn:
        outbox.store(conn, "jobs", "job", {"mark": "d"}, serial_group="gd", delay=3600)
    with engine.connect() as conn:
        outbox_ids = dict(conn.execute(select(SCHEMA.outbox.c.serial_group, func.min(
            SCHEMA.outbox.c.id)).group_by(SCHEMA.outbox.c.serial_group)).all())  # fmt: skip

    # Then both are listed for every consumer of the queue, their head the first outbox row
    found = {g["group"]: g for g in json.loads(groups_process(dsn, "--json").stdout)}
    assert set(found) == {"g", "gd"}
    g, gd = found["g"], found["gd"]
    assert g["consumer"] is None and g["pending"] == 2
    assert (
        g["why"] == f"waiting for outbox row {outbox_ids['g']}: not delivered to any consumer yet"
    )
    assert "relay" in g["hint"] and "'jobs'" in g["hint"]
    assert g["head"] == {
        "id": outbox_ids["g"], "type": "job", "priority": 2, "seq": outbox_ids["g"],
        "state": states.PENDING,
    }  # fmt: skip
    assert gd["why"].startswith(f"waiting for outbox row {outbox_ids['gd']}: not due until")
    text = groups_process(dsn, "--consumer", "c1").stdout
    assert "2 group(s)" in text and "not delivered to any consumer yet" in text
    line = next(row.split() for row in text.splitlines()[1:] if row.split()[1] == "g")
    assert line[:7] == ["-", "g", str(outbox_ids["g"]), "pending", "2", "job", "2"]

    # When a database-source worker takes g into the inbox, and nothing runs it
    kit = make_kit(engine)
    assert kit.take_outbox() == 2  # the delayed one is not due
    a_id = rows(engine)["a"].id
    (g, gd) = sorted(json.loads(groups_process(dsn, "--json").stdout), key=lambda r: r["group"])
    counts = (g["consumer"], g["group"], g["ready"], g["waiting"], g["pending"])
    assert counts == ("c1", "g", 2, 0, 0)
    assert g["why"] == f"head {a_id} is ready: waiting for a worker"
    assert g["head"]["id"] == a_id and g["head"]["state"] == states.READY
    assert gd["consumer"] is None

    # And a more urgent message of g is stored but not delivered: the ready head waits for it,
    # and g is listed once, for the consumer that has it
    store_jobs(engine, [("u", 1)])
    with engine.connect() as conn:
        u_id = conn.execute(select(func.max(SCHEMA.outbox.c.id))).scalar_one()
    reports = json.loads(groups_process(dsn, "--json", "--consumer", "c1").stdout)
    found = {r["group"]: r for r in reports}
    assert len(reports) == 2 and (found["g"]["consumer"], found["gd"]["consumer"]) == ("c1", None)
    why = found["g"]["why"]
    assert why == f"waiting for outbox row {u_id}: ahead in the group, not delivered yet"

    # Once a worker ran everything due, only the delayed group is left
    assert kit.take_outbox() == 1
    assert kit.drain() == ["u", "a", "b"]
    assert [r["group"] for r in json.loads(groups_process(dsn, "--json").stdout)] == ["gd"]


# ---- as an operator runs them


def test_database_errors_exit_1_with_the_password_masked(dialect: str) -> None:
    if dialect == "sqlite":
        unreachable = "sqlite:////nonexistent-dir/x.db"
    else:
        drv = "postgresql" if dialect == "postgresql" else "mysql"
        unreachable = URL.create(drv, "ops", "s3cret", "127.0.0.1", 1, "db").render_as_string(
            hide_password=False
        )
    down = subprocess.run(
        [OUTBOX, "inbox", "retry", "--all", "--reason", "r"],
        env={**os.environ, "OUTBOX_DSN": unreachable}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert down.returncode == 1 and down.stderr.startswith("error:"), down.stderr
    assert "s3cret" not in down.stdout + down.stderr
    for command in (["failed"], ["groups"], ["prune", "--older-than", "30d"]):
        out = inbox(unreachable, *command)
        assert out.exit_code == 1, (command, out.stderr)
        assert out.stderr.startswith("error:"), out.stderr
        assert "s3cret" not in out.stdout + out.stderr


# ---- two operators at once


def test_concurrent_retry_all_retries_each_row_once(engine: Engine, dsn: str, dialect: str) -> None:
    # Given 1,500 dead rows (two id chunks), every 100th halted and holding its own group
    rows_ = 1500
    with engine.begin() as conn:
        conn.execute(
            SCHEMA.inbox.insert(),
            [
                {
                    "event_id": uuid.uuid4(), "consumer": "c1", "queue": "jobs", "priority": 1,
                    "serial_group": f"g{i}" if i % 100 == 0 else None, "seq": i, "type": "job",
                    "payload": "{}", "headers": "{}", "attempts": 5, "last_error": "boom",
                    "state": states.HALTED if i % 100 == 0 else states.FAILED,
                    "available_at": OLD, "received_at": OLD, "finished_at": OLD,
                }
                for i in range(rows_)
            ],
        )  # fmt: skip

    # When two processes retry --all at once: the test holds a lock on one row until both
    # wait for it, so their transactions truly overlap
    env = {**os.environ, "OUTBOX_DSN": dsn}
    t = SCHEMA.inbox
    with engine.connect() as holder:
        if dialect != "sqlite":
            holder.begin()
            holder.execute(select(t.c.id).order_by(t.c.id.desc()).limit(1).with_for_update())
        procs = [
            subprocess.Popen(
                [OUTBOX, "inbox", "retry", "--all", "--json", "--reason", "race", "--by", who],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for who in ("alice", "bob")
        ]
        wait_until_both_blocked(engine, dialect, procs)
        holder.rollback()
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out + err

    # Then every row is ready once more, named by exactly one audit record, and each halted
    # group was released by exactly one of them
    results = [json.loads(out) for out, _ in outputs]
    with engine.connect() as conn:
        assert {s for s, _ in inbox_states(conn).values()} == {states.READY}
        all_ids = set(conn.execute(select(t.c.id)).scalars())
    named = [row["id"] for a in audits(engine) for row in a["row_ids"]]
    assert len(named) == rows_ and set(named) == all_ids
    assert sorted(len(r["ids"]) for r in results) == [0, rows_]  # one waited, then found none
    released = [g["group"] for r in results for g in r["released"]]
    assert sorted(released) == sorted(f"g{i}" for i in range(0, rows_, 100))
