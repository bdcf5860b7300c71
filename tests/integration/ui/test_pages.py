"""Every page that reads, on a real database: status codes, filters, pages, escaping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from outbox import states
from outbox.dsn import make_engine
from tests.integration.ops.inbox_rows import inbox_row
from tests.integration.ops.review_rows import contract_row
from tests.integration.ops.rows import outbox_row
from tests.integration.ui.client import client, post, text_of

NOW = datetime.now(UTC)
SCRIPT = "<script>alert('x')</script>"


def test_every_page_answers(engine: Engine) -> None:
    # Given one row of each kind a page lists
    with engine.begin() as conn:
        failed = outbox_row(conn, status=states.FAILED, occurred_at=NOW, last_error="smtp 550")
        outbox_row(conn, occurred_at=NOW - timedelta(seconds=30))
        dead = inbox_row(conn, state=states.HALTED, consumer="billing", group="order-7",
                         last_error="boom")  # fmt: skip
        inbox_row(conn, state=states.WAITING, consumer="billing", group="order-7", seq=2)
        held = contract_row(conn, state=states.REVIEW, consumer="billing", reason="sequence-gap")
    c = client(engine)

    # When / Then
    overview = c.get("/")
    assert overview.status_code == 200
    seen = text_of(overview.text)
    assert "mail 1 1" in seen  # queue, priority, pending
    assert "billing" in seen
    for path in (
        "/outbox/failed", f"/outbox/rows/{failed}", "/inbox/failed", f"/inbox/rows/{dead}",
        "/inbox/groups", "/inbox/review", f"/inbox/rows/{held}", "/static/style.css",
    ):  # fmt: skip
        r = c.get(path)
        assert r.status_code == 200, (path, r.text)
    assert "smtp 550" in c.get("/outbox/failed").text
    groups = text_of(c.get("/inbox/groups").text)
    assert "order-7" in groups and f"halted by dead message {dead}" in groups
    assert "sequence-gap" in c.get("/inbox/review").text


def test_missing_rows_bad_filters_and_get_on_actions(engine: Engine) -> None:
    c = client(engine)
    assert c.get("/outbox/rows/999999").status_code == 404
    assert c.get("/inbox/rows/999999").status_code == 404
    bad = c.get("/outbox/failed?since=yesterday-ish")
    assert bad.status_code == 400 and "since:" in bad.text
    assert c.get("/inbox/failed?page=0").status_code == 400
    assert c.get("/rows?id=abc").status_code == 400
    # Past what a BIGINT holds, or digits int() refuses: no such row / bad input, never a 500.
    huge = str(2**63)
    for kind in ("outbox", "inbox"):
        r = c.get(f"/{kind}/rows/{huge}")
        assert r.status_code == 404 and "id:" in r.text, kind
    assert c.get("/outbox/failed?page=" + "9" * 20).status_code == 400
    for value in (huge, "\u00b2"):
        r = post(c, "/outbox/retry", {"ids": value, "reason": "x"})
        assert r.status_code == 400 and "ids:" in r.text, value
        assert "default-src 'none'" in r.headers["content-security-policy"]
    opened = c.get("/rows?id=12&kind=inbox")
    assert opened.status_code == 303 and opened.headers["location"] == "/inbox/rows/12"
    # No action by GET: every action's URL answers 405 to a GET.
    for path in ("/outbox/retry", "/outbox/retry/confirm", "/outbox/republish", "/inbox/retry",
                 "/inbox/retry/confirm", "/inbox/unblock", "/inbox/resolve"):  # fmt: skip
        assert c.get(path).status_code == 405, path


def test_filters_and_pages(engine: Engine) -> None:
    with engine.begin() as conn:
        for i in range(7):
            outbox_row(conn, status=states.FAILED, occurred_at=NOW - timedelta(days=2),
                       last_error=f"timeout {i}")  # fmt: skip
        sms = outbox_row(conn, status=states.FAILED, occurred_at=NOW, type_="sms",
                         last_error="refused 100%")  # fmt: skip
        other = outbox_row(conn, queue="other", status=states.FAILED, occurred_at=NOW)
    c = client(engine, page_size=3)

    def listed(query: str) -> str:
        r = c.get(f"/outbox/failed?{query}")
        assert r.status_code == 200, r.text
        return text_of(r.text)

    assert "9 row(s), page 1 of 3" in listed("")
    last = listed("page=3")
    assert f"{sms} mail" in last and f"{other} other" in last
    assert "1 row(s)" in listed("type=sms")
    assert "1 row(s)" in listed("error=100%25")  # a substring, % taken literally
    assert "2 row(s)" in listed("since=1d")
    assert "1 row(s)" in listed("queue=other")
    assert "0 row(s)" in listed("queue=nope")


def test_inbox_filters_and_pages(engine: Engine) -> None:
    with engine.begin() as conn:
        for i in range(4):
            inbox_row(conn, state=states.FAILED, consumer="billing", seq=i + 1,
                      last_error="db down")  # fmt: skip
        inbox_row(conn, state=states.FAILED, consumer="mailer", seq=9, type_="mail")
        inbox_row(conn, state=states.DONE, consumer="billing", seq=10)  # never listed
    c = client(engine, page_size=2)
    page = text_of(c.get("/inbox/failed").text)
    assert "5 row(s), page 1 of 3" in page
    assert "1 row(s)" in text_of(c.get("/inbox/failed?consumer=mailer").text)
    assert "4 row(s)" in text_of(c.get("/inbox/failed?error=db+down").text)
    assert "1 row(s)" in text_of(c.get("/inbox/failed?type=mail").text)


def test_values_from_the_database_are_shown_as_text(engine: Engine) -> None:
    # Given rows whose payload, error, queue-free text fields and type hold markup
    with engine.begin() as conn:
        o = outbox_row(conn, status=states.FAILED, occurred_at=NOW, type_=SCRIPT,
                       last_error=SCRIPT, payload={"note": SCRIPT})  # fmt: skip
        i = inbox_row(conn, state=states.FAILED, consumer="c1", last_error=SCRIPT,
                      payload={"note": SCRIPT}, type_=SCRIPT)  # fmt: skip
    c = client(engine)
    for path in ("/outbox/failed", f"/outbox/rows/{o}", "/inbox/failed", f"/inbox/rows/{i}",
                 "/inbox/failed?error=" + "%3Cscript%3E"):  # fmt: skip
        html = c.get(path).text
        # Then the markup is never live, and it is there as text
        assert "<script>" not in html, path
        assert "&lt;script&gt;" in html, path
    # A typed filter value is escaped too when the form shows it again.
    echoed = c.get("/outbox/failed?queue=%22%3E%3Cscript%3Ex").text
    assert "<script>x" not in echoed and "&#34;&gt;&lt;script&gt;x" in echoed


def test_security_headers_and_masked_dsn(engine: Engine) -> None:
    r = client(engine).get("/")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert "u:***@db" in r.text
    # An unexpected failure (here: a database without the tables) is a 500 page with them too.
    broken = client(make_engine("sqlite://")).get("/")
    assert broken.status_code == 500 and "OperationalError" in broken.text
    assert "default-src 'none'" in broken.headers["content-security-policy"]
