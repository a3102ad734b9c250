"""What /openapi.json declares that no route says of itself: the answers of the middlewares
and of the app-wide error handlers, on every operation they can reach, and no body for a
HEAD answer.

FastAPI documents what each route's `responses` names. A client generated from the
schema was not told of the 403 `BrowserGuard` answers, the 413 `BodyLimit` answers a
POST that reads no body (a cancel), or the 503 and 507 of a locked, read-only or full
store, all sent as ErrorPublic before or around any route; and it was told that
`HEAD /healthz` sends a HealthPublic, which no HEAD answer carries. Each status is
declared here by the same rule its middleware or handler applies (the method, the path,
the service's settings), so a route added later gets them without naming them; a HEAD's
answers, this module's and the routes' own, are declared without a body. A 405
is the answer to a method no operation declares, so no operation can declare it; its
`Allow` names the methods that are (`service.headmethod.allowed_methods`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from service.bodylimit import MAX_BODY_BYTES, WITH_BODY
from service.browsers import ANY_HOST_PATHS, SAFE_METHODS
from service.schemas import error_answer

_TOO_LARGE = error_answer(
    f"The body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB: refused before the "
    "operation runs, whether it reads a body or not"
)
_CROSS_ORIGIN = "a browser sent it from a page of another origin (`Sec-Fetch-Site`, `Origin`)"
_HOST = "its `Host` is neither an IP address nor localhost (a DNS-rebinding page's name)"
# A change writes the job store, and some the disk (a run directory, TensorBoard's logdir):
# what errors.py says of a store or disk that refuses. A read does not take SQLite's write
# lock, which WAL lets it read beside, so a locked store does not stop it.
_STORE_REFUSED = {
    "503": error_answer(
        "The job store is locked by another process past its busy timeout, or the store "
        "or the disk is read-only: nothing was changed; try again"
    ),
    "507": error_answer("The service's disk is full: nothing was changed; try again"),
}


def _refused(method: str, path: str, *, check_host: bool) -> str | None:
    """Why `BrowserGuard` may refuse the operation (403), or None where it never does."""
    reasons = []
    if check_host and path not in ANY_HOST_PATHS:
        reasons.append(_HOST)
    if method not in SAFE_METHODS:
        reasons.append(_CROSS_ORIGIN)
    return "Refused: " + ", or ".join(reasons) if reasons else None


def _document(schema: dict[str, Any], *, check_host: bool) -> None:
    for path, operations in schema["paths"].items():
        for method_name, operation in operations.items():
            method = method_name.upper()
            responses: dict[str, Any] = operation["responses"]
            if (why := _refused(method, path, check_host=check_host)) is not None:
                responses.setdefault("403", error_answer(why))
            if method in WITH_BODY:
                responses.setdefault("413", _TOO_LARGE)
            if method not in SAFE_METHODS:
                for status, answer in _STORE_REFUSED.items():
                    responses.setdefault(status, answer)
            if method == "HEAD":
                # The head of what a GET would answer: its status and headers, no body.
                for status, answer in responses.items():
                    responses[status] = {k: v for k, v in answer.items() if k != "content"}


def document_answers(app: FastAPI, *, check_host: bool) -> None:
    """Declare the middlewares' and handlers' answers in `app`'s /openapi.json (see the
    module's docstring). `check_host`: whether `BrowserGuard` refuses Host names. Called
    once every other change of the schema is made (`service.auth`'s 401), so a HEAD's
    answers lose their bodies last."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()  # caches itself in app.openapi_schema, which is changed here
            _document(schema, check_host=check_host)
            return schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
