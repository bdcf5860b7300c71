"""Every action through the page changes the row in the database and writes the audit
record the CLI writes (same core function), with ``by`` the page's actor."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from outbox import states
from tests.integration.ops.inbox_rows import inbox_row
from tests.integration.ops.review_rows import contract_row
from tests.integration.ops.rows import outbox_row
from tests.integration.ui.client import (
    ACTOR,
    audits,
    client,
    post,
    state_of,
    status_of,
    text_of,
)

NOW = datetime.now(UTC)


def _ids(value: object) -> list[object]:
    return json.loads(value) if isinstance(value, str) else list(value)  # type: ignore[call-overload]


def test_retry_one_outbox_row(engine: Engine) -> None:
    with engine.begin() as conn:
        row = outbox_row(conn, status=states.FAILED, occurred_at=NOW, attempts=5,
                         last_error="smtp 550")  # fmt: skip
    c = client(engine)

    r = post(c, "/outbox/retry", {"ids": str(row), "reason": "smtp relay fixed"})

    assert r.status_code == 200, r.text
    assert f"1 outbox row(s) retried: {row}" in text_of(r.text)
    assert status_of(engine, row) == (states.PENDING, 0)
    [audit] = audits(engine)
    assert (audit.actor, audit.action, audit.target, audit.reason, audit.row_count) == (
        ACTOR, "retry", "outbox", "smtp relay fixed", 1,
    )  # fmt: skip
    assert _ids(audit.row_ids) == [row]
    # The row's page shows the record.
    page = text_of(c.get(f"/outbox/rows/{row}").text)
    assert "pending" in page and "smtp relay fixed" in page and ACTOR in page


def test_retry_selected_shows_the_count_first(engine: Engine) -> None:
    with engine.begin() as conn:
        a, b, c_ = (outbox_row(conn, status=states.FAILED, occurred_at=NOW) for _ in range(3))
    c = client(engine)

    confirm = post(c, "/outbox/retry/confirm", {"scope": "selected", "id": [a, c_]})

    assert confirm.status_code == 200, confirm.text
    assert "Retry 2 outbox row(s)?" in text_of(confirm.text)
    assert status_of(engine, a)[0] == states.FAILED  # nothing changed yet
    ids = re.search(r'name="ids" value="([^"]+)"', confirm.text)
    assert ids is not None and ids.group(1) == f"{a} {c_}"
    done = post(c, "/outbox/retry", {"ids": ids.group(1), "reason": "two of them"})
    assert done.status_code == 200
    assert [status_of(engine, i)[0] for i in (a, b, c_)] == ["pending", "failed", "pending"]
    assert _ids(audits(engine)[0].row_ids) == [a, c_]


def test_retry_every_row_matching_the_filter(engine: Engine) -> None:
    with engine.begin() as conn:
        mine = [outbox_row(conn, status=states.FAILED, occurred_at=NOW, last_error="quota")
                for _ in range(3)]  # fmt: skip
        other = outbox_row(conn, status=states.FAILED, occurred_at=NOW, last_error="dns")
        old = outbox_row(conn, status=states.FAILED, occurred_at=NOW - timedelta(days=3),
                         last_error="quota")  # fmt: skip
    c = client(engine)

    confirm = post(c, "/outbox/retry/confirm",
                   {"scope": "all", "queue": "mail", "error": "quota", "since": "1d",
                    "type": ""})  # fmt: skip

    assert "Retry 3 outbox row(s)?" in text_of(confirm.text)
    ids = re.search(r'name="ids" value="([^"]+)"', confirm.text)
    assert ids is not None
    post(c, "/outbox/retry", {"ids": ids.group(1), "reason": "quota raised"})
    assert all(status_of(engine, i)[0] == states.PENDING for i in mine)
    assert status_of(engine, other)[0] == status_of(engine, old)[0] == states.FAILED
    assert _ids(audits(engine)[0].row_ids) == mine


def test_a_retry_needs_a_reason_and_changes_nothing_without(engine: Engine) -> None:
    with engine.begin() as conn:
        row = outbox_row(conn, status=states.FAILED, occurred_at=NOW)
    c = client(engine)
    r = post(c, "/outbox/retry", {"ids": str(row), "reason": "   "})
    assert r.status_code == 400 and "reason: must not be empty" in r.text
    assert status_of(engine, row)[0] == states.FAILED and audits(engine) == []
    assert post(c, "/outbox/retry", {"ids": "", "reason": "x"}).status_code == 400


def test_retry_of_a_row_no_longer_failed_says_so(engine: Engine) -> None:
    with engine.begin() as conn:
        row = outbox_row(conn, status=states.PENDING, occurred_at=NOW)
    r = post(client(engine), "/outbox/retry", {"ids": str(row), "reason": "late click"})
    assert r.status_code == 200
    assert "0 outbox row(s) retried" in text_of(r.text) and "not failed" in r.text
    assert audits(engine) == []


def test_republish_a_sent_row(engine: Engine) -> None:
    with engine.begin() as conn:
        row = outbox_row(conn, status=states.SENT, occurred_at=NOW, sent_at=NOW)
    c = client(engine)
    assert "Republish row" in c.get(f"/outbox/rows/{row}").text

    r = post(c, "/outbox/republish", {"ids": str(row), "reason": "broker lost it"})

    assert r.status_code == 200, r.text
    assert status_of(engine, row)[0] == states.PENDING
    [audit] = audits(engine)
    assert (audit.action, audit.target, audit.actor) == ("republish", "outbox", ACTOR)


def test_retry_inbox_rows(engine: Engine) -> None:
    with engine.begin() as conn:
        a = inbox_row(conn, state=states.FAILED, consumer="billing", seq=1, last_error="x")
        b = inbox_row(conn, state=states.FAILED, consumer="billing", seq=2, last_error="x")
        other = inbox_row(conn, state=states.FAILED, consumer="mailer", seq=3)
    c = client(engine)

    confirm = post(c, "/inbox/retry/confirm", {"scope": "all", "consumer": "billing"})
    assert "Retry 2 inbox row(s)?" in text_of(confirm.text)
    r = post(c, "/inbox/retry", {"ids": f"{a} {b}", "reason": "db back"})

    assert r.status_code == 200, r.text
    assert [state_of(engine, i) for i in (a, b, other)] == ["ready", "ready", "failed"]
    [audit] = audits(engine)
    assert (audit.action, audit.target, audit.actor, audit.row_count) == (
        "retry", "inbox", ACTOR, 2,
    )  # fmt: skip
    assert "db back" in text_of(c.get(f"/inbox/rows/{a}").text)


def test_unblock_a_halted_group(engine: Engine) -> None:
    with engine.begin() as conn:
        head = inbox_row(conn, state=states.HALTED, consumer="billing", group="order-7",
                         last_error="card declined")  # fmt: skip
        nxt = inbox_row(conn, state=states.WAITING, consumer="billing", group="order-7", seq=2)
    c = client(engine)
    assert "Unblock" in c.get("/inbox/groups").text

    r = post(c, "/inbox/unblock",
             {"consumer": "billing", "group": "order-7", "reason": "refund by hand"})  # fmt: skip

    assert r.status_code == 200, r.text
    assert state_of(engine, head) == states.FAILED
    assert state_of(engine, nxt) == states.READY  # the group goes on
    [audit] = audits(engine)
    assert (audit.action, audit.target, audit.reason) == ("unblock", "inbox", "refund by hand")
    again = post(c, "/inbox/unblock", {"consumer": "billing", "group": "order-7", "reason": "x"})
    assert again.status_code == 409 and "not halted" in again.text


def test_resolve_a_row_held_for_review(engine: Engine) -> None:
    with engine.begin() as conn:
        row = contract_row(conn, state=states.REVIEW, reason="sequence-gap")
        done = contract_row(conn, state=states.DONE, seq=2)
    c = client(engine)
    assert "Resolve row" in c.get(f"/inbox/rows/{row}").text

    r = post(c, "/inbox/resolve", {"id": str(row), "mode": "skip", "reason": "obsolete"})

    assert r.status_code == 200, r.text
    assert state_of(engine, row) == states.DONE
    [audit] = audits(engine)
    assert (audit.action, audit.actor) == ("resolve-skip", ACTOR)
    refused = post(c, "/inbox/resolve", {"id": str(done), "mode": "applied", "reason": "x"})
    assert refused.status_code == 409 and "not review or unknown" in refused.text
    bad_mode = post(c, "/inbox/resolve", {"id": str(row), "mode": "maybe", "reason": "x"})
    assert bad_mode.status_code == 400 and "mode" in bad_mode.text
    assert len(audits(engine)) == 1
