"""The service's HTTP API over httpx, as the client verbs use it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx

from service.client.common import (
    EXIT_FAILED,
    EXIT_NO_ANSWER,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    RECONNECT_SECONDS,
    ClientError,
    Interrupted,
)

_T = TypeVar("_T")

# What httpx raises before any byte of a request went out: the service never saw it, and
# the same request is safe to send again. Any other transport error (a read timeout, a
# connection closed without an answer) comes after the request was sent, and the service
# may have acted on it: a submit retried on it made a second job.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)


class ReusedConnectionRetry(httpx.HTTPTransport):
    """httpx's transport, trying a GET or HEAD once more when the service closed the
    kept-alive connection it went out on without answering.

    The service closes a connection left idle (uvicorn after 5 s, its head deadline after
    20): a request sent as that close is on its way meets a closed socket (a disconnect,
    or a reset where the request was still unread), although the pool had found the
    connection open. No answer came, so a read-only request is safe to send again, on a
    new connection; anything else could have been acted on, and the error stands.
    """

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handle_request(request)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            if request.method not in ("GET", "HEAD"):
                raise
            return super().handle_request(request)


def _service_error(response: httpx.Response) -> dict[str, Any] | None:
    """The service's error, `{"detail": "...", "errors": [...]}` (every error it answers
    has that shape); None for any other answer: another server's page, or a proxy's."""
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("errors"), list) and "detail" in body:
        return body
    return None


def _error_message(
    response: httpx.Response, body: dict[str, Any], options: Mapping[str, str]
) -> str:
    """The service's error `body` in one line (`options`: see `_as_option`)."""
    detail = str(body.get("detail") or f"HTTP {response.status_code}")
    errors = body.get("errors") or []
    if errors:
        # One line: each error's own full stop would end up before a semicolon.
        fields = "; ".join(
            f"{_as_option(str(e.get('field')), options)}: {str(e.get('message')).rstrip('.')}"
            for e in errors
        )
        return f"{detail.removesuffix(' see `errors`.').rstrip(';')}: {fields}"
    return detail


def _as_option(field: str, options: Mapping[str, str]) -> str:
    """A field's error as the option that sent it (the API's names read as internals to a
    CLI user): a query parameter's by its name, `query.name` is `--name` and
    `query.after_step` is `--after-step`; a body's by `options`, which maps a body field
    to its option (`{"job_ids": "--jobs"}`: `job_ids.0` is `--jobs`). Other fields (a
    spec's) are said as they are."""
    if field.startswith("query."):
        name = field.removeprefix("query.").split(".")[0]
        return f"--{name.replace('_', '-')}"
    return options.get(field.split(".")[0], field)


def _exit_code(status: int) -> int:
    """The exit code of an error answer, by its status whatever its body: a request refused
    as it stands (too large, or invalid: a proxy's 413 as much as the service's) is the
    person's to change, exit 2, as the docs say of a rejected spec; any other, 1."""
    return EXIT_USAGE if status in (413, 422) else EXIT_FAILED


def _unsure(check_with: str | None, again: str | None) -> str:
    """The end of the error for a change sent that no answer came to (see `Client.lost`)."""
    if check_with:
        return f"it may or may not have been done; check with `{check_with}` before trying again"
    if again:
        return f"it may or may not have been done; {again}"
    return "it may or may not have been done; check before trying again"


class Client:
    """The service's API over httpx, raising ClientError with a one-line message."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.url,
            headers={**headers, "User-Agent": "towerboard-cli"},
            timeout=httpx.Timeout(timeout, connect=5.0),
            transport=ReusedConnectionRetry(),
        )
        self.has_token = bool(token)

    def close(self) -> None:
        self.http.close()

    def lost(
        self,
        error: httpx.TransportError,
        method: str,
        path: str,
        check_with: str | None = None,
        again: str | None = None,
    ) -> ClientError:
        """The error for a request that got no answer: one never sent (the service cannot
        be reached: EXIT_UNREACHABLE), or one sent that no answer came to (EXIT_NO_ANSWER),
        which the service may have acted on; `check_with` is the command that tells, or
        where none can, `again` says what running the same command again does."""
        cause = f"{error.__class__.__name__}: {error}"
        if isinstance(error, _NOT_SENT):
            return ClientError(
                f"cannot reach the service at {self.url} ({cause}). "
                "Is `towerboard serve` running? Set --url or TOWERBOARD_URL.",
                EXIT_UNREACHABLE,
            )
        if method in ("GET", "HEAD"):  # it changes nothing: only the answer is missing
            return ClientError(
                f"the service at {self.url} did not answer {method} {path} ({cause}): it "
                "took the request, but is busy or stuck, or the connection broke; try again",
                EXIT_NO_ANSWER,
            )
        return ClientError(
            f"sent {method} {path} to the service at {self.url}, but no answer came "
            f"({cause}): {_unsure(check_with, again)}",
            EXIT_NO_ANSWER,
        )

    def check(
        self,
        response: httpx.Response,
        options: Mapping[str, str] | None = None,
        check_with: str | None = None,
        again: str | None = None,
    ) -> httpx.Response:
        """`response` if it is a success, else its error raised as a ClientError (with the
        status and field errors of one the service answered). `options`: the options that
        set the request body's fields, to name in its field errors (see `_as_option`);
        `check_with` and `again`: as for `lost`, said of a proxy's gateway error."""
        if response.is_success:
            return response
        body = _service_error(response)
        if body is None:
            raise self._not_the_service(response, check_with, again)
        said = _error_message(response, body, options or {})
        status, errors = response.status_code, body["errors"]
        if status == 401:
            hint = (
                "the token in TOWERBOARD_TOKEN was refused"
                if self.has_token
                else "the service needs a token: set TOWERBOARD_TOKEN"
            )
            raise ClientError(f"{hint} ({said})", status=status, errors=errors)
        raise ClientError(said, _exit_code(status), status=status, errors=errors, body=body)

    def _not_the_service(
        self, response: httpx.Response, check_with: str | None = None, again: str | None = None
    ) -> ClientError:
        """The error for an answer that is not the service's JSON (an error not in its
        shape, or a success that is no JSON): another server at --url (`python -m
        http.server`'s 404 page), or a proxy in front of the service (its sign-in page,
        nginx's 413 of a body past its client_max_body_size, a 502 while the service is
        down); or the service itself failing in a way it did not foresee (a 500 of plain
        text, its log saying why). Its exit code is the status's, whatever the shape.

        A gateway's 502, 503 or 504 says the service behind the proxy gave no answer: for
        a change, one that may have reached it (EXIT_NO_ANSWER, with `check_with` or
        `again`, as `lost`); for a read, one to try again (EXIT_NO_ANSWER too, which the
        followers ride out as they ride out a service restart without a proxy)."""
        status, method = response.status_code, response.request.method
        path = response.request.url.path
        kind = response.headers.get("content-type", "").partition(";")[0] or "no content type"
        answer = f"HTTP {status} {response.reason_phrase} ({kind})"
        if status in (502, 503, 504):
            if method in ("GET", "HEAD"):
                return ClientError(
                    f"{self.url} answered {method} {path} with {answer}, not the service's "
                    "JSON: a proxy in front of the service had no answer from it (it is down, "
                    "restarting or stuck); try again",
                    EXIT_NO_ANSWER,
                )
            return ClientError(
                f"sent {method} {path} to the service at {self.url}, but a proxy in front "
                f"of it answered {answer}, not the service: {_unsure(check_with, again)}",
                EXIT_NO_ANSWER,
            )
        said = f"{self.url} answered {path} with {answer}, not the service's JSON"
        if status == 500:
            why = (
                "the service, or a proxy in front of it, failed unexpectedly (its log says "
                "why), or --url (or TOWERBOARD_URL) is not a Towerboard service"
            )
        elif 400 <= status < 500:
            why = (
                "the service, or a proxy in front of it, refused the request; is --url (or "
                "TOWERBOARD_URL) a Towerboard service?"
            )
        else:
            why = "is --url (or TOWERBOARD_URL) a Towerboard service?"
        return ClientError(f"{said}: {why}", _exit_code(status))

    def request(
        self,
        method: str,
        path: str,
        *,
        check_with: str | None = None,
        again: str | None = None,
        options: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """The service's answer, checked (`check`, with `options`). `check_with`: the
        command that tells whether a change it asked for was made, or where none can,
        `again`: what running it again does; said when no answer comes (see `lost`)."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise self.lost(error, method, path, check_with, again) from error
        except KeyboardInterrupt as interrupt:
            if method in ("GET", "HEAD"):
                raise  # a read: nothing to say of it
            # Ctrl-C given to a service slow to answer: the change may have been made, as
            # when no answer comes (`lost`), and run again it could be made twice.
            raise Interrupted(
                f"interrupted before the service answered {method} {path}: "
                f"{_unsure(check_with, again)}"
            ) from interrupt
        return self.check(response, options, check_with, again)

    def request_json(
        self,
        method: str,
        path: str,
        *,
        check_with: str | None = None,
        again: str | None = None,
        options: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> tuple[httpx.Response, Any]:
        """`request`, and its body as JSON: anything else is not the service answering (a
        wrong port, or a proxy's sign-in page)."""
        response = self.request(
            method, path, check_with=check_with, again=again, options=options, **kwargs
        )
        try:
            return response, response.json()
        except ValueError:
            raise self._not_the_service(response) from None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request_json("GET", path, **kwargs)[1]

    def patiently(self, call: Callable[[], _T], note: Callable[[str], None]) -> _T:
        """`call()` (a read: it changes nothing), tried again each second while the service
        cannot be reached or does not answer, for up to RECONNECT_SECONDS: a follower
        outlives a service restart, as the job does. `note` is told when the service is
        first found gone, and when it is back."""
        deadline = None
        while True:
            try:
                answer = call()
            except ClientError as error:
                if not error.unanswered:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + RECONNECT_SECONDS
                    note(
                        f"lost the service at {self.url}; trying again for up to "
                        f"{RECONNECT_SECONDS:g} s (the job goes on meanwhile)"
                    )
                elif time.monotonic() >= deadline:
                    raise
            else:
                if deadline is not None:
                    note(f"the service at {self.url} is back")
                return answer
            time.sleep(1.0)

    def job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self.get(f"/api/v1/jobs/{job_id}")
        return job

    def events(self, job_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """A job's Server-Sent Events as (event, data) until the service ends the stream."""
        timeout = httpx.Timeout(60.0, connect=5.0)  # the service pings every 15 s
        path = f"/api/v1/jobs/{job_id}/events"
        try:
            with self.http.stream("GET", path, timeout=timeout) as r:
                if not r.is_success:
                    r.read()
                    self.check(r)
                name, data = "message", list[str]()
                for line in r.iter_lines():
                    if line.startswith(":"):
                        continue  # a ping
                    if line == "":
                        if data:
                            yield name, json.loads("\n".join(data))
                        name, data = "message", []
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        name = value
                    elif field == "data":
                        data.append(value)
        except httpx.TransportError as error:
            raise self.lost(error, "GET", path) from error


# --- formatting ----------------------------------------------------------------------
