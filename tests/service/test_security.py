"""What a page of another origin can make a person's browser do to the service: writes with
the person's token cookie (CSRF), DNS rebinding without a token, framing; and the security
headers every answer carries. Real `towerboard serve` processes (with stand-in workers), a
real uvicorn over the app, and a real Chromium for what only a browser decides."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from service.browsers import cross_origin_write, unsafe_host
from tests.e2e.chromium import CHROMIUM, CHROMIUM_ARGS, NO_CHROMIUM
from tests.service.harness import ROOT, Service, fake_worker_env, free_port, job_spec

if TYPE_CHECKING:
    from playwright.sync_api import Playwright

TOKEN = "s3cret+token/with=padding=="
COOKIE = {"Cookie": "towerboard_token=s3cret%2Btoken%2Fwith%3Dpadding%3D%3D"}
# What a browser adds to a fetch from a page on another port of the same host.
SAME_SITE_PAGE = {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}


def _scope(method: str, headers: dict[str, str], path: str = "/api/v1/jobs") -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": raw}


@pytest.mark.parametrize(
    "headers, refused",
    [
        ({}, False),  # curl, the CLI
        ({"Sec-Fetch-Site": "same-origin", "Origin": "http://a:1"}, False),  # the dashboard
        ({"Sec-Fetch-Site": "none"}, False),  # typed by the person
        ({"Sec-Fetch-Site": "same-site"}, True),  # another port of the host
        ({"Sec-Fetch-Site": "cross-site"}, True),
        # Browsers without Sec-Fetch-Site: Origin against Host, default ports filled in.
        ({"Origin": "http://127.0.0.1:8000", "Host": "127.0.0.1:8000"}, False),
        ({"Origin": "http://Box.Example", "Host": "box.example:80"}, False),
        ({"Origin": "https://box.example", "Host": "box.example"}, False),  # TLS proxy
        ({"Origin": "http://[::1]:8000", "Host": "[::1]:8000"}, False),
        ({"Origin": "http://127.0.0.1:9000", "Host": "127.0.0.1:8000"}, True),
        ({"Origin": "http://evil.example", "Host": "127.0.0.1:8000"}, True),
        ({"Origin": "null", "Host": "127.0.0.1:8000"}, True),  # a sandboxed frame, file://
        ({"Origin": "http://a:99999", "Host": "a:1"}, True),  # unreadable: refused
        ({"Origin": "http://a:1"}, True),  # no Host to compare with
    ],
)
def test_cross_origin_write(headers: dict[str, str], refused: bool) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert (cross_origin_write(_scope(method, headers)) is not None) is refused
    for method in ("GET", "HEAD", "OPTIONS"):  # reads: CORS keeps their answers unread
        assert cross_origin_write(_scope(method, headers)) is None


@pytest.mark.parametrize(
    "host, refused",
    [
        ("127.0.0.1:8000", False),
        ("10.1.2.3", False),
        ("[::1]:8000", False),
        ("localhost:8000", False),
        ("LOCALHOST.", False),
        ("app.localhost:8000", False),
        ("rebind.evil.example:8000", True),
        ("gpubox:8000", True),
        ("127.0.0.1.evil.example", True),
        ("[::1", True),
    ],
)
def test_unsafe_host(host: str, refused: bool) -> None:
    assert (unsafe_host(_scope("GET", {"Host": host})) is not None) is refused
    assert unsafe_host(_scope("GET", {"Host": host}, path="/healthz")) is None


# --- with a token: the auth middleware refuses cross-origin writes -----------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("security")
    env = {**fake_worker_env(folder), "TOWERBOARD_TOKEN": TOKEN}
    service = Service(folder / "data", env)
    service.start()
    yield service
    service.close()


def _running_job(service: Service) -> str:
    job_id: str = service.submit(job_spec(name="wait"))["id"]
    service.wait_state(job_id, "running", timeout=30)
    return job_id


def test_cookie_cancel_from_another_port_of_the_host_403(secured: Service) -> None:
    # SameSite=Strict does not stop it: every port of a host is the same site.
    job_id = _running_job(secured)
    url = f"{secured.base_url}/api/v1/jobs/{job_id}/cancel"
    response = httpx.post(url, headers={**COOKIE, **SAME_SITE_PAGE})
    assert response.status_code == 403, response.text
    assert response.json()["detail"].startswith("Cross-origin POST refused: the browser says")
    assert secured.job(job_id)["cancel_requested"] is False
    # An older browser that sends Origin alone, from another port.
    response = httpx.post(url, headers={**COOKIE, "Origin": "http://127.0.0.1:1"})
    assert response.status_code == 403, response.text
    assert secured.job(job_id)["cancel_requested"] is False
    # The dashboard's own page, and curl, still cancel.
    response = httpx.post(url, headers={**COOKIE, "Sec-Fetch-Site": "same-origin"})
    assert response.status_code == 202, response.text
    secured.wait_state(job_id, "cancelled", timeout=30)


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/v1/tensorboard"),
        ("DELETE", "/api/v1/tensorboard"),
        ("POST", "/api/v1/jobs/abc/profile"),
        ("DELETE", "/api/v1/jobs/abc"),
        ("POST", "/tensorboard/data/plugin/scalars/scalars_multirun"),
    ],
)
def test_cookie_writes_from_another_origin_403(secured: Service, method: str, path: str) -> None:
    response = httpx.request(
        method, f"{secured.base_url}{path}", headers={**COOKIE, **SAME_SITE_PAGE}
    )
    assert response.status_code == 403, response.text
    assert response.json()["errors"] == []


def test_cookie_reads_from_another_origin_still_answer(secured: Service) -> None:
    # A read changes nothing, and without CORS headers the page cannot see the answer.
    response = httpx.get(f"{secured.base_url}/api/v1/jobs", headers={**COOKIE, **SAME_SITE_PAGE})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        body = b"<!doctype html><p>another site</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def other_port_page() -> Iterator[str]:
    """A page served from another port of the same host (a real loopback server, so the
    browser puts it in the same address space and site as the service)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/page"
    server.shutdown()
    server.server_close()


@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_browser_page_on_another_port_cannot_cancel(
    secured: Service, other_port_page: str, playwright: Playwright
) -> None:
    """A real Chromium holding the dashboard's cookie opens a page of another port of the
    same host, which posts a cancel as any page may (no-cors, credentials included)."""
    job_id = _running_job(secured)
    script = f"""fetch("{secured.base_url}/api/v1/jobs/{job_id}/cancel",
        {{method: "POST", mode: "no-cors", credentials: "include"}}).then(() => "sent")"""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    try:
        context = browser.new_context()
        # As the dashboard's setToken writes it.
        context.add_cookies(
            [
                {
                    "name": "towerboard_token",
                    "value": "s3cret%2Btoken%2Fwith%3Dpadding%3D%3D",
                    "url": secured.base_url,
                    "sameSite": "Strict",
                }
            ]
        )
        page = context.new_page()
        page.goto(other_port_page)
        assert page.evaluate(script) == "sent"
    finally:
        browser.close()
    time.sleep(0.5)  # the supervisor's next pass would have signalled it
    job = secured.job(job_id)
    assert job["cancel_requested"] is False and job["state"] == "running", job
    assert secured.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    secured.wait_state(job_id, "cancelled", timeout=30)


# --- BrowserGuard: every service, token or not -----------------------------------------

_GUARDED_APP = """
import sys, uvicorn
from service.main import create_app
from service.settings import Settings
settings = Settings(data_dir=sys.argv[1], token=sys.argv[3] or None)
app = create_app(settings)  # its middleware in order, as `towerboard serve` runs it
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], str]]:
    """`guarded(token)`: the app wrapped in BrowserGuard under a real uvicorn; its URL. One
    app a token for the module: the tests only send it requests that change nothing, and
    each app's start takes a second or more (a Python process importing the service)."""
    tmp_path = tmp_path_factory.mktemp("guarded")
    started: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}

    def start(token: str = "") -> str:
        if token in urls:
            return urls[token]
        port = free_port()
        env = fake_worker_env(tmp_path)
        process = subprocess.Popen(
            [sys.executable, "-c", _GUARDED_APP, str(tmp_path / f"d{len(started)}"), str(port), token],
            cwd=ROOT, env={**os.environ, **env},
        )  # fmt: skip
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    urls[token] = url
                    return url
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("the guarded app did not start")

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=20)


def _security_headers_on(url: str, headers: dict[str, str] | None = None) -> None:
    for path, status in [
        ("/", 200),
        ("/static/js/app.js", 200),
        ("/api/v1/jobs", 200),
        ("/api/v1/jobs/nope", 404),
        ("/no/such/route", 404),
        ("/healthz", 200),
    ]:
        response = httpx.get(f"{url}{path}", headers=headers)
        assert response.status_code == status, (path, response.text)
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["referrer-policy"] == "same-origin", path
        assert response.headers["x-frame-options"] == "SAMEORIGIN", path
        assert response.headers["content-security-policy"] == "frame-ancestors 'self'", path


def test_guard_security_headers(guarded: Callable[[str], str]) -> None:
    _security_headers_on(guarded(""))


def test_guard_without_token_refuses_other_host_names(guarded: Callable[[str], str]) -> None:
    url = guarded("")
    response = httpx.get(f"{url}/api/v1/jobs", headers={"Host": "rebind.evil.example:8000"})
    assert response.status_code == 403
    assert "DNS rebinding" in response.json()["detail"]
    assert response.headers["x-frame-options"] == "SAMEORIGIN"
    for host in ("localhost", "127.0.0.1", "localhost:8000"):
        assert httpx.get(f"{url}/api/v1/jobs", headers={"Host": host}).status_code == 200
    # Monitors probe by any name.
    assert httpx.get(f"{url}/healthz", headers={"Host": "gpubox"}).status_code == 200


def test_guard_without_token_refuses_cross_origin_writes(guarded: Callable[[str], str]) -> None:
    url = guarded("")
    # No token, no cookie: any page on the web could cancel, trace, start TensorBoard.
    response = httpx.post(
        f"{url}/api/v1/tensorboard", headers={"Sec-Fetch-Site": "cross-site", "Origin": "http://e"}
    )
    assert response.status_code == 403
    assert response.json()["detail"].startswith("Cross-origin POST refused")
    response = httpx.post(f"{url}/api/v1/jobs/nope/cancel")  # curl
    assert response.status_code == 404


def test_guard_with_token_answers_any_host_name(guarded: Callable[[str], str]) -> None:
    url = guarded(TOKEN)
    headers = {"Host": "gpubox.lan:8000", "Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{url}/api/v1/jobs", headers=headers).status_code == 200
    _security_headers_on(url, {"Authorization": f"Bearer {TOKEN}"})
    response = httpx.get(f"{url}/api/v1/jobs")
    assert response.status_code == 401
    assert response.headers["x-content-type-options"] == "nosniff"


def test_served_app_is_guarded(make_service: Callable[..., Service]) -> None:
    service = make_service()
    service.start()
    response = httpx.get(f"{service.base_url}/")
    assert response.headers.get("x-frame-options") == "SAMEORIGIN"
    response = httpx.post(
        f"{service.base_url}/api/v1/jobs/nope/cancel", headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert response.status_code == 403
    response = httpx.get(f"{service.base_url}/api/v1/jobs", headers={"Host": "evil.example"})
    assert response.status_code == 403
    assert json.loads(response.text)["errors"] == []


def test_host_names_are_refused_only_on_loopback_without_a_token(
    make_service: Callable[..., Service],
) -> None:
    # Listening on every interface with no token, the service is anyone's by any name, and
    # refusing names would only break a person opening it as http://gpubox:8000.
    everywhere = make_service(env={"TOWERBOARD_HOST": "0.0.0.0"})
    everywhere.start()
    named = httpx.get(f"{everywhere.base_url}/api/v1/jobs", headers={"Host": "gpubox:8000"})
    assert named.status_code == 200, named.text
    assert named.headers["x-frame-options"] == "SAMEORIGIN"  # the headers still go on
    cross = httpx.post(
        f"{everywhere.base_url}/api/v1/jobs/nope/cancel", headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert cross.status_code == 403  # and so does the cross-origin refusal


def test_serving_beyond_loopback_without_a_token_warns(
    make_service: Callable[..., Service],
) -> None:
    """The README says to set a token before listening beyond loopback; the start says so
    too, once, where a person reads it, and only when it matters."""
    warning = "No TOWERBOARD_TOKEN is set and 0.0.0.0 is reachable beyond this host"
    open_to_all = make_service(env={"TOWERBOARD_HOST": "0.0.0.0", "TOWERBOARD_TOKEN": ""})
    open_to_all.start()
    assert warning in open_to_all.log.read_text()
    with_token = make_service(env={"TOWERBOARD_HOST": "0.0.0.0", "TOWERBOARD_TOKEN": "t"})
    with_token.start()
    loopback = make_service(env={"TOWERBOARD_TOKEN": ""})
    loopback.start()
    for quiet in (with_token, loopback):
        assert "Listening on" in quiet.log.read_text()
        assert "No TOWERBOARD_TOKEN" not in quiet.log.read_text()


def test_listens_on_loopback() -> None:
    from service.browsers import listens_on_loopback

    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST."):
        assert listens_on_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "gpubox", ""):
        assert not listens_on_loopback(host), host
