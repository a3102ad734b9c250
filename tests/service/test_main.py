"""The service as a program: no TensorFlow, quick start, the CLI, the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from service.deps import Runtime
from service.main import create_app
from service.settings import Settings
from service.supervisor import Supervisor
from service.tensorboard import TensorBoardLauncher
from tests.service.harness import ROOT, Service


def test_import_service_without_tensorflow() -> None:
    code = (
        "import sys, json\n"
        "import service, service.main, service.cli\n"
        "service.main.create_app()\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('tensorflow', 'tensorboard', 'keras'))))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(output) == []


def test_serve_starts_without_httpx(tmp_path: Path) -> None:
    # httpx is a tenth of the service's start (about 0.1 s here): only the client verbs and
    # the TensorBoard proxy need it, so `serve` loads it when TensorBoard is first asked for.
    code = (
        "import asyncio, json, sys\n"
        "from service.cli import build_parser\n"
        "from service.main import create_app\n"
        "from service.settings import Settings\n"
        "build_parser().parse_args(['serve'])\n"
        "app = create_app(Settings(data_dir=sys.argv[1]))\n"
        "async def run():\n"
        "    async with app.router.lifespan_context(app):\n"
        "        pass\n"
        "asyncio.run(run())\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'httpx')))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(output) == []


def test_serve_help_lists_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--help"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    for option in ("--host", "--port", "--data-dir"):
        assert option in result.stdout


def test_serve_bad_setting_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={"TOWERBOARD_CPU_JOBS": "0", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "Invalid setting TOWERBOARD_CPU_JOBS: Input should be greater than or equal to 1" in (
        result.stderr
    )


def test_serve_model_modules_that_are_no_module_names_exit_2(tmp_path: Path) -> None:
    result = serve_with(tmp_path, TOWERBOARD_MODEL_MODULES="models, team/models.py")
    assert result.returncode == 2
    assert (
        "Invalid setting TOWERBOARD_MODEL_MODULES: Expected module names such as "
        "'models' or 'team.models'. Received: ['team/models.py']"
    ) in result.stderr, result.stderr


def test_serve_python_that_cannot_be_run_exits_2_in_one_line(tmp_path: Path) -> None:
    # It started, then failed every job with "The worker exited with code 127." and
    # answered a TensorBoard start with a bare 500.
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "0",
         "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={"TOWERBOARD_PYTHON": str(tmp_path / "no-python"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "Invalid setting TOWERBOARD_PYTHON: Expected a Python interpreter that exists" in line
    assert line.endswith(f"Received: '{tmp_path / 'no-python'}'"), line


def serve_with(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "0",
         "--data-dir", str(tmp_path / "data")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip


def test_serve_worker_module_that_cannot_be_found_exits_2_in_one_line(tmp_path: Path) -> None:
    # It started, then failed every job with "The worker exited with code 1.".
    result = serve_with(tmp_path, TOWERBOARD_WORKER_MODULE="trainr")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        "Invalid setting TOWERBOARD_WORKER_MODULE: Expected a module that TOWERBOARD_PYTHON can "
        "run as `python -m MODULE` (found on its sys.path or PYTHONPATH). Received: 'trainr', "
        "not found"
    ), line
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_serve_python_without_tensorflow_exits_2_naming_what_it_lacks(tmp_path: Path) -> None:
    # This interpreter without its site-packages: a Python that lacks TensorFlow, as a
    # system Python beside the service's virtualenv does.
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    result = serve_with(tmp_path, TOWERBOARD_PYTHON=str(bare))
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        "Invalid setting TOWERBOARD_PYTHON: Expected an interpreter with TensorFlow and "
        f"TensorBoard installed. Received: '{bare}', which lacks tensorflow and tensorboard"
    ), line


def test_serve_python_that_is_no_python_exits_2(tmp_path: Path) -> None:
    result = serve_with(tmp_path, TOWERBOARD_PYTHON="/bin/true")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith(
        "Invalid setting TOWERBOARD_PYTHON: Expected a Python 3.11+ interpreter. Received: "
        "'/bin/true', which did not run Python's check (exit 0)"
    ), result.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # It said "TOWERBOARD_GPUS.1", no variable's name.
        ({"TOWERBOARD_GPUS": "0,b"}, "Invalid setting TOWERBOARD_GPUS (item 2 of the list): "
         "Input should be a valid integer, unable to parse string as an integer. Received: 'b'"),
        # It said "Received: [0, 0]. Received: '0,0'".
        ({"TOWERBOARD_GPUS": "0,0"},
         "Invalid setting TOWERBOARD_GPUS: Expected distinct GPU ids >= 0. Received: [0, 0]"),
        # It said "Expected a free port" of a host name that does not resolve.
        ({"TOWERBOARD_HOST": "no-such-host.invalid"},
         "Expected an IP address or a name of this host: give another with --host or "
         "TOWERBOARD_HOST."),
    ],
)  # fmt: skip
def test_serve_bad_setting_line_names_it(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "0",
         "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, env={**env, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode in (1, 2)
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(expected), line


def test_serve_bad_option_names_the_option(tmp_path: Path) -> None:
    # It named TOWERBOARD_PORT, which the person never set, for a bad --port.
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "70000",
         "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        "ERROR towerboard: Invalid --port: Input should be less than or equal to 65535. "
        "Received: 70000"
    ), line


def test_serve_data_dir_that_cannot_be_made_exits_1_in_one_line(tmp_path: Path) -> None:
    # A data dir under a file: it was "[Errno 20] Not a directory: '...'", naming no setting.
    (tmp_path / "file").write_text("")
    data_dir = tmp_path / "file" / "data"
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "0", "--data-dir", str(data_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        f"ERROR towerboard: Cannot use the data dir {data_dir} (Not a directory). Expected a "
        "folder this service can create and write: give another with --data-dir or "
        "TOWERBOARD_DATA_DIR."
    ), line


def test_serve_with_a_store_that_is_no_database_exits_1_in_one_line(tmp_path: Path) -> None:
    # A towerboard.db of other bytes (a damaged disk, a copy cut short): the app's start-up
    # raised "file is not a database" as a traceback, after "Listening on", and exited 3.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    store = data_dir / "towerboard.db"
    damaged = b"SQLite? no: " + bytes(range(256)) * 16
    store.write_bytes(damaged)
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "0", "--data-dir", str(data_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        f"ERROR towerboard: Cannot open the job store {store} (file is not a database). "
        "Expected Towerboard's SQLite job store, or no file there: restore it from a backup, "
        "or move it aside to start with an empty store (its jobs' folders stay under runs/), "
        "then start again."
    ), line
    assert store.read_bytes() == damaged  # left as it was, for whoever restores it


def test_read_openapi_lists_every_route(service: Service) -> None:
    paths = httpx.get(f"{service.base_url}/openapi.json").json()["paths"]
    assert set(paths) == {
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/cancel",
        "/api/v1/jobs/{job_id}/resume",
        "/api/v1/jobs/{job_id}/events",
        "/api/v1/jobs/{job_id}/logs",
        "/api/v1/jobs/{job_id}/metrics",
        "/api/v1/jobs/{job_id}/metrics.csv",
        "/api/v1/jobs/{job_id}/profile",
        "/api/v1/jobs/{job_id}/checkpoints",
        "/api/v1/jobs/{job_id}/checkpoints/{step}",
        "/api/v1/jobs/{job_id}/export",
        "/api/v1/events",
        "/api/v1/tensorboard",
        "/api/v1/devices",
        "/api/v1/queue",
        "/healthz",
        "/metrics",
    }
    create = paths["/api/v1/jobs"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobSpec"
    }
    # Every API route refuses an unknown query parameter (422); every body is JSON (415).
    for path, item in paths.items():
        if path.startswith("/api/v1/"):
            for method, operation in item.items():
                assert "422" in operation["responses"], (method, path)
    for path in (
        "/api/v1/jobs",
        "/api/v1/tensorboard",
        "/api/v1/jobs/{job_id}/profile",
        "/api/v1/jobs/{job_id}/resume",
    ):
        assert "415" in paths[path]["post"]["responses"], path
    docs = httpx.get(f"{service.base_url}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_read_dashboard(service: Service) -> None:
    page = httpx.get(f"{service.base_url}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.text == (ROOT / "static" / "index.html").read_text()
    script = httpx.get(f"{service.base_url}/static/js/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["content-type"]
    # httpx removes `..` segments before sending, so the raw target goes over a socket.
    assert _raw_get_status(service.port, "/static/../service/main.py") == 404
    # The same `..` that stays inside static/ is served: the target did reach the server as sent.
    assert _raw_get_status(service.port, "/static/../static/js/app.js") == 200
    assert httpx.get(f"{service.base_url}/static/%2E%2E/service/main.py").status_code == 404


def _raw_get_status(port: int, target: str) -> int:
    """The status of `GET target` sent byte for byte, as a client that does not normalise
    paths would send it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        status_line = sock.makefile("rb").readline().decode("latin-1")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1", status_line
    return int(status)


def _serve_then_stop(app: FastAPI) -> BaseException | None:
    """Start the app's lifespan, with an upstream client made so there is one to close, and
    stop it; what the stop raised."""

    async def go() -> None:
        async with app.router.lifespan_context(app):
            assert app.state.runtime.upstream.client is not None  # made when first asked for

    # In a thread of its own: after the browser tests, Playwright keeps an event loop
    # running in this one, and asyncio.run() refuses to start another beside it.
    with ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(asyncio.run, go()).result()
        except Exception as error:
            return error
    return None


@pytest.mark.parametrize("fails", ["launcher.stop", "supervisor.stop_workers"])
def test_stop_closes_the_store_whatever_a_part_before_it_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    # The stop ran its parts one after another with nothing between them: a TensorBoard
    # that failed to stop, or workers that did, left the upstream client and the store
    # open (and the supervisor watching, in the second case). The failure is injected.
    def failed(*_: Any) -> None:
        raise RuntimeError(f"{fails} failed")

    if fails == "launcher.stop":

        async def failed_async(*_: Any) -> None:
            failed()

        monkeypatch.setattr(TensorBoardLauncher, "stop", failed_async)
    else:
        monkeypatch.setattr(Supervisor, "stop_workers", failed)
    app = create_app(Settings(data_dir=tmp_path / "data", stop_workers_on_exit=True))
    error = _serve_then_stop(app)
    assert isinstance(error, RuntimeError) and str(error) == f"{fails} failed"
    runtime: Runtime = app.state.runtime
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
        runtime.store.exited("x")  # a write: the writer is closed
    assert runtime.upstream._client is None, "the upstream client was not closed"
    assert not runtime.supervisor._thread.is_alive()  # type: ignore[union-attr]


def test_stop_joins_the_supervisor_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopping the supervisor joins its thread, for up to 10 s while a pass finishes: that
    # ran on the event loop, which served nothing meanwhile.
    on_the_loop: list[bool] = []
    stop = Supervisor.stop

    def stop_seen(self: Supervisor) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop runs in this thread
            on_the_loop.append(False)
        else:
            on_the_loop.append(True)
        stop(self)

    monkeypatch.setattr(Supervisor, "stop", stop_seen)
    app = create_app(Settings(data_dir=tmp_path / "data"))
    assert _serve_then_stop(app) is None
    assert on_the_loop == [False]
    assert not app.state.runtime.supervisor._thread.is_alive()
