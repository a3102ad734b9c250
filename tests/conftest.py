"""Test-wide set-up: the CPU split into logical devices, so towers run for real, and the
running service that the service, CLI and dashboard tests share per module.

Logical devices can only be configured before TensorFlow's runtime starts, so this runs at
collection, before any test touches TensorFlow. Worker processes that tests start split
their own CPU.
"""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.service.harness import Service  # noqa: E402

if TYPE_CHECKING:
    from playwright.sync_api import Playwright

LOGICAL_CPUS = 4

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One running service shared by a test module (CPU-only host, one job at a time)."""
    data_dir = tmp_path_factory.mktemp("service") / "data"
    roots = tmp_path_factory.mktemp("datasets")
    svc = Service(data_dir, {"TOWERBOARD_DATA_ROOTS": str(roots)})
    svc.start()
    yield svc
    svc.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on its own 4 MiB tmpfs, to fill (skipped, saying why, where none can be
    mounted: it needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs to fill")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture(scope="session")
def playwright() -> Iterator["Playwright"]:
    """Playwright, one for the whole run: its sync API runs an event loop for as long as it
    is open, and a second one started meanwhile (the dashboard tests', the security
    tests') refuses to run inside it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p
