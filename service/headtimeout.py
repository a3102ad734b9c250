"""A deadline for each request's head and body, which uvicorn does not set.

uvicorn (h11) waits for a request's head without end: a connection that sends nothing, or
a header line now and then, is held open for ever (its keep-alive timer covers only the
wait after a response, and any byte that arrives cancels it). Enough such connections
(slowloris) use up the service's file descriptors, and then nobody can reach it: not the
dashboard, not `towerboard status`, not the supervisor's TensorBoard proxy.

`HeadTimeoutProtocol` is uvicorn's h11 protocol with one timer more: from the moment a
connection opens, or a response ends on a kept-alive one, the next request's head, and the
body it declares, must be whole within `seconds`, or the connection is closed. The body
too: every POST's body is read whole before a route runs (`service.bodylimit`, at most
1 MiB), so a head that declared a body and then sent nothing, or a byte now and then, held
its connection for ever just the same. A long response (an event stream, a download) is
not touched: the deadline ends when the request is in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# The client's states while a request's head or body is still to come.
_UNFINISHED = (h11.IDLE, h11.SEND_BODY)


class HeadTimeoutProtocol(H11Protocol):
    head_timeout_seconds = 20.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in _UNFINISHED:  # a request is in (or it broke)
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Kept alive and waiting for the next request (a pipelined one may be in already,
        # its body still to come), or for the rest of a body the answer did not wait for
        # (a 401, a 413 on `Expect: 100-continue`): that much longer at most.
        if not self.transport.is_closing() and self.conn.their_state in _UNFINISHED:
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_seconds, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            # Debug, not info: a flood of these is what the timer is for.
            log.debug(
                "Closed a connection whose request took over %.0f s to come in",
                self.head_timeout_seconds,
            )
            self.transport.close()


def head_timeout_protocol(seconds: float) -> type[HeadTimeoutProtocol]:
    """uvicorn's `http=` protocol class, with a `seconds` deadline for each request's head
    and body."""
    return _protocol(float(seconds))


@functools.cache
def _protocol(seconds: float) -> type[HeadTimeoutProtocol]:
    attributes: dict[str, Any] = {"head_timeout_seconds": seconds}
    return type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), attributes)
