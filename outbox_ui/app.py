"""The ASGI application: routes, the guard every request passes (credentials, the CSRF
cookie, security headers) and the error pages.

Reads are GET (``views``), changes are POST only (``actions``): a GET to an action's URL is
405. ``make_app`` builds everything from the settings; nothing global is built at import.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from inbox.ops.review import NotResolvable
from outbox.dsn import mask
from outbox.errors import OutboxError
from outbox_ui.actions import Actions
from outbox_ui.auth import (
    CSRF_COOKIE,
    CSRF_FIELD,
    Csrf,
    Identity,
    authenticate,
    cross_site,
    login_cookie,
    same,
    set_csrf_cookie,
)
from outbox_ui.render import Pages
from outbox_ui.settings import UiSettings, host_allowed
from outbox_ui.views import Views

log = logging.getLogger("outbox.ui")

# What a page may load: its own stylesheet, nothing else; forms post to this page only.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Same-origin: other sites learn nothing, and our own forms keep their Origin header.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_OPEN_PATHS = ("/login", "/static/")


def secure(response: Response) -> Response:
    """The security headers, on every response (error pages included)."""
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
    return response


class Guard(BaseHTTPMiddleware):
    """Every request: the Host check of an open loopback page, the CSRF cookie (new if
    missing), the credentials when the page has any (else the login page, 401), the
    security headers."""

    def __init__(self, app: ASGIApp, pages: Pages) -> None:
        super().__init__(app)
        self.pages = pages

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = cookie is None
        request.state.csrf_cookie = cookie = cookie or Csrf.new_cookie()
        request.state.identity = Identity()
        host = request.headers.get("host", "")
        if not host_allowed(self.pages.settings, host):
            detail = (
                f"host: this page is open (no credentials) on loopback and answers only to "
                f"localhost, 127.0.0.1 or [::1], not {host!r}"
            )
            return secure(self.pages.render(request, "error.html", 403, status=403, detail=detail))
        identity = authenticate(request, self.pages.settings.auth)
        request.state.identity = identity or Identity()
        request.state.authenticated = identity is not None
        if identity is None and not request.url.path.startswith(_OPEN_PATHS):
            response: Response = login_page(self.pages, request, 401, request.url.path)
        else:
            response = await call_next(request)
        secure(response)
        if fresh:
            set_csrf_cookie(response, cookie)
        return response


def login_page(
    pages: Pages, request: Request, status: int, next_path: str, failed: bool = False
) -> Response:
    """The login form (token) or the basic-auth challenge, with where to go after."""
    auth = pages.settings.auth
    response = pages.render(
        request, "login.html", status, next_path=next_path, failed=failed,
        token=auth.token is not None, basic=auth.user is not None,
    )  # fmt: skip
    if auth.user is not None:
        response.headers["WWW-Authenticate"] = 'Basic realm="outbox ui", charset="UTF-8"'
    return response


def _safe_next(path: str) -> str:
    """Only a path of this page (no scheme, no host, no ``//``): never an open redirect."""
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or not path.startswith("/") or path.startswith("//"):
        return "/"
    return path


def make_app(settings: UiSettings) -> Starlette:
    csrf = Csrf()
    pages = Pages(settings, csrf)
    views, actions = Views(pages), Actions(pages)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return login_page(
                pages, request, 200, _safe_next(request.query_params.get("next", "/"))
            )
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if cross_site(request) or not csrf.valid(
            request.cookies.get(CSRF_COOKIE), fields.get(CSRF_FIELD)
        ):
            raise HTTPException(403, "csrf: the form's token is missing or stale: reload it")
        token = settings.auth.token
        next_path = _safe_next(fields.get("next", "/"))
        if token is None or not same(fields.get("token", ""), token):
            return login_page(pages, request, 401, next_path, failed=True)
        response = RedirectResponse(next_path, status_code=303)
        login_cookie(response, token)
        return response

    def error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            status, detail = exc.status_code, str(exc.detail)
        elif isinstance(exc, NotResolvable):
            status, detail = 409, str(exc)
        elif isinstance(exc, (ValueError, OutboxError)):
            status, detail = 400, str(exc)
        else:
            log.error("outbox ui: %s %s failed", request.method, request.url.path, exc_info=exc)
            status, detail = 500, f"{type(exc).__name__}: {exc}"
        # A 500 is answered outside the guard (Starlette's outermost middleware): its
        # headers are set here.
        page = pages.render(request, "error.html", status, status=status, detail=mask(detail))
        return secure(page)

    routes = [
        Route("/", views.overview),
        Route("/rows", views.lookup),
        Route("/outbox/failed", views.outbox_failed),
        Route("/outbox/rows/{row_id:int}", views.outbox_row),
        Route("/outbox/retry/confirm", actions.outbox_retry_confirm, methods=["POST"]),
        Route("/outbox/retry", actions.outbox_retry, methods=["POST"]),
        Route("/outbox/republish", actions.outbox_republish, methods=["POST"]),
        Route("/inbox/failed", views.inbox_failed),
        Route("/inbox/rows/{row_id:int}", views.inbox_row),
        Route("/inbox/groups", views.groups),
        Route("/inbox/review", views.review),
        Route("/inbox/retry/confirm", actions.inbox_retry_confirm, methods=["POST"]),
        Route("/inbox/retry", actions.inbox_retry, methods=["POST"]),
        Route("/inbox/unblock", actions.inbox_unblock, methods=["POST"]),
        Route("/inbox/resolve", actions.inbox_resolve, methods=["POST"]),
        Route("/login", login, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(packages=[("outbox_ui", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, pages=pages)],
        exception_handlers={Exception: error, HTTPException: error, ValueError: error,
                            OutboxError: error},
    )  # fmt: skip
