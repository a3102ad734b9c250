"""The deployment files: docker-compose.yml, Dockerfile and .dockerignore.

Where the docker client has Compose, `docker compose config` must accept the file; where it
has not (no plugin here), that test skips, saying so, and the structure tests below, which
always run, check what the file must hold. Building the image needs a Docker engine and
pulls gigabytes (the TensorFlow GPU base), so no test builds it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
HEALTHZ = "urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"


def _compose_command() -> list[str] | None:
    """`docker compose` (the v2 plugin) when the docker client has it, else None."""
    if shutil.which("docker") is None:
        return None
    try:
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ["docker", "compose"] if probe.returncode == 0 else None


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


@pytest.fixture(scope="module")
def towerboard(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["towerboard"]
    return service


def test_compose_config_accepts_file(tmp_path: Path) -> None:
    command = _compose_command()
    if command is None:
        pytest.skip(
            "the docker client here has no Compose (`docker compose version` fails), so "
            "`docker compose config` was not run; test_compose_* check the file's structure"
        )
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path)}
    missing = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert missing.returncode != 0
    assert "set TOWERBOARD_TOKEN" in missing.stderr  # the token is required

    env.update(TOWERBOARD_TOKEN="t0ken", TOWERBOARD_GPUS="0,1", TOWERBOARD_DATASETS="/srv/data")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    service = config["services"]["towerboard"]
    assert service["environment"]["TOWERBOARD_TOKEN"] == "t0ken"
    assert service["environment"]["TOWERBOARD_GPUS"] == "0,1"
    assert [(p["target"], str(p["published"])) for p in service["ports"]] == [(8000, "8000")]
    mounts = {v["target"]: v for v in service["volumes"]}
    assert mounts["/datasets"]["source"] == "/srv/data" and mounts["/datasets"]["read_only"]
    assert mounts["/var/lib/towerboard"]["type"] == "volume"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1 and devices[0]["driver"] == "nvidia"
    assert devices[0]["count"] in ("all", -1)  # compose writes "all" as -1
    assert devices[0]["capabilities"] == ["gpu"]


def test_compose_one_service_one_port(compose: dict[str, Any], towerboard: dict[str, Any]) -> None:
    assert list(compose["services"]) == ["towerboard"]
    assert towerboard["build"] == "."
    # One port: the API, the dashboard and TensorBoard (through the proxy) share it.
    assert towerboard["ports"] == ["${TOWERBOARD_PORT:-8000}:8000"]
    assert "6006" not in COMPOSE.read_text()
    assert towerboard["restart"] == "unless-stopped"
    assert towerboard["init"] is True


def test_compose_reserves_gpus(towerboard: dict[str, Any]) -> None:
    devices = towerboard["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


def test_compose_volumes_data_dir_and_read_only_datasets(
    compose: dict[str, Any], towerboard: dict[str, Any]
) -> None:
    assert towerboard["volumes"] == [
        "towerboard-data:/var/lib/towerboard",
        "${TOWERBOARD_DATASETS:-./datasets}:/datasets:ro",
    ]
    assert "towerboard-data" in compose["volumes"]
    env = towerboard["environment"]
    assert env["TOWERBOARD_DATA_DIR"] == "/var/lib/towerboard"
    assert env["TOWERBOARD_DATA_ROOTS"] == "/datasets"


def test_compose_stop_lets_workers_checkpoint(towerboard: dict[str, Any]) -> None:
    # The service SIGTERMs its workers at stop and waits up to the cancel grace (30 s by
    # default) for their checkpoints; Docker must not SIGKILL them before that.
    assert towerboard["environment"]["TOWERBOARD_STOP_WORKERS_ON_EXIT"] == "true"
    grace = re.fullmatch(r"(\d+)s", towerboard["stop_grace_period"])
    assert grace is not None and int(grace.group(1)) > 30


def test_compose_token_and_gpus_from_environment(towerboard: dict[str, Any]) -> None:
    env = towerboard["environment"]
    assert re.fullmatch(r"\$\{TOWERBOARD_TOKEN:\?.+\}", env["TOWERBOARD_TOKEN"])
    assert env["TOWERBOARD_GPUS"] == "${TOWERBOARD_GPUS:-0}"
    # No custom models unless the operator names their modules (empty allows none).
    assert env["TOWERBOARD_MODEL_MODULES"] == "${TOWERBOARD_MODEL_MODULES:-}"


def test_compose_health_check_on_healthz(towerboard: dict[str, Any]) -> None:
    check = towerboard["healthcheck"]
    assert check["test"][:3] == ["CMD", "python", "-c"]
    assert HEALTHZ in check["test"][3]
    assert {"interval", "timeout", "retries", "start_period"} <= set(check)


def test_dockerfile_tensorflow_gpu_base_matches_pin() -> None:
    text = DOCKERFILE.read_text()
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    tensorflow = next(p for p in pins if p.startswith("tensorflow=="))
    version = tensorflow.removeprefix("tensorflow==")
    assert re.search(rf"^FROM tensorflow/tensorflow:{re.escape(version)}-gpu$", text, re.M)
    # The base's TensorFlow is kept: it is left out of the requirements and held by a
    # constraint, the project itself goes in with --no-deps, and the version is checked.
    assert "d.startswith('tensorflow==')" in text
    assert "-c /tmp/constraints.txt" in text
    assert "pip install --no-deps -e ." in text
    assert f"assert v == '{version}'" in text


def test_dockerfile_serves_on_8000_with_health_check() -> None:
    text = DOCKERFILE.read_text()
    assert "EXPOSE 8000" in text
    assert HEALTHZ in text and "HEALTHCHECK" in text
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    assert json.loads(cmd.group(1)) == [
        "towerboard", "serve", "--host", "0.0.0.0", "--port", "8000",
        "--data-dir", "/var/lib/towerboard",
    ]  # fmt: skip
    assert re.search(r"^USER towerboard$", text, re.M)  # not root
    for folder in ("service", "trainer", "static"):
        assert f"COPY {folder} ./{folder}" in text


def test_dockerignore_keeps_context_small() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "data", "tests", "**/__pycache__", ".env"} <= ignored
    for needed in ("service", "trainer", "static", "pyproject.toml", "README.md"):
        assert needed not in ignored
