"""Credentials and CSRF tokens, on requests built by hand (no server)."""

from __future__ import annotations

import base64

from starlette.requests import Request

from outbox_ui.auth import SESSION_COOKIE, Csrf, Identity, authenticate, cross_site, session_value
from outbox_ui.settings import Auth


def _request(headers: dict[str, str]) -> Request:
    raw = [
        (k.lower().encode(), v.encode()) for k, v in {"host": "127.0.0.1:8090", **headers}.items()
    ]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw})


def _basic(pair: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def test_open_page_without_credentials() -> None:
    assert authenticate(_request({}), Auth()) == Identity()


def test_token_by_header_or_cookie() -> None:
    auth = Auth(token="tok")
    assert authenticate(_request({}), auth) is None
    assert authenticate(_request({"Authorization": "Bearer tok"}), auth) == Identity()
    assert authenticate(_request({"Authorization": "Bearer tok2"}), auth) is None
    cookie = {"Cookie": f"{SESSION_COOKIE}={session_value('tok')}"}
    assert authenticate(_request(cookie), auth) == Identity()
    assert authenticate(_request({"Cookie": f"{SESSION_COOKIE}=tok"}), auth) is None
    assert session_value("tok") != session_value("other") and "tok" not in session_value("tok")


def test_basic_auth() -> None:
    auth = Auth(user="alice", password="pw:with:colons")
    assert authenticate(_request(_basic("alice:pw:with:colons")), auth) == Identity("alice")
    assert authenticate(_request(_basic("alice:pw")), auth) is None
    assert authenticate(_request(_basic("bob:pw:with:colons")), auth) is None
    assert authenticate(_request({"Authorization": "Basic !!notbase64"}), auth) is None


def test_csrf_tokens_are_bound_to_cookie_and_process() -> None:
    csrf = Csrf(b"k" * 32)
    cookie = Csrf.new_cookie()
    token = csrf.token_for(cookie)
    assert csrf.valid(cookie, token)
    assert not csrf.valid(Csrf.new_cookie(), token)
    assert not csrf.valid(cookie, None) and not csrf.valid(None, token)
    assert not Csrf(b"j" * 32).valid(cookie, token)  # another process (a restart)


def test_cross_site() -> None:
    assert not cross_site(_request({}))
    assert not cross_site(_request({"Origin": "http://127.0.0.1:8090"}))
    assert not cross_site(_request({"Origin": "null"}))  # privacy settings: the token decides
    assert cross_site(_request({"Origin": "https://evil.example"}))
    assert cross_site(_request({"Sec-Fetch-Site": "cross-site"}))
