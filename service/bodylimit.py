"""A cap on request bodies: 413 past `MAX_BODY_BYTES`, before any route reads them.

A job spec is a few kilobytes, and the service keeps every accepted spec and sends it back
in every job listing; without a cap, one 15 MB spec (an `mlp` with millions of hidden
layers, say) was stored whole and made each page of `GET /api/v1/jobs` 10 MB.

A plain ASGI middleware: it reads the body of a POST, PUT or PATCH up to the cap, answers
413 once the cap is passed (a declared `content-length` is judged before reading
anything), and otherwise hands the app the same body. Other methods pass untouched, so
streams (SSE, downloads) keep their own `receive` for the client's disconnect.

Before a 413 it reads and drops the rest of the refused body, up to `DRAIN_BYTES`: a
server that closes a connection with the client's bytes still unread makes the kernel
reset it, and a client still sending then sees "connection reset" instead of the 413 and
its message. A client that asked `Expect: 100-continue` has sent nothing yet, so it gets
the 413 at once; so does one declaring more than `DRAIN_BYTES`.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1024 * 1024
DRAIN_BYTES = 16 * 1024 * 1024  # read at memory speed: a few milliseconds
# The methods whose bodies are capped, read or not (`service.apidoc` declares their 413).
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY:
            await self._app(scope, receive, send)
            return
        declared = _content_length(scope)
        drain = not _expects_continue(scope) and (declared is None or declared <= DRAIN_BYTES)
        if declared is not None and declared > self._max:
            if drain:
                await _drain(receive, 0)
            await self._too_large(send, declared)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self._app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                if drain and message.get("more_body", False):
                    await _drain(receive, size)
                await self._too_large(send, None)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self._app(scope, _replay([whole], receive), send)

    async def _too_large(self, send: Send, declared: int | None) -> None:
        # Sent without a length (chunked), it was read only as far as the limit.
        size = f"{declared} bytes" if declared is not None else f"over {self._max} bytes"
        body = json.dumps(
            {
                "detail": f"Request body too large: {size}, and at most {self._max} bytes are "
                "accepted. A job spec is a few kilobytes; data goes in files under the data "
                "roots, named by `data.path`.",
                "errors": [],
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        # Past `DRAIN_BYTES` the rest of the body is not read: close the connection rather
        # than leave it half-read for the next request.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive, already: int) -> None:
    """Read and drop the body's rest, up to `DRAIN_BYTES` in all."""
    size = already
    while size <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        size += len(message.get("body", b""))


def _expects_continue(scope: Scope) -> bool:
    return any(
        name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"]
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects it before we see it; count the bytes anyway
    return None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """`receive` that first returns `messages`, then whatever the client sends next."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
