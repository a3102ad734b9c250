"""Bearer-token auth: with TOWERBOARD_TOKEN every route but /healthz and the dashboard's
files needs it; without, none."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.service.harness import Service, fake_worker_env, job_spec

# Shaped like `openssl rand -base64 32`: + / = are what cookie encoding changes.
TOKEN = "s3cret+token/with=padding=="
MISSING = {
    "detail": "Missing bearer token. Expected header 'Authorization: Bearer <TOWERBOARD_TOKEN>'.",
    "errors": [],
}
INVALID = {"detail": "Invalid bearer token. Expected the token in TOWERBOARD_TOKEN.", "errors": []}
PROTECTED = [
    ("GET", "/api/v1/jobs"),
    ("POST", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs/abc"),
    ("GET", "/api/v1/devices"),
    ("GET", "/api/v1/queue"),
    ("GET", "/api/v1/events"),
    ("GET", "/api/v1/tensorboard"),
    ("POST", "/api/v1/tensorboard"),
    ("GET", "/tensorboard/"),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    # Paths that only look like the open ones stay closed.
    ("GET", "/static"),
    ("GET", "/staticfoo/x"),
    ("GET", "/api/v1/jobs/static/x"),
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(tmp_path_factory.mktemp("auth") / "data", {"TOWERBOARD_TOKEN": TOKEN})
    service.start()
    yield service
    service.close()


@pytest.mark.parametrize("method, path", PROTECTED)
def test_read_without_token_401(secured: Service, method: str, path: str) -> None:
    response = httpx.request(method, f"{secured.base_url}{path}")
    assert response.status_code == 401
    assert response.json() == MISSING
    assert response.headers["www-authenticate"] == 'Bearer realm="towerboard"'
    # The security headers once each, not the error's own and then the guard's again.
    assert response.headers.get_list("content-security-policy") == ["frame-ancestors 'self'"]


@pytest.mark.parametrize("method, path", PROTECTED)
def test_read_with_wrong_token_401(secured: Service, method: str, path: str) -> None:
    response = httpx.request(
        method, f"{secured.base_url}{path}", headers={"Authorization": "Bearer wrong"}
    )
    assert response.status_code == 401
    assert response.json() == INVALID


@pytest.mark.parametrize(
    "value", [TOKEN, f"Token {TOKEN}", f"Basic {TOKEN}", "Bearer", "Basic dXNlcjpwdw=="]
)
def test_read_with_an_authorization_header_not_bearer_401(secured: Service, value: str) -> None:
    # The token under another scheme (a proxy's Basic credentials, say) or none is not
    # taken for it. Without its scheme it was answered "Missing bearer token" alone, which
    # its sender, who did send a header, could not make sense of.
    response = httpx.get(f"{secured.base_url}/api/v1/jobs", headers={"Authorization": value})
    assert response.status_code == 401
    assert response.json() == {
        "detail": "Missing bearer token. Expected header 'Authorization: Bearer "
        "<TOWERBOARD_TOKEN>'. Received: an Authorization header not of the form 'Bearer <token>'.",
        "errors": [],
    }
    assert TOKEN not in response.text


def test_websocket_upgrade_without_token_401(secured: Service) -> None:
    # Answered as the HTTP request it is, so the token guard sees it: no WebSocket is
    # served, whatever library is installed beside uvicorn.
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    response = httpx.get(f"{secured.base_url}/api/v1/jobs", headers=upgrade)
    assert response.status_code == 401
    assert response.json() == MISSING


def test_read_with_token(secured: Service) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{secured.base_url}/api/v1/jobs", headers=headers).status_code == 200
    assert httpx.get(f"{secured.base_url}/metrics", headers=headers).status_code == 200
    assert httpx.get(f"{secured.base_url}/docs", headers=headers).status_code == 200


def test_the_bearer_scheme_is_read_in_any_case(secured: Service) -> None:
    # (Under any other scheme the token is not taken: see
    # test_read_with_an_authorization_header_not_bearer_401, above.)
    url = f"{secured.base_url}/api/v1/jobs"
    assert httpx.get(url, headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200


def test_read_with_token_cookie(secured: Service) -> None:
    cookies = {"towerboard_token": TOKEN}
    response = httpx.get(f"{secured.base_url}/api/v1/jobs", cookies=cookies)
    assert response.status_code == 200


@pytest.mark.parametrize(
    "cookie",
    [
        # What the dashboard writes: document.cookie = `towerboard_token=${encodeURIComponent(token)}`.
        f"towerboard_token={quote(TOKEN, safe='')}",
        # Another site's malformed cookie on the same host must not hide ours.
        f"ga=a b; towerboard_token={quote(TOKEN, safe='')}",
        f'theme="unterminated; towerboard_token={quote(TOKEN, safe="")}; x=1',
    ],
)
def test_read_with_encoded_token_cookie(secured: Service, cookie: str) -> None:
    assert quote(TOKEN, safe="") != TOKEN  # the encoding really changes the value
    response = httpx.get(f"{secured.base_url}/api/v1/jobs", headers={"Cookie": cookie})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("header_first", [True, False])
def test_the_header_counts_over_the_cookie_in_either_order(
    secured: Service, header_first: bool
) -> None:
    """A script's Authorization header, sent on purpose, decides over a cookie a browser
    sent along; which came first in the request decided before."""

    def status(header: str, cookie: str) -> int:
        pairs = [("Authorization", f"Bearer {header}"), ("Cookie", f"towerboard_token={cookie}")]
        with httpx.Client() as client:
            request = client.build_request("GET", f"{secured.base_url}/api/v1/jobs")
            host = ("Host", request.headers["host"])
            request.headers = httpx.Headers([host, *(pairs if header_first else pairs[::-1])])
            return client.send(request).status_code

    assert status(header="wrong", cookie=quote(TOKEN, safe="")) == 401
    assert status(header=TOKEN, cookie="wrong") == 200


def test_read_with_wrong_encoded_token_cookie_401(secured: Service) -> None:
    cookie = f"ga=a b; towerboard_token={quote(TOKEN + 'x', safe='')}"
    response = httpx.get(f"{secured.base_url}/api/v1/jobs", headers={"Cookie": cookie})
    assert response.status_code == 401
    assert response.json() == INVALID


@pytest.mark.parametrize("path", ["/", "/static/js/app.js", "/static/css/app.css"])
def test_read_dashboard_files_without_token(secured: Service, path: str) -> None:
    # They hold no data, and the page must load to ask for the token.
    assert httpx.get(f"{secured.base_url}{path}").status_code == 200


def test_read_health_without_token(secured: Service) -> None:
    response = httpx.get(f"{secured.base_url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_read_without_token_when_auth_off(make_service: Callable[..., Service]) -> None:
    service = make_service()
    service.start()
    assert httpx.get(f"{service.base_url}/api/v1/jobs").status_code == 200
    assert httpx.get(f"{service.base_url}/docs").status_code == 200
    # A token sent anyway is ignored.
    response = httpx.get(
        f"{service.base_url}/api/v1/devices", headers={"Authorization": "Bearer anything"}
    )
    assert response.status_code == 200


def test_openapi_declares_the_token(secured: Service, service: Service) -> None:
    schema = httpx.get(
        f"{secured.base_url}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["security"] == [{"bearer": []}]
    assert schema["paths"]["/healthz"]["get"]["security"] == []  # open, and said to be
    assert "security" not in schema["paths"]["/api/v1/jobs"]["post"]  # the global one holds
    # Without a token, no scheme is declared.
    assert "security" not in service.client.get("/openapi.json").json()


def test_tensorboard_runs_without_the_service_token(tmp_path: Path) -> None:
    """TensorBoard sits behind the service's auth and never needs the token; in its
    environment, anything it loads (a plugin) could read it. A real TensorBoard over a
    stand-in worker's job."""
    service = Service(tmp_path / "data", {"TOWERBOARD_TOKEN": TOKEN, **fake_worker_env(tmp_path)})
    service.start()
    try:
        job = service.submit(job_spec(name="quick"))
        service.wait_state(job["id"], "succeeded")
        started = service.client.post("/api/v1/tensorboard", json={"job_ids": [job["id"]]})
        assert started.status_code == 201, started.text
        # Read once it answers: between fork and exec, its environ is still the service's.
        deadline = time.monotonic() + 120
        while (status := service.client.get("/api/v1/tensorboard").json())["state"] != "running":
            assert time.monotonic() < deadline, "TensorBoard did not start"
            time.sleep(0.2)
        environ = Path(f"/proc/{status['pid']}/environ").read_bytes().split(b"\0")
        assert environ and not [item for item in environ if item.startswith(b"TOWERBOARD_TOKEN=")]
        assert any(item.startswith(b"CUDA_VISIBLE_DEVICES=") for item in environ)
    finally:
        service.close()
