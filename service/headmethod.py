"""HEAD wherever GET works (RFC 9110, 9.3.2), for the whole app at once.

FastAPI's routes answer only the methods they declare (Starlette's own `Route` adds HEAD
to GET; FastAPI's `APIRoute` does not), so `curl -I`, a load balancer's or a blackbox
exporter's probe of a job, `/metrics` or `/docs` got a 405. Adding HEAD to each route
instead would give each a second OpenAPI operation, and a streaming route's HEAD would
still make its whole stream (every metric point of a long job) for the server to drop.

`HeadAsGet` is a middleware instead, outermost (inside Starlette's own error middleware):
a HEAD that no route takes as HEAD (the downloads, `/healthz`, `/`, the TensorBoard proxy
and the static files do, and keep their own answers) goes through the app as a GET, and
its answer ends with its head: the status and headers a GET gets, Content-Length included
where a GET has one, then an empty body. What the app would send after its head is never
produced: the app is cancelled there, so an event stream is never started, a metrics
stream never reads the store, and the connection is free for its next request at once.
What a route does before its head is done as for a GET: a whole answer's body (a log's
tail, a job list) is made, for its Content-Length. (A GET route's background tasks would
not run for its HEAD; no GET route has any.)

`allowed_methods` is what a 405's `Allow` lists: every method some route takes at that
path (a route's own 405 named only its own methods, in no fixed order), HEAD with GET.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# In the order `Allow` lists them.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _taken(routes: list[BaseRoute], scope: Scope, method: str, *, mounts: bool) -> bool:
    """Whether a route of `routes` takes `method` at the scope's path. A mount takes any
    method (its app answers for itself): counted only with `mounts`."""
    probe = {"type": "http", "path": scope["path"], "root_path": scope.get("root_path", "")}
    probe["method"] = method
    return any(
        route.matches(probe)[0] is Match.FULL
        for route in routes
        if mounts or not isinstance(route, Mount)
    )


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> list[str]:
    """The methods `routes` (an app's) answer at the scope's path, HEAD with GET."""
    allowed = {method for method in _METHODS if _taken(routes, scope, method, mounts=False)}
    if "GET" in allowed:
        allowed.add("HEAD")
    return [method for method in _METHODS if method in allowed]


class HeadAsGet:
    """Answers a HEAD that no route takes as the GET of its path is answered, without its
    body (see the module's docstring). `routes`: the app's, where HEAD routes are found."""

    def __init__(self, app: ASGIApp, *, routes: list[BaseRoute]) -> None:
        self._app = app
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "HEAD"
            or _taken(self._routes, scope, "HEAD", mounts=True)
        ):
            await self._app(scope, receive, send)
            return
        with anyio.CancelScope() as after_head:

            async def send_head(message: Message) -> None:
                # The first message is the head (ASGI); the app sends nothing after it.
                if not after_head.cancel_called:
                    await send(message)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    after_head.cancel()
                await anyio.lowlevel.checkpoint()  # raises the cancellation into the app

            # A copy: the server reads its own scope's method, HEAD, and sends no body.
            await self._app({**scope, "method": "GET"}, receive, send_head)
