"""Request bodies read as JSON strictly: an object that gives a key twice is refused.

FastAPI reads a route's JSON body with Starlette's `Request.json()`, that is `json.loads`,
which keeps a repeated key's last value and drops the others. `JSONBodyRoute`, the
`route_class` of every router with a body, hands its handler a `StrictJSONRequest`, whose
`json()` reads with `trainer.duplicate_keys.loads`: its `DuplicateKeyError` is a
`JSONDecodeError`, so FastAPI makes of it the 422 it makes of JSON it cannot read, and
`service.errors` names the key's path as the field (`model.params.hidden`), with both
places' line and column. Everything else about reading the body (the content types read
as JSON, the size limit before it, FastAPI's other errors) is as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from trainer.duplicate_keys import loads


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class JSONBodyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return handle
