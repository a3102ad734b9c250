"""Bearer-token auth for every route but /healthz and the dashboard's files, when
`TOWERBOARD_TOKEN` is set.

The dashboard's own files (`/`, `/static/*`) hold no data and stay open, so a browser
without the token can load the page, which then asks for it; every API call and the
TensorBoard proxy stay behind the token.

A plain ASGI middleware rather than a dependency, so it also covers the TensorBoard proxy,
the OpenAPI docs and streamed responses, at no cost to requests when auth is off. A
browser, which cannot add headers to TensorBoard's own requests, may send the token as the
`towerboard_token` cookie instead. The dashboard writes that cookie %-encoded
(`encodeURIComponent`), so its value is unquoted before the comparison; the header is
parsed leniently, so another site's malformed cookie on the same host does not hide it.

The cookie goes with every request the browser sends to this host, whichever page of the
same site (any port of the host: SameSite does not count ports) makes it, so a write
(any method but GET, HEAD, OPTIONS) is also refused when the browser says a page of
another origin sent it (`service.browsers.cross_origin_write`).
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from service.browsers import cross_origin_detail, cross_origin_write, send_error, send_forbidden
from service.schemas import error_answer

OPEN_PATHS = frozenset({"/healthz", "/"})
OPEN_PREFIXES = ("/static/",)
COOKIE_NAME = "towerboard_token"


def _presented_token(scope: Scope) -> str | None:
    """The bearer token of the Authorization header, else the cookie's: the header, given
    on purpose, counts over a cookie a browser sends along, in whatever order they come."""
    cookie_token = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"cookie" and cookie_token is None:
            cookie = cookie_parser(value.decode("latin-1")).get(COOKIE_NAME)
            if cookie:
                cookie_token = unquote(cookie)
    return cookie_token


class BearerAuth:
    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self._app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only http scopes have a path; lifespan and the rest pass straight through.
        if (
            scope["type"] != "http"
            or scope["path"] in OPEN_PATHS
            or scope["path"].startswith(OPEN_PREFIXES)
        ):
            await self._app(scope, receive, send)
            return
        presented = _presented_token(scope)
        if presented is not None and hmac.compare_digest(presented.encode(), self._token):
            if (why := cross_origin_write(scope)) is not None:
                await send_forbidden(send, cross_origin_detail(scope["method"], why))
                return
            await self._app(scope, receive, send)
            return
        if presented is not None:
            detail = "Invalid bearer token. Expected the token in TOWERBOARD_TOKEN."
        else:
            detail = (
                "Missing bearer token. Expected header 'Authorization: Bearer <TOWERBOARD_TOKEN>'."
            )
            if any(name == b"authorization" for name, _ in scope["headers"]):
                # `Authorization: TOKEN` or `Token TOKEN` was "missing" to its sender, who
                # did send one; the value itself is not echoed (it may be the token).
                detail += " Received: an Authorization header not of the form 'Bearer <token>'."
        await send_error(send, 401, detail, ((b"www-authenticate", b'Bearer realm="towerboard"'),))


# A secured operation's answer without the token: the service's error shape, ErrorPublic
# (every app has it: the routes' 404s and 422s are of it).
_UNAUTHORIZED = error_answer("No bearer token, or not the service's (TOWERBOARD_TOKEN)")


def document_bearer_auth(app: FastAPI) -> None:
    """Declare the token in the OpenAPI schema, so /docs shows it and offers Authorize."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # caches itself in app.openapi_schema, which is changed here
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The service's TOWERBOARD_TOKEN",
                }
            }
            schema["security"] = [{"bearer": []}]
            for path, operations in schema["paths"].items():
                for operation in operations.values():
                    if path in OPEN_PATHS:
                        operation["security"] = []
                    else:  # what BearerAuth answers, before any route runs
                        operation["responses"].setdefault("401", _UNAUTHORIZED)
            return schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
