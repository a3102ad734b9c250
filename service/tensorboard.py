"""The one TensorBoard the service runs for its users, as a subprocess on loopback.

TensorBoard reads a "view" directory of links, one per shown job, to that job's `tb/`:

    <data_dir>/tensorboard/logdir/<job_id> -> <data_dir>/runs/<job_id>/tb

so its runs are named `<job_id>/train`, `<job_id>/eval`, and the profile plugin (which
only understands a single `--logdir`, not `--logdir_spec`) finds each job's traces. It
serves under `--path_prefix /tensorboard`, which the service proxies (`service.proxy`).
The service never imports TensorFlow or TensorBoard itself; this only starts a process.
It is stopped after `tb_idle_minutes` without a proxied request, and a TensorBoard left by
a killed service is stopped at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from service.processes import is_same_process, start_time
from service.settings import Settings

log = logging.getLogger(__name__)

PATH_PREFIX = "/tensorboard"
_READY_TIMEOUT = 120.0  # TensorBoard imports TensorFlow: tens of seconds on a busy host
_STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class TensorBoardInstance:
    """A TensorBoard process the service started."""

    pid: int
    pid_started: int | None
    port: int
    logdir: Path
    job_ids: tuple[str, ...] | None  # None: every job, including jobs submitted later
    started_at: float

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TensorBoardLauncher:
    """Starts, reuses, watches and stops the service's TensorBoard. Call on the event loop."""

    def __init__(
        self,
        *,
        settings: Settings,
        client: httpx.AsyncClient,
        all_job_ids: Callable[[], list[str]],
    ) -> None:
        self._settings = settings
        self._client = client
        self._all_job_ids = all_job_ids
        self._home = settings.data_dir / "tensorboard"
        self._record = self._home / "instance.json"
        self._instance: TensorBoardInstance | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = asyncio.Event()
        self._ready_task: asyncio.Task[None] | None = None
        self._last_used = time.time()
        self.last_error: str | None = None
        self._lock = asyncio.Lock()

    # --- state -------------------------------------------------------------------------

    @property
    def instance(self) -> TensorBoardInstance | None:
        return self._instance

    @property
    def state(self) -> str:
        if self._instance is None:
            return "stopped"
        return "running" if self._ready.is_set() else "starting"

    @property
    def last_used(self) -> float:
        return self._last_used

    @property
    def idle_seconds(self) -> float:
        return self._settings.tb_idle_minutes * 60.0

    def touch(self) -> None:
        """A request used TensorBoard: restart the idle clock."""
        self._last_used = time.time()

    async def wait_ready(self, timeout: float = _READY_TIMEOUT) -> TensorBoardInstance | None:
        """The running instance once it answers, or None when there is none (or it died)."""
        instance = self._instance
        if instance is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self._instance if self._ready.is_set() else None

    # --- start / stop ------------------------------------------------------------------

    async def start(self, job_ids: list[str] | None) -> tuple[TensorBoardInstance, bool]:
        """Start TensorBoard over `job_ids` (every job when None), or reuse the one already
        up over the same selection. Returns the instance and whether it was started now."""
        selection = tuple(sorted(set(job_ids))) if job_ids is not None else None
        async with self._lock:
            self.touch()
            current = self._instance
            if current is not None and current.job_ids == selection and self._alive():
                return current, False
            await self._stop_locked()
            instance = self._launch(selection)
            return instance, True

    async def stop(self) -> bool:
        """Stop TensorBoard; False when none was running."""
        async with self._lock:
            return await self._stop_locked()

    def add_job(self, job_id: str) -> None:
        """Show a newly submitted job when TensorBoard shows every job."""
        instance = self._instance
        if instance is not None and instance.job_ids is None:
            self._link(instance.logdir, job_id)

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _link(self, logdir: Path, job_id: str) -> None:
        link = logdir / job_id
        with contextlib.suppress(FileExistsError):
            link.symlink_to(self._settings.runs_dir / job_id / "tb", target_is_directory=True)

    def _launch(self, selection: tuple[str, ...] | None) -> TensorBoardInstance:
        logdir = self._home / "logdir"
        shutil.rmtree(logdir, ignore_errors=True)
        logdir.mkdir(parents=True)
        for job_id in selection if selection is not None else self._all_job_ids():
            self._link(logdir, job_id)
        port = _free_port()
        command = [
            self._settings.python, "-m", "tensorboard.main",
            "--logdir", str(logdir),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--path_prefix", PATH_PREFIX,
            "--reload_interval", "5",
        ]  # fmt: skip
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # never hold GPU memory jobs need
        with open(self._settings.data_dir / "tensorboard.log", "ab") as log_file:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        instance = TensorBoardInstance(
            pid=self._process.pid,
            pid_started=start_time(self._process.pid),
            port=port,
            logdir=logdir,
            job_ids=selection,
            started_at=time.time(),
        )
        self._instance = instance
        self.last_error = None
        self._ready = asyncio.Event()
        self._ready_task = asyncio.create_task(self._await_ready(instance))
        self._record.write_text(
            json.dumps(
                {"pid": instance.pid, "pid_started": instance.pid_started, "logdir": str(logdir)}
            )
        )
        log.info(
            "Started TensorBoard pid %d on 127.0.0.1:%d for %s",
            instance.pid,
            port,
            "every job" if selection is None else ", ".join(selection),
        )
        return instance

    async def _await_ready(self, instance: TensorBoardInstance) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        probe = f"{instance.upstream}{PATH_PREFIX}/data/environment"
        while time.monotonic() < deadline:
            if not self._alive():
                self.last_error = (
                    "TensorBoard exited while starting; see "
                    f"{self._settings.data_dir / 'tensorboard.log'}."
                )
                break
            with contextlib.suppress(httpx.HTTPError):
                if (await self._client.get(probe, timeout=2.0)).status_code == 200:
                    self._ready.set()
                    log.info("TensorBoard pid %d is ready", instance.pid)
                    return
            await asyncio.sleep(0.25)
        else:
            self.last_error = f"TensorBoard did not answer within {_READY_TIMEOUT:g} s."
        log.error("%s", self.last_error)
        async with self._lock:
            if self._instance is instance:
                await self._stop_locked(error=self.last_error)

    async def _stop_locked(self, error: str | None = None) -> bool:
        process, instance = self._process, self._instance
        self._process, self._instance = None, None
        # Wake anyone waiting for readiness; they see no instance and give up.
        self._ready.set()
        self._ready = asyncio.Event()
        task, self._ready_task = self._ready_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._record.unlink(missing_ok=True)
        if process is None or instance is None:
            return False
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(process.wait), _STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait)
        log.info("Stopped TensorBoard pid %d%s", instance.pid, f" ({error})" if error else "")
        return True

    def stop_orphan(self) -> None:
        """Stop a TensorBoard that a killed service left running (found by its record)."""
        try:
            record = json.loads(self._record.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return
        pid, started, logdir = record.get("pid"), record.get("pid_started"), record.get("logdir")
        if (
            isinstance(pid, int)
            and isinstance(logdir, str)
            and is_same_process(pid, started, logdir)
        ):
            log.warning("Stopping TensorBoard pid %d left by a previous service", pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        self._record.unlink(missing_ok=True)

    async def stop_when_idle(self) -> None:
        """Run forever: stop TensorBoard once it has gone unused for the idle timeout."""
        check_every = max(0.5, min(30.0, self.idle_seconds / 4))
        while True:
            await asyncio.sleep(check_every)
            if self._instance is not None and time.time() - self._last_used > self.idle_seconds:
                log.info(
                    "TensorBoard unused for %g minutes; stopping it", self._settings.tb_idle_minutes
                )
                await self.stop()
