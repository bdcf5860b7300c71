"""Who is asking, and whether a form came from our own page.

Credentials (``settings.Auth``): ``Authorization: Bearer <OUTBOX_UI_TOKEN>``, the session
cookie the login form sets (an HMAC of the token, never the token itself), or HTTP basic
auth with ``OUTBOX_UI_USER``/``OUTBOX_UI_PASSWORD``. Every comparison is constant-time.

CSRF: each browser gets a random cookie; every form carries an HMAC of it under a key of this
process, and a POST whose field does not match is refused. The cookies are ``SameSite=Strict``
and ``HttpOnly`` besides, and a POST whose ``Origin`` is another site is refused outright.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from outbox_ui.settings import Auth

SESSION_COOKIE = "outbox_ui_session"
CSRF_COOKIE = "outbox_ui_csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Identity:
    """Who the request is: the basic-auth user, or None (a token, or an open page)."""

    user: str | None = None


def same(a: str, b: str) -> bool:
    """Constant-time equality of two secrets."""
    return hmac.compare_digest(a.encode(), b.encode())


def session_value(token: str) -> str:
    """The login cookie's value: proves the token without storing it in the browser."""
    return hmac.new(token.encode(), b"outbox-ui-session", hashlib.sha256).hexdigest()


def _basic(header_value: str) -> tuple[str, str] | None:
    try:
        decoded = base64.b64decode(header_value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def authenticate(request: Request, auth: Auth) -> Identity | None:
    """The request's identity, or None when it brings no valid credentials."""
    if not auth.enabled:
        return Identity()
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    scheme = scheme.lower()
    if auth.token is not None and scheme == "bearer" and same(value.strip(), auth.token):
        return Identity()
    if auth.user is not None and auth.password is not None and scheme == "basic":
        pair = _basic(value)
        if pair is not None and same(pair[0], auth.user) & same(pair[1], auth.password):
            return Identity(auth.user)
    cookie = request.cookies.get(SESSION_COOKIE)
    if auth.token is not None and cookie is not None and same(cookie, session_value(auth.token)):
        return Identity()
    return None


def login_cookie(response: Response, token: str) -> None:
    response.set_cookie(
        SESSION_COOKIE, session_value(token), httponly=True, samesite="strict", path="/"
    )


class Csrf:
    """Form tokens bound to the browser's CSRF cookie by a key of this process (a restart
    makes open pages' forms stale: reload them)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self._key, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, field: str | None) -> bool:
        if not cookie or not field:
            return False
        return same(self.token_for(cookie), field)


def set_csrf_cookie(response: Response, value: str) -> None:
    response.set_cookie(CSRF_COOKIE, value, httponly=True, samesite="strict", path="/")


def cross_site(request: Request) -> bool:
    """A browser said the request comes from another site (``Origin`` or ``Sec-Fetch-Site``)."""
    if request.headers.get("sec-fetch-site", "") == "cross-site":
        return True
    origin = request.headers.get("origin")
    if origin is None or origin == "null":  # not said (privacy settings): the token decides
        return False
    return urlsplit(origin).netloc != request.headers.get("host", "")
