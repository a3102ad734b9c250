"""One JSON shape for every error: `{"detail": "...", "errors": [{"field", "message"}]}`."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.headmethod import allowed_methods
from trainer.duplicate_keys import DuplicateKeyError
from trainer.spec import field_errors


class FieldErrors(Exception):
    """422 with the given field errors (for checks made after the schema's own)."""

    def __init__(self, errors: list[dict[str, str]], detail: str | None = None) -> None:
        self.errors = errors
        self.detail = detail or _count_detail(len(errors))


# What FastAPI raises (400) when reading the body fails for a reason other than bad JSON.
_FASTAPI_BODY_ERROR = "There was an error parsing the body"


def _count_detail(count: int) -> str:
    return f"Invalid request: {count} error{'s' if count != 1 else ''}; see `errors`."


class _RequestErrors:
    """FastAPI's error list in the shape `trainer.spec.field_errors` reads."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self._items = items

    def errors(self, include_url: bool = False) -> list[dict[str, Any]]:
        return self._items


def _body_model(request: Request) -> Any:
    """The type of the route's JSON body (FastAPI's route, in the scope once routed), or
    None: what `field_errors` needs to suggest the key an unknown one was meant to be."""
    route = request.scope.get("route")
    body = getattr(route, "body_field", None) if isinstance(route, APIRoute) else None
    return body.field_info.annotation if body is not None else None


def _json_place(document: Any, loc: tuple[Any, ...]) -> str:
    """Where the JSON stopped parsing, as the CLI says it for a spec file (" at line L column
    C"), from the character offset FastAPI gives (`loc[1]`) and the text (`exc.body`):
    without it a body of forty lines says what is wrong but not where. "" if either lacks."""
    position = loc[1] if len(loc) > 1 else None
    if not isinstance(document, str) or not isinstance(position, int):
        return ""
    line = document.count("\n", 0, position) + 1
    column = position - document.rfind("\n", 0, position)
    return f" at line {line} column {column}"


def _request_field_errors(
    exc: RequestValidationError, *, spec: bool, model: Any = None
) -> list[dict[str, str]]:
    """The request's errors as fields; the body itself is "(spec)" when it is a job spec,
    else "(body)" (a trace request or a TensorBoard selection is no spec). `model`: the
    body's type, for `field_errors`."""
    items = []
    for item in exc.errors():
        item = dict(item)
        loc = tuple(item.get("loc", ()))
        if item.get("type") == "json_invalid" and isinstance(exc.__cause__, DuplicateKeyError):
            # A key given twice (`service.jsonbody`): named where it is, as an unknown one.
            item["loc"] = exc.__cause__.path
            item["msg"] = exc.__cause__.here
            item.pop("input", None)
        elif item.get("type") == "json_invalid":
            item["loc"] = ("(body)",)
            reason = item.get("ctx", {}).get("error", "Invalid JSON")
            item["msg"] = f"Expected a JSON body. {reason}{_json_place(exc.body, loc)}"
            item.pop("input", None)
        elif loc == ("body",) and not spec:
            item["loc"] = ("(body)",)
        elif loc[:1] == ("body",):
            item["loc"] = loc[1:]  # the body itself: "(spec)", as trainer.spec names it
        elif loc[:1] == ("query",) and len(loc) == 3 and isinstance(loc[2], int):
            # One value of a repeated parameter (`?state=queued&state=bogus`): named as
            # the parameter sent, its value refused said by `field_errors` ("Received:
            # 'bogus'"); `query.state.1`, the index into FastAPI's list, is no name a
            # query string has.
            item["loc"] = loc[:2]
        items.append(item)
    return field_errors(_RequestErrors(items), model)  # type: ignore[arg-type]


def error_body(detail: str, errors: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"detail": detail, "errors": errors or []}


def _not_json(exc: RequestValidationError) -> bool:
    """FastAPI hands a body to validation as raw bytes when its Content-Type is not JSON
    (none, or a form as `curl -d` sends): the body itself failing as bytes means that."""
    return any(
        tuple(item.get("loc", ())) == ("body",) and isinstance(item.get("input"), bytes)
        for item in exc.errors()
    )


def _missing_body(exc: RequestValidationError) -> bool:
    return any(
        tuple(item.get("loc", ())) == ("body",) and item.get("type") == "missing"
        for item in exc.errors()
    )


# What a full or read-only data dir gives: no request can be served by trying again, and an
# operator reading "Internal Server Error" would not know where to look.
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def store_is_full(exc: BaseException) -> bool:
    """Whether the job store refused a write for want of disk space."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)


def _storage_detail(exc: Exception) -> tuple[str, int] | None:
    """The detail and status for an error of the data dir's disk, or None for any other."""
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if store_is_full(exc):
            return (
                "The service's data dir has no space left (its job store could not be "
                "written): free space on its disk, then try again.",
                507,
            )
        if code == sqlite3.SQLITE_READONLY or "readonly database" in str(exc):
            return (
                "The service's job store is read-only: make its data dir writable, then try again.",
                503,
            )
        if code == sqlite3.SQLITE_BUSY or "database is locked" in str(exc):
            # Another process (a backup tool, a sqlite3 shell) has held a write lock on
            # towerboard.db past the store's busy timeout: nothing was written, and the
            # same request succeeds once it lets go.
            return (
                "The service's job store (towerboard.db in its data dir) is locked by another "
                "process, such as a backup or a sqlite3 shell holding a transaction; nothing "
                "was changed: try again once it has let go.",
                503,
            )
        return None
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in _NO_SPACE_ERRNOS:
            return (
                f"The service's disk has no space left{where}: free space on it, then try again.",
                507,
            )
        if exc.errno == errno.EROFS:
            return (
                f"The service's disk is read-only{where}: make it writable, then try again.",
                503,
            )
    return None


def _with_allow(request: Request, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """A 405's headers, with an `Allow` that names every method its path takes: a route's
    own named its own methods alone (DELETE /api/v1/jobs said `GET`, not POST), in no fixed
    order, never HEAD. A mount's app (the static files) names its own."""
    allowed = allowed_methods(request.app.router.routes, request.scope)
    return {**(headers or {}), "Allow": ", ".join(allowed)} if allowed else headers


def install_error_handlers(app: FastAPI) -> None:
    async def _storage_error(request: Request, exc: Exception) -> JSONResponse:
        found = _storage_detail(exc)
        if found is None:
            raise exc  # any other error stays a 500, logged with its traceback
        detail, status = found
        return JSONResponse(error_body(detail), status_code=status)

    app.add_exception_handler(sqlite3.OperationalError, _storage_error)
    app.add_exception_handler(OSError, _storage_error)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        if _not_json(exc):
            received = request.headers.get("content-type")
            shown = repr(received[:200]) if received else "none"
            detail = (
                "Expected the body as JSON, with the header 'Content-Type: application/json'. "
                f"Received: Content-Type {shown}."
            )
            return JSONResponse(error_body(detail), status_code=415)
        # POST /api/v1/jobs is the one route whose body is a job spec.
        spec = request.method == "POST" and request.url.path.rstrip("/").endswith("/jobs")
        if spec and _missing_body(exc):
            errors = [
                {
                    "field": "(spec)",
                    "message": "Expected a JSON body: the job spec. Received: no body",
                }
            ]
            return JSONResponse(error_body(_count_detail(1), errors), status_code=422)
        errors = _request_field_errors(exc, spec=spec, model=_body_model(request))
        return JSONResponse(error_body(_count_detail(len(errors)), errors), status_code=422)

    @app.exception_handler(FieldErrors)
    async def _field_errors(request: Request, exc: FieldErrors) -> JSONResponse:
        return JSONResponse(error_body(exc.detail, exc.errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == _FASTAPI_BODY_ERROR:
            # JSON that parses as text but not as data (nested past Python's recursion
            # limit, say): the same 422 as any other body that is not a JSON spec.
            cause = f"{type(exc.__cause__).__name__}: {exc.__cause__}" if exc.__cause__ else detail
            if isinstance(exc.__cause__, RecursionError):
                cause = "Received: one nested too deeply for Python's JSON reader."
            errors = [
                {"field": "(body)", "message": f"Expected a JSON body that can be read. {cause}"}
            ]
            return JSONResponse(error_body(_count_detail(1), errors), status_code=422)
        if exc.status_code == 404 and detail == "Not Found":  # no route matched
            detail = f"No such resource: {request.method} {request.url.path}. See /docs."
        elif exc.status_code == 405:
            headers = _with_allow(request, exc.headers)
            # The methods it takes said in the body too: `Allow` is a header no one reads.
            takes = (headers or {}).get("Allow")
            detail = f"{request.method} is not allowed on {request.url.path}" + (
                f"; it takes {takes}. See /docs." if takes else ". See /docs."
            )
            return JSONResponse(error_body(detail), status_code=405, headers=headers)
        return JSONResponse(error_body(detail), status_code=exc.status_code, headers=exc.headers)
