"""Reverse proxy from the service's `/tensorboard/*` to its TensorBoard on loopback.

One port and one auth for everything: TensorBoard listens on 127.0.0.1 only and answers
only requests carrying its secret, which this adds (`service.guarded_tensorboard`), so
every request reaches it through here, streamed both ways with httpx. Query values that look
like file paths leaving the logdir (`..` parts, absolute paths) are refused: some
TensorBoard plugins join request parameters onto the logdir.
"""

from __future__ import annotations

import logging
import posixpath
from urllib.parse import parse_qsl

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse

from service.guarded_tensorboard import SECRET_HEADER
from service.tensorboard import PATH_PREFIX, TensorBoardLauncher
from service.upstream import Upstream

log = logging.getLogger(__name__)

# Headers that describe one connection, not the message (RFC 9110 7.6.1), plus the
# service's own credentials, which TensorBoard has no business seeing.
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host",
}  # fmt: skip
# A client's own secret header is dropped, and the instance's added (see below).
_REQUEST_DROP = _HOP_BY_HOP | {"authorization", "cookie", SECRET_HEADER.lower()}
_RESPONSE_DROP = _HOP_BY_HOP | {"date", "server"}


def _escapes(value: str) -> bool:
    """True when a value read as a path could leave the directory it is joined to."""
    parts = value.replace("\\", "/").split("/")
    return value.startswith(("/", "\\")) or ".." in parts or "\x00" in value


# The profile plugin's trace viewer page is asked for with the URL it then reads the trace
# from (`trace_viewer_index.html?trace_data_url=/tensorboard/data/plugin/profile/data?...`):
# a URL of this TensorBoard, which the proxy checks in turn when the page fetches it, and
# not a path the plugin joins onto the logdir. Refusing it as an absolute path left the
# trace viewer a page of JSON error.
_URL_PARAMETERS = {"trace_data_url"}


def _refused(name: str, value: str) -> bool:
    """True when query parameter `name`'s value must not reach TensorBoard (see `_escapes`)."""
    if name in _URL_PARAMETERS and value.startswith(f"{PATH_PREFIX}/"):
        return _escapes(value.removeprefix(f"{PATH_PREFIX}/"))
    return _escapes(value)


# The profile plugin reads `session_path` and `run_path` as the folder to read profiles
# from, in place of the logdir: a relative path (from TensorBoard's working directory,
# with no `..` to refuse) or a `gs://`, `s3://`, `hf://` URI, which it reads with the
# host's cloud credentials. Its pages send them only when they were given them in their
# own address, which TensorBoard's and the dashboard's links never do.
_FOLDER_PARAMETERS = {"session_path", "run_path"}


# The profile plugin's "Capture profile" asks a live profiler server at an address the
# request gives (`capture_profile?service_addr=HOST:PORT`) to trace it: a connection from
# this host to any address, on a GET, which a page of another port of this host (same-site,
# so it gets the cookie) could make with an image tag. Workers run no profiler server here:
# their traces come from the job (`summaries.trace_steps`, `towerboard profile`).
_CAPTURE = f"{PATH_PREFIX}/data/plugin/profile/capture_profile"


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail, "errors": []}, status_code=status)


async def proxy_tensorboard(
    request: Request, launcher: TensorBoardLauncher, upstream: Upstream
) -> Response:
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    path = raw_path.decode("latin-1")
    query = request.url.query
    if path == PATH_PREFIX:  # TensorBoard's own settings may ride in the query (?darkMode=)
        return RedirectResponse(f"{PATH_PREFIX}/" + (f"?{query}" if query else ""), status_code=307)
    if posixpath.normpath(request.url.path) == _CAPTURE:
        return _error(
            403,
            "Capturing a profile from a profiler server is not available here: jobs trace "
            "their own steps (summaries.trace_steps in the spec, or POST "
            "/api/v1/jobs/{id}/profile for a running job).",
        )
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in _FOLDER_PARAMETERS:
            return _error(
                400,
                f"Query parameter {name!r} is not accepted: it would make TensorBoard read "
                f"profiles from a folder other than its logdir. Received: {value[:200]!r}",
            )
        if _refused(name, value):
            return _error(
                400,
                f"Query parameter {name!r} must not be a path outside TensorBoard's logdir. "
                f"Received: {value!r}",
            )
    if _escapes(request.url.path.removeprefix(PATH_PREFIX + "/")):
        return _error(400, f"Path must stay under {PATH_PREFIX}/. Received: {request.url.path!r}")

    instance = await launcher.wait_ready()
    if instance is None:
        detail = "TensorBoard is not running. Start it with POST /api/v1/tensorboard."
        if launcher.last_error:
            detail = f"{detail} Last error: {launcher.last_error}"
        return _error(503, detail)
    launcher.touch()

    url = f"{instance.upstream}{path}" + (f"?{query}" if query else "")
    headers = [
        (name, value)
        for name, value in request.headers.raw
        if name.decode("latin-1").lower() not in _REQUEST_DROP
    ]
    if "accept-encoding" not in request.headers:
        # Else httpx would ask for gzip, and the raw gzip would reach a client that did not.
        headers.append((b"accept-encoding", b"identity"))
    # TensorBoard answers nothing without it (`service.guarded_tensorboard`).
    headers.append((SECRET_HEADER.encode(), instance.secret.encode()))
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    client = upstream.client
    upstream_request = client.build_request(
        request.method, url, headers=headers, content=request.stream() if has_body else None
    )
    try:
        answer = await client.send(upstream_request, stream=True)
    except upstream.errors as error:
        log.warning("TensorBoard proxy: %s %s failed: %s", request.method, path, error)
        return _error(502, f"TensorBoard did not answer: {error}")
    # The profile plugin gzips its data whatever the request accepts: a client that did not
    # ask for gzip (curl without --compressed, a script) got the raw gzip bytes as "JSON".
    # It gets them decoded; every other answer goes on as TensorBoard sent it.
    decode = answer.headers.get("content-encoding", "").strip().lower() == "gzip" and (
        not _accepts_gzip(request.headers.get("accept-encoding", ""))
    )
    drop = _RESPONSE_DROP | ({"content-encoding", "content-length"} if decode else set())
    response = StreamingResponse(
        answer.aiter_bytes() if decode else answer.aiter_raw(),
        status_code=answer.status_code,
        background=BackgroundTask(answer.aclose),
    )
    # Raw bytes as TensorBoard sent them (gzip included), with its headers, repeats kept.
    response.raw_headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in answer.headers.multi_items()
        if name.lower() not in drop
    ]
    return response


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (by name or `*`, with a q above 0)."""
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = params.strip().lower().removeprefix("q=").strip() if "q=" in params.lower() else "1"
        try:
            if float(q) > 0:
                return True
        except ValueError:
            return True  # a q we cannot read: take the coding as accepted
    return False
