"""The CLI behind a reverse proxy, as the README recommends running the service: a stand-in
proxy on a real socket in front of a real service, answering as nginx does when a body is
past its limit (413) or when the service behind it is down (502) or slow (504)."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client.api import Client
from service.client.common import EXIT_NO_ANSWER, EXIT_USAGE
from tests.service.harness import ROOT, Service, job_spec, stand_in_service

pytestmark = pytest.mark.slow

NGINX_PAGE = "<html>\r\n<head><title>{0}</title></head>\r\n<body>\r\n<center><h1>{0}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"  # noqa: E501


class StandInProxy(http.server.ThreadingHTTPServer):
    """A reverse proxy to `service`: it relays each request and its answer, but refuses a
    body over `max_body` bytes (413, unsent); answers 502 without sending anything on while
    `down`; and answers 504 after sending a request whose method is in `gateway` on (as
    when its read timeout passes while the service works on it)."""

    def __init__(self, service: Service) -> None:
        self.upstream = httpx.Client(base_url=service.base_url, timeout=60)
        self.max_body: int | None = None
        self.down = False
        self.gateway: set[str] = set()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: StandInProxy
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the handler's own names)
        self._relay()

    do_POST = do_DELETE = do_HEAD = do_GET  # noqa: N815

    def _relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        proxy = self.server
        if proxy.max_body is not None and len(body) > proxy.max_body:
            return self._page(413, "Request Entity Too Large")
        if proxy.down:
            return self._page(502, "Bad Gateway")
        sent = {k: v for k, v in self.headers.items() if k.lower() == "content-type"}
        answer = proxy.upstream.request(self.command, self.path, content=body, headers=sent)
        if self.command in proxy.gateway:
            return self._page(504, "Gateway Time-out")
        self.send_response(answer.status_code)
        for name in ("content-type", "x-log-offset", "etag", "content-disposition"):
            if name in answer.headers:
                self.send_header(name, answer.headers[name])
        self.send_header("content-length", str(len(answer.content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.content)

    def _page(self, status: int, reason: str) -> None:
        page = NGINX_PAGE.format(f"{status} {reason}").encode()
        self.send_response(status, reason)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("behind-proxy")) as started:
        yield started


@pytest.fixture
def proxy(service: Service) -> Iterator[StandInProxy]:
    server = StandInProxy(service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        server.upstream.close()


def towerboard(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    """`towerboard ARGS --url URL` (ARGS alone where `url` is None), with no token and no
    TOWERBOARD_URL."""
    env = {k: v for k, v in os.environ.items() if k not in ("TOWERBOARD_TOKEN", "TOWERBOARD_URL")}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, *(["--url", url] if url else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_proxys_413_of_a_spec_is_a_rejected_spec_exit_2(
    proxy: StandInProxy, tmp_path: Path
) -> None:
    # nginx's client_max_body_size (1 MB by default, the service's own limit) refuses a
    # spec with an HTML page: it was exit 1, asking whether --url was a Towerboard service.
    proxy.max_body = 4096
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="padded")) + " " * 8192)
    refused = towerboard("submit", str(spec), url=proxy.url)
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert refused.stderr == (
        f"towerboard: error: cannot submit {spec}: {proxy.url} answered /api/v1/jobs with HTTP "
        "413 Request Entity Too Large (text/html), not the service's JSON: the service, or a "
        "proxy in front of it, refused the request; is --url (or TOWERBOARD_URL) a "
        "Towerboard service?\n"
    )


def test_a_proxys_gateway_error_on_a_change_says_how_to_check(
    service: Service, proxy: StandInProxy, tmp_path: Path
) -> None:
    # The request reached the service, which made the job; the proxy gave up waiting. It
    # said "failed unexpectedly" (exit 1), and a script that submitted again ran it twice.
    proxy.gateway = {"POST", "DELETE"}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(job_spec(name="quick")))  # the stand-in succeeds at once
    submitted = towerboard("submit", str(spec), url=proxy.url)
    assert submitted.returncode == EXIT_NO_ANSWER, submitted.stderr
    check = f"towerboard status --name quick --url {proxy.url}"
    assert submitted.stderr == (
        f"towerboard: error: sent POST /api/v1/jobs to the service at {proxy.url}, but a "
        "proxy in front of it answered HTTP 504 Gateway Time-out (text/html), not the "
        f"service: it may or may not have been done; check with `{check}` before trying "
        "again\n"
    )
    # What it says to run, run as it is (through the proxy, which relays reads), finds it.
    found = towerboard(*shlex.split(check)[1:], url=None)
    assert found.returncode == 0, found.stderr
    [job] = service.client.get("/api/v1/jobs", params={"name": "quick"}).json()["data"]
    assert job["id"] in found.stdout
    service.wait_state(job["id"], "succeeded")

    deleted = towerboard("delete", job["id"], url=proxy.url)
    assert deleted.returncode == EXIT_NO_ANSWER, deleted.stderr
    assert deleted.stderr.endswith(
        f"check with `towerboard status {job['id']} --url {proxy.url}` before trying again\n"
    ), deleted.stderr
    assert service.client.get(f"/api/v1/jobs/{job['id']}").status_code == 404  # it was done

    stopped = towerboard("tensorboard", "--stop", url=proxy.url)
    assert stopped.returncode == EXIT_NO_ANSWER, stopped.stderr
    assert stopped.stderr.endswith(
        "HTTP 504 Gateway Time-out (text/html), not the service: it may or may not have "
        "been done; running it again is safe\n"
    ), stopped.stderr


def test_a_proxys_502_on_a_read_is_no_answer_and_followers_ride_it_out(
    proxy: StandInProxy,
) -> None:
    # The service restarting behind nginx is a 502 page: `status` said "failed
    # unexpectedly" (exit 1), and `--watch`, `--follow` and `cancel --wait`, which ride out
    # a restart, gave up at once.
    proxy.down = True
    listed = towerboard("status", url=proxy.url)
    assert listed.returncode == EXIT_NO_ANSWER, listed.stderr
    assert listed.stderr == (
        f"towerboard: error: {proxy.url} answered GET /api/v1/jobs with HTTP 502 Bad Gateway "
        "(text/html), not the service's JSON: a proxy in front of the service had no answer "
        "from it (it is down, restarting or stuck); try again\n"
    )
    notes: list[str] = []
    back = threading.Timer(1.5, lambda: setattr(proxy, "down", False))
    back.start()
    client = Client(proxy.url, None)
    try:
        started = time.monotonic()
        answer = client.patiently(lambda: client.get("/api/v1/jobs"), notes.append)
    finally:
        back.cancel()
        client.close()
    assert "data" in answer and time.monotonic() - started >= 1.0
    assert notes == [
        f"lost the service at {proxy.url}; trying again for up to 120 s (the job goes on "
        "meanwhile)",
        f"the service at {proxy.url} is back",
    ]
