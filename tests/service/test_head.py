"""HEAD wherever GET works (RFC 9110), against a real service: every GET route of the app
answers HEAD with GET's status and headers and no body, an event stream's HEAD ends at
once without streaming, and a 405 lists every method its path takes."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from service.main import create_app
from service.settings import Settings
from tests.service.harness import Service, fake_index, job_spec, stand_in_service

# Headers two answers may differ in without saying anything different.
_PER_ANSWER = {"date"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    """A service and a job that has succeeded with metric points, a log, a checkpoint at
    step 20 and an export, so each job route has something to answer."""
    folder = tmp_path_factory.mktemp("head")
    with stand_in_service(folder) as service:
        job_id = service.submit(job_spec(name="points"))["id"]
        service.wait_state(job_id, "succeeded")
        run = service.data_dir / "runs" / job_id
        (run / "checkpoints").mkdir(exist_ok=True)
        (run / "checkpoints" / "ckpt-20.data-00000-of-00001").write_bytes(os.urandom(50_000))
        (run / "checkpoints" / "ckpt-20.index").write_bytes(fake_index())
        (run / "export" / "variables").mkdir(parents=True)
        (run / "export" / "saved_model.pb").write_bytes(os.urandom(4_000))
        (run / "export" / "variables" / "variables.index").write_bytes(b"v" * 300)
        (run / "export" / "variables" / "variables.data-00000-of-00001").write_bytes(b"d" * 900)
        yield service, job_id


def get_paths(job_id: str, tmp_path: Path) -> list[str]:
    """Every path of the app that a GET route answers (from `app.routes`, included routers
    opened), its parameters filled in: the job, its checkpoint, a TensorBoard page."""
    app = create_app(Settings(data_dir=tmp_path / "unused"))
    values = {"job_id": job_id, "step": "20", "path": "index.html", "name": "roboto.woff2"}
    paths = []
    for route in iter_route_contexts(app.routes):
        if route.path is not None and "GET" in (route.methods or ()):
            paths.append(re.sub(r"{(\w+)(:\w+)?}", lambda m: values[m.group(1)], route.path))
    return sorted(set(paths))


def test_get_paths_cover_the_api(served: tuple[Service, str], tmp_path: Path) -> None:
    # The walk below is only as good as the routes it finds inside the included routers.
    _, job_id = served
    paths = get_paths(job_id, tmp_path)
    for path in ("/api/v1/jobs", f"/api/v1/jobs/{job_id}/logs", "/api/v1/events", "/metrics"):
        assert path in paths
    assert len(paths) >= 19, paths


def test_head_answers_what_get_does_without_a_body(
    served: tuple[Service, str], tmp_path: Path
) -> None:
    # It was a 405 (`allow: GET`) on every GET route but /healthz, /, /static and the
    # downloads: a monitor probing /metrics or a job with HEAD, or `curl -I`, got nothing.
    service, job_id = served
    # A HEAD that went on to stream (an event stream, a whole metrics stream) would not end
    # within this; the bound below is loose, for a loaded machine.
    client = httpx.Client(base_url=service.base_url, timeout=30.0)
    for path in get_paths(job_id, tmp_path):
        with client.stream("GET", path) as got:  # an event stream is read no further
            streams = got.headers.get("content-type", "").startswith("text/event-stream")
            body = b"" if streams else got.read()
        started = time.monotonic()
        head = client.head(path)
        assert time.monotonic() - started < 20, path
        assert head.status_code == got.status_code, (path, head.status_code, head.text)
        assert head.content == b"", path
        assert _headers(head) == _headers(got), path
        if "content-length" in got.headers:
            assert got.headers["content-length"] == str(len(body)), path
        assert got.status_code != 405, path
    client.close()


def _headers(response: httpx.Response) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in response.headers.multi_items() if k not in _PER_ANSWER)


def test_head_of_an_event_stream_ends_at_once_without_streaming(
    served: tuple[Service, str],
) -> None:
    # A GET of these never ends while the job runs (the all-jobs stream never does); their
    # HEAD must end with its head and leave the connection for the next request.
    service, _ = served
    running = service.submit(job_spec(name="runs-until-cancelled"))["id"]
    service.wait_state(running, "running")
    try:
        for path in ("/api/v1/events", f"/api/v1/jobs/{running}/events"):
            with socket.create_connection(("127.0.0.1", service.port), timeout=15) as sock:
                started = time.monotonic()
                sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                head = _read_head(sock)
                assert time.monotonic() - started < 10, path  # loose, for a loaded machine
                assert head.startswith(b"HTTP/1.1 200 "), head
                assert b"content-type: text/event-stream" in head.lower(), head
                # Nothing follows the head (no event, no chunk), and the same connection
                # answers the next request.
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert _read_head(sock).startswith(b"HTTP/1.1 200 "), path
        # No HEAD left a listener behind (the walk's GET of a stream may still be ending).
        deadline = time.monotonic() + 10
        while "towerboard_event_streams 0\n" not in service.client.get("/metrics").text:
            assert time.monotonic() < deadline, "an event stream is still open"
            time.sleep(0.1)
    finally:
        service.client.post(f"/api/v1/jobs/{running}/cancel")
        service.wait_state(running, "cancelled")


def _read_head(sock: socket.socket) -> bytes:
    """One response's head, read a byte at a time so nothing after it is consumed."""
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, f"connection closed after {data!r}"
        data += byte
    return data


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/api/v1/jobs", "GET, HEAD, POST"),
        ("PUT", "/api/v1/jobs/{id}", "GET, HEAD, PATCH, DELETE"),
        ("POST", "/api/v1/jobs/{id}/logs", "GET, HEAD"),
        ("POST", "/api/v1/jobs/{id}/checkpoints/20", "GET, HEAD"),
        ("GET", "/api/v1/jobs/{id}/cancel", "POST"),
        ("HEAD", "/api/v1/jobs/{id}/cancel", "POST"),
        ("PATCH", "/api/v1/tensorboard", "GET, HEAD, POST, DELETE"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
        ("POST", "/docs", "GET, HEAD"),
        ("POST", "/static/js/app.js", "GET, HEAD"),  # the static files' own
    ],
)
def test_405_allows_every_method_of_its_path(
    served: tuple[Service, str], method: str, path: str, allow: str
) -> None:
    # A route's own 405 named its own methods alone (DELETE /jobs said `allow: GET`, not
    # POST), in no fixed order, and never HEAD; its body named none.
    service, job_id = served
    response = service.client.request(method, path.format(id=job_id))
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow
    if method == "HEAD":
        assert response.content == b""
    else:
        assert response.json()["detail"] == (
            f"{method} is not allowed on {path.format(id=job_id)}; it takes {allow}. See /docs."
        )


def test_head_through_the_tensorboard_proxy_is_tensorboards_own(
    served: tuple[Service, str],
) -> None:
    # The proxy takes HEAD itself and sends it on: TensorBoard answers it as its GET, and
    # a client that takes no gzip gets, as for a GET, no length of the gzip'd body.
    service, job_id = served
    assert service.client.post("/api/v1/tensorboard", json={"job_ids": [job_id]}).is_success
    try:
        deadline = time.monotonic() + 120
        while service.client.get("/api/v1/tensorboard").json()["state"] != "running":
            assert time.monotonic() < deadline, "TensorBoard did not start"
            time.sleep(0.25)
        for path in ("/tensorboard/", "/tensorboard/data/environment", "/tensorboard/nope"):
            for accept in ("gzip", "identity"):
                headers = {"Accept-Encoding": accept}
                got = service.client.get(path, headers=headers)
                head = service.client.head(path, headers=headers)
                assert head.status_code == got.status_code, (path, accept)
                assert head.content == b"", (path, accept)
                assert _headers(head) == _headers(got), (path, accept)
    finally:
        service.client.delete("/api/v1/tensorboard")
