"""Who may read and act: the token, basic auth, the CSRF check, --read-only. Each refusal
leaves the row as it was and writes no audit record."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from sqlalchemy import Engine

from outbox import states
from outbox_ui.auth import session_value
from outbox_ui.settings import Auth
from tests.integration.ops.rows import outbox_row
from tests.integration.ui.client import (
    ACTOR,
    another_browser,
    audits,
    client,
    csrf,
    csrf_of,
    post,
    status_of,
)

NOW = datetime.now(UTC)
TOKEN = "t0ken-for-the-test"


def _failed(engine: Engine) -> int:
    with engine.begin() as conn:
        return outbox_row(conn, status=states.FAILED, occurred_at=NOW)


def _unchanged(engine: Engine, row: int) -> None:
    assert status_of(engine, row)[0] == states.FAILED
    assert audits(engine) == []


def test_token_required_on_every_request(engine: Engine) -> None:
    row = _failed(engine)
    c = client(engine, auth=Auth(token=TOKEN))

    for path in ("/", "/outbox/failed", f"/outbox/rows/{row}", "/inbox/groups", "/nope", "/login"):
        r = c.get(path)
        assert r.status_code == (200 if path == "/login" else 401), path
        assert "Log in" in r.text and "outbox row" not in r.text.lower()
        # Nor which database, host or user: that is for those who bring the token.
        assert "u:***@db" not in r.text and ACTOR not in r.text, path
    assert c.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # An action without the token is refused before the form is read.
    token = csrf_of(c.get("/login").text)
    r = c.post("/outbox/retry", data={"csrf": token, "ids": str(row), "reason": "x"})
    assert r.status_code == 401
    _unchanged(engine, row)


def test_login_form_sets_a_session_cookie(engine: Engine) -> None:
    row = _failed(engine)
    c = client(engine, auth=Auth(token=TOKEN))
    token = csrf_of(c.get("/login").text)

    wrong = c.post("/login", data={"csrf": token, "token": "nope", "next": "/"})
    assert wrong.status_code == 401 and "not the one" in wrong.text
    assert c.post("/login", data={"token": TOKEN}).status_code == 403  # no CSRF token
    ok = c.post("/login", data={"csrf": token, "token": TOKEN, "next": "https://evil.example/"})
    assert ok.status_code == 303 and ok.headers["location"] == "/"  # never an open redirect
    assert TOKEN not in ok.headers["set-cookie"]
    assert session_value(TOKEN) in ok.headers["set-cookie"]

    assert c.get("/").status_code == 200
    r = post(c, "/outbox/retry", {"ids": str(row), "reason": "after login"})
    assert r.status_code == 200 and status_of(engine, row)[0] == states.PENDING


def test_basic_auth_names_the_actor(engine: Engine) -> None:
    row = _failed(engine)
    c = client(engine, auth=Auth(user="alice", password="s3cret"))
    challenge = c.get("/")
    assert challenge.status_code == 401 and challenge.headers["www-authenticate"].startswith(
        "Basic"
    )
    bad = base64.b64encode(b"alice:wrong").decode()
    assert c.get("/", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    good = {"Authorization": "Basic " + base64.b64encode(b"alice:s3cret").decode()}

    r = post(c, "/outbox/retry", {"ids": str(row), "reason": "by alice"}, headers=good)

    assert r.status_code == 200, r.text
    [audit] = audits(engine)
    assert audit.actor == "alice"


def test_csrf_token_required_on_every_form(engine: Engine) -> None:
    row = _failed(engine)
    c = client(engine)
    csrf(c)  # the browser has its CSRF cookie
    for data in ({}, {"csrf": "0" * 64}):
        r = c.post("/outbox/retry", data={"ids": str(row), "reason": "x", **data})
        assert r.status_code == 403 and "csrf" in r.text
    # A token of another browser (cookie) of the same page does not pass either.
    other = another_browser(c)
    r = c.post("/outbox/retry", data={"csrf": csrf(other), "ids": str(row), "reason": "x"})
    assert r.status_code == 403
    # Nor does a form posted from another site, whatever it carries.
    token = csrf(c)
    r = c.post("/outbox/retry", data={"csrf": token, "ids": str(row), "reason": "x"},
               headers={"Origin": "https://evil.example"})  # fmt: skip
    assert r.status_code == 403
    _unchanged(engine, row)
    for path in ("/outbox/retry/confirm", "/outbox/republish", "/inbox/retry",
                 "/inbox/retry/confirm", "/inbox/unblock", "/inbox/resolve"):  # fmt: skip
        assert c.post(path, data={"id": str(row), "reason": "x"}).status_code == 403, path


def test_read_only_hides_and_refuses_actions(engine: Engine) -> None:
    row = _failed(engine)
    c = client(engine, read_only=True)
    for path in ("/outbox/failed", f"/outbox/rows/{row}"):
        html = c.get(path).text
        assert "read-only" in html
        assert "Retry" not in html and 'method="post"' not in html
    r = post(c, "/outbox/retry", {"ids": str(row), "reason": "x"})
    assert r.status_code == 403 and "--read-only" in r.text
    _unchanged(engine, row)


def test_an_open_loopback_page_answers_only_to_loopback_names(engine: Engine) -> None:
    # Given an open page (no credentials) on loopback, and a failed row
    row = _failed(engine)
    c = client(engine)
    for host in ("127.0.0.1:8090", "localhost:8090", "[::1]:8090"):
        assert c.get("/", headers={"Host": host}).status_code == 200, host

    # When a page of another name reaches it (its DNS re-pointed at 127.0.0.1)
    rebound = {"Host": "evil.example:8090"}
    read = c.get(f"/outbox/rows/{row}", headers=rebound)
    forged = c.post("/outbox/retry", data={"csrf": csrf(c), "ids": str(row), "reason": "x"},
                    headers=rebound)  # fmt: skip

    # Then it reads nothing and changes nothing
    assert read.status_code == 403 and "host:" in read.text and "outbox row" not in read.text
    assert forged.status_code == 403
    _unchanged(engine, row)
    # With credentials the name does not matter (they are what a rebound page lacks).
    with_token = client(engine, auth=Auth(token=TOKEN))
    bearer = {"Authorization": f"Bearer {TOKEN}", **rebound}
    assert with_token.get("/", headers=bearer).status_code == 200
