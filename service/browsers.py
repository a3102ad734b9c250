"""What a browser may do with this service from a page of another site, and what it is told.

A web page on any origin can make the browser of a person who uses Towerboard send
requests to it: "simple" requests need no CORS preflight (a POST with no body, as a
cancel, a trace or a TensorBoard start is), and the person's `towerboard_token` cookie
rides along from any page of the same site (SameSite counts every port of a host as one
site). The answers stay unreadable without CORS headers, which the service never sends,
but the request has done its work. So:

- `cross_origin_write`: a request that changes something (any method but GET, HEAD and
  OPTIONS) from a page of another origin is refused (403). The browser says where a request
  comes from in `Sec-Fetch-Site` (every current browser sends it, and a page cannot forge
  it); an older browser in `Origin`, compared with the `Host` it was sent to. A request
  with neither comes from no web page (curl, the CLI, httpx) and passes.
- `unsafe_host`: with no token, a page of another site could still read everything by DNS
  rebinding (its own name made to resolve to 127.0.0.1, so the browser takes the service
  for that site). Its requests carry that name in `Host`, so without a token only IP
  addresses and `localhost` are answered.
- `SECURITY_HEADERS`: no MIME sniffing, no framing by another site (clickjacking the
  Cancel button), no job URL leaked in a Referer to other sites.

`BrowserGuard` applies all three (the auth middleware applies the first too); the Host
check only where it protects something (see `BrowserGuard`).
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The browser's own judgement of where a request comes from: `none` is the person
# (a typed address, a bookmark), `same-origin` the service's own pages.
_TRUSTED_FETCH_SITES = frozenset({b"same-origin", b"none"})
# Answered whatever the Host: monitors probe it by any name, and it tells nothing.
ANY_HOST_PATHS = frozenset({"/healthz"})
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    # TensorBoard's plugins frame its own pages, so 'self', not 'none'.
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
]
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return None


def _authority(host: str, port: int | None, scheme: str) -> tuple[str, int | None]:
    return host.lower().rstrip("."), port if port is not None else _DEFAULT_PORTS.get(scheme)


def _split_host(value: str, scheme: str) -> tuple[str, int | None] | None:
    """`Host` (name[:port], [v6][:port]) as (name, port); None when it cannot be read."""
    try:
        parts = urlsplit(f"{scheme}://{value}")
        return _authority(parts.hostname or "", parts.port, scheme)
    except ValueError:
        return None


def cross_origin_write(scope: Scope) -> str | None:
    """Why this request, a write from a browser page of another origin, is refused; None
    when it is a read, from the service's own pages, or from no browser at all."""
    if scope["method"] in SAFE_METHODS:
        return None
    site = _header(scope, b"sec-fetch-site")
    if site is not None:
        if site.lower() in _TRUSTED_FETCH_SITES:
            return None
        return f"the browser says it was sent by a {site.decode('latin-1')[:40]} page"
    origin = _header(scope, b"origin")
    if origin is None:
        return None  # no browser sends a write without Origin: curl, the CLI, httpx
    shown = origin.decode("latin-1")[:200]
    host = _header(scope, b"host")
    try:
        sent_from = urlsplit(shown)
        source = _authority(sent_from.hostname or "", sent_from.port, sent_from.scheme)
    except ValueError:
        return f"it was sent by a page of origin {shown!r}"
    if sent_from.scheme not in _DEFAULT_PORTS or not source[0]:  # "null": a sandbox, a file
        return f"it was sent by a page of origin {shown!r}"
    # The scheme is not compared: behind a TLS proxy the service sees plain http.
    target = _split_host(host.decode("latin-1"), sent_from.scheme) if host else None
    if target is None or source != target:
        return f"it was sent by a page of origin {shown!r}"
    return None


def unsafe_host(scope: Scope) -> str | None:
    """The `Host` a token-less service must not answer (a name that could be any site's,
    as a DNS rebinding page sends); None for an IP address, localhost, or no Host."""
    if scope["path"] in ANY_HOST_PATHS:
        return None
    raw = _header(scope, b"host")
    if raw is None:
        return None  # HTTP/1.0 with no Host: no browser sends that
    shown = raw.decode("latin-1")
    parts = _split_host(shown, "http")
    name = parts[0] if parts is not None else ""
    if name == "localhost" or name.endswith(".localhost"):  # loopback by RFC 6761
        return None
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        return shown[:200]


async def send_error(
    send: Send, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """Answer with the service's error shape (`{"detail", "errors": []}`), straight from a
    middleware: nothing of the app runs."""
    body = json.dumps({"detail": detail, "errors": []}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_forbidden(send: Send, detail: str) -> None:
    await send_error(send, 403, detail)


def cross_origin_detail(method: str, why: str) -> str:
    return (
        f"Cross-origin {method} refused: {why}. Changes are accepted only from the "
        "service's own pages or from clients that are not browsers (curl, the CLI)."
    )


def listens_on_loopback(host: str) -> bool:
    """Whether `host` (the address the service binds) is loopback only: the one case where
    a Host name is a rebinding page's, since nobody else can reach the service by name."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BrowserGuard:
    """The outermost middleware but for `HeadAsGet` (whose HEAD is a GET to it): security
    headers on every answer, cross-origin writes refused, and with `check_host` only IP or
    localhost Hosts. The service checks Hosts
    when it has no token and listens on loopback only: a service opened to the network
    without a token is anyone's by any name anyway, and refusing names would only break it."""

    def __init__(self, app: ASGIApp, *, check_host: bool) -> None:
        self._app = app
        self._check_host = check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if self._check_host and (host := unsafe_host(scope)) is not None:
            await send_forbidden(
                send,
                f"Host {host!r} refused: without TOWERBOARD_TOKEN this service answers only "
                "requests addressed to an IP address or localhost, since a page of another "
                "site can make its own name lead here (DNS rebinding). Open it by address, "
                "or set TOWERBOARD_TOKEN to serve it under other names.",
            )
            return
        if (why := cross_origin_write(scope)) is not None:
            await send_forbidden(send, cross_origin_detail(scope["method"], why))
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                # A second CSP only adds its own limits to TensorBoard's, so it goes unless
                # the answer has this very one (an error `send_error` made).
                headers += [
                    (k, v)
                    for k, v in SECURITY_HEADERS
                    if k not in present
                    or (k == b"content-security-policy" and (k, v) not in headers)
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, send_with_headers)
