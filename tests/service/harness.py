"""The service under test: a real `towerboard serve` subprocess on a free loopback port, with
a real SQLite file and real worker processes, that a test may SIGKILL and start again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from service.checkpoints import INDEX_END
from service.client.api import ReusedConnectionRetry

ROOT = Path(__file__).resolve().parents[2]
# How long a wait on a job's worker may take: one starts TensorFlow, which took over 100 s
# to its first step on a 2-core host under a load of 14 (two pytest workers beside other
# work). Only a failing wait runs this long.
WORKER_WAIT = 300.0

# The tiny synthetic job: a few seconds of training, two checkpoints, two evals.
TINY_JOB: dict[str, Any] = {
    "name": "t",
    "model": {"name": "mlp", "params": {"hidden": [16]}},
    "data": {"format": "synthetic", "params": {"shape": [8, 8], "classes": 4, "size": 256}},
    "towers": 1,
    "batch_size": 32,
    "steps": 40,
    "eval": {"every_steps": 20, "batches": 2},
    "summaries": {"trace_steps": []},
    "checkpoint": {"every_steps": 20, "every_seconds": 0, "keep": 3},
}


def job_spec(**changes: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(TINY_JOB))
    spec.update(changes)
    return spec


def fake_index(size: int = 100) -> bytes:
    """`size` bytes the service takes for a whole checkpoint index: they end as
    TensorFlow's do (`INDEX_END`). A stand-in's checkpoints hold no tensors."""
    return b"i" * (size - len(INDEX_END)) + INDEX_END


def stand_in_checkpoint(service: Service, job_id: str, step: int) -> None:
    """The files a CheckpointManager writes for `step`, in the job's run directory, for a
    stand-in worker that reports checkpoints but writes none (the service only lists them)."""
    checkpoints = service.data_dir / "runs" / job_id / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    (checkpoints / f"ckpt-{step}.index").write_bytes(fake_index())
    (checkpoints / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d")


def long_job(**changes: Any) -> dict[str, Any]:
    """A job that trains until cancelled or killed, checkpointing often."""
    spec = job_spec(
        name="long",
        steps=10_000_000,
        eval={"every_steps": 0, "batches": 1},
        summaries={
            "trace_steps": [],
            "scalars_every": 50,
            "histograms_every": 0,
            "images_every": 0,
        },
        checkpoint={"every_steps": 25, "every_seconds": 0, "keep": 2},
    )
    spec.update(changes)
    return spec


# A stand-in worker, `python -m fake_worker run --job-dir DIR`, for what the real trainer
# never does on purpose: ignore SIGTERM, write a progress line the store cannot take,
# swap a link in for its worker.log, or take seconds (or forever) to exit after its result. It keeps the run-directory contract (progress lines,
# result.json, the exit codes) and does what its spec's name says.
FAKE_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
behaviour = json.loads((job_dir / "spec.json").read_text())["name"]
stopped = []


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), **line}) + "\\n")


def build(input_shape, num_classes):  # what a job's custom model may name: the service reads
    raise NotImplementedError  # that it is here; this worker trains nothing


def end(outcome, code):
    # As the trainer ends: its end line, then result.json; none before its start line.
    if behaviour not in ("preparing", "loading"):
        phase = {"succeeded": "done", "cancelled": "stopped"}.get(outcome, "failed")
        progress(event="end", outcome=outcome, phase=phase)
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": behaviour}))
    sys.exit(code)


if behaviour == "deaf":  # ignores SIGTERM: only SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:  # stops on SIGTERM like the trainer: exit 3, outcome cancelled
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
if behaviour == "preparing":  # cancelled before its first line, as while loading data
    while not stopped:
        time.sleep(0.05)
    end("cancelled", 3)
if behaviour == "loading":  # its preparation's lines (trainer/preparing.py), held at 42%, 99%
    def stage(name, **amounts):
        progress(event="phase", phase="preparing", stage=name, **amounts)

    stage("importing TensorFlow")
    stage("loading data", stage_done=0, stage_total=2000)
    stage("loading data", stage_done=845, stage_total=2000)
    while not stopped and not (job_dir / "release").exists():  # Service.release
        time.sleep(0.05)
    if not stopped:  # then at 1999 of 2000 (99.95%, a tenth rounded up: 100.0), till again
        (job_dir / "release").unlink()
        stage("loading data", stage_done=1999, stage_total=2000)
    while not stopped and not (job_dir / "release").exists():
        time.sleep(0.05)
    if not stopped:
        stage("loading data", stage_done=2000, stage_total=2000)
        stage("building the model")
    while not stopped:
        time.sleep(0.05)
    end("cancelled", 3)
progress(event="start", step=0, total=10, phase="starting")
if behaviour == "quick":
    end("succeeded", 0)
elif behaviour == "fail":  # the trainer's failure: exit 1, outcome failed
    end("failed", 1)
elif behaviour == "chatty":  # a log of 200 long lines (its worker.log), then runs on
    for i in range(200):
        print(f"line {i:03d}: " + "words that wrap on a narrow screen " * 3, flush=True)
elif behaviour == "finish":  # as the trainer ends an attempt resumed at its checkpoint's step
    progress(event="end", step=10, total=10, outcome="succeeded", phase="done")
    message = "Finished at step 10, its checkpoint: no step trained."
    result = {"outcome": "succeeded", "step": 10, "total": 10, "message": message}
    (job_dir / "result.json").write_text(json.dumps(result))
    sys.exit(0)
elif behaviour == "points":  # a few metric points, then done
    for step in (1, 2, 3):
        progress(event="progress", step=step, total=3, loss=1 / step)
    end("succeeded", 0)
elif behaviour == "evaluates":  # a training batch's numbers; its eval once released
    progress(event="progress", step=1, total=10, loss=0.05, accuracy=0.984)
    while not stopped and not (job_dir / "release").exists():  # Service.release
        time.sleep(0.05)
    if not stopped:
        progress(event="eval", step=2, eval_loss=0.2, eval_accuracy=0.949, eval_examples=1280)
elif behaviour == "poison":  # a step too large for a SQLite integer
    progress(event="progress", step=1, total=10, loss=0.5)
    progress(event="progress", step=2**70, total=10, loss=0.25)
elif behaviour in ("linger", "hang"):  # done, and then slow to exit, or never exits
    progress(event="end", step=10, total=10, outcome="succeeded", phase="done")
    (job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "done"}))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # "linger" exits once the test releases it (Service.release), not after a fixed time
    # that a busy host could use up before the test has looked; 120 s at most.
    until = time.time() + (120 if behaviour == "linger" else 3600)
    while time.time() < until and not (job_dir / "release").exists():
        time.sleep(0.05)
    sys.exit(0)
elif behaviour == "leak":  # worker.log becomes a link to a file beside the data dir
    log = job_dir / "worker.log"
    log.unlink()
    log.symlink_to(job_dir.parents[2] / "outside.txt")
    end("failed", 1)
while not stopped:
    time.sleep(0.05)
end("cancelled", 3)
"""


def stand_in_head(total: int, imports: str = "") -> str:
    """The opening of a stand-in worker's source: `job_dir` and its spec's `name` from its
    command line, `stopped` set by a SIGTERM (the worker decides when to stop, as the
    trainer does), and `progress(**line)`, a line of progress.jsonl of `total` steps;
    `imports`: its own import lines, after the shared ones."""
    return (
        "import json, signal, sys, time\n"
        "from pathlib import Path\n"
        f"{imports}\n"
        'job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])\n'
        'name = json.loads((job_dir / "spec.json").read_text())["name"]\n'
        "stopped = []\n"
        "signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))\n"
        "\n\n"
        "def progress(**line):\n"
        '    with open(job_dir / "progress.jsonl", "a") as f:\n'
        f'        f.write(json.dumps({{"time": time.time(), "total": {total}, **line}}) + "\\n")\n'
    )


def worker_env(directory: Path, module: str, source: str) -> dict[str, str]:
    """Service settings that run `source` (written into `directory` as `module`) as the
    worker: a stand-in that writes what a test needs the trainer to have written."""
    (directory / f"{module}.py").write_text(source)
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    return {"TOWERBOARD_WORKER_MODULE": module, "PYTHONPATH": path}


def fake_worker_env(directory: Path) -> dict[str, str]:
    """Service settings that run FAKE_WORKER (written into `directory`) as the worker."""
    return worker_env(directory, "fake_worker", FAKE_WORKER)


@contextlib.contextmanager
def stand_in_service(
    folder: Path, worker: tuple[str, str] = ("fake_worker", FAKE_WORKER), **env: str
) -> Iterator[Service]:
    """A started service whose workers are `worker` (module name, source; written into
    `folder`; FAKE_WORKER unless given), its data dir in `folder` and `env` among its
    settings; closed afterwards."""
    service = Service(folder / "data", {**env, **worker_env(folder, *worker)})
    service.start()
    try:
        yield service
    finally:
        service.close()


# A stand-in worker, `python -m stepping_worker run --job-dir DIR`, for tests of what the
# service does around a running worker (following it, adopting it after a restart) rather
# than of training: it takes a step every 50 ms from its first line, says so, and reports a
# checkpoint every 5 steps (no files: only the progress line), until SIGTERM stops it as the
# trainer stops (exit 3, outcome cancelled). A real worker spent seconds of TensorFlow's
# start-up before its first step.
STEPPING_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
step = 0


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "step": step, "total": 10**7, **line}) + "\\n")


progress(event="start", phase="starting")
while not stopped:
    time.sleep(0.05)
    step += 1
    progress(event="progress", phase="training", loss=1 / step)
    if step % 5 == 0:
        progress(event="checkpoint", phase="training", checkpoint=f"checkpoints/ckpt-{step}")
result = {"outcome": "cancelled", "message": f"Stopped by SIGTERM at step {step}.", "step": step}
(job_dir / "result.json").write_text(json.dumps(result))
sys.exit(3)
"""


def stepping_worker_env(directory: Path) -> dict[str, str]:
    """Service settings that run STEPPING_WORKER (written into `directory`) as the worker."""
    return worker_env(directory, "stepping_worker", STEPPING_WORKER)


def queue_in_bulk(store: Path, spec: dict[str, Any], count: int, *, priority: int = 0) -> None:
    """`count` queued jobs of `spec` (ids q000000000, q000000001, ...), written straight into
    the store's file in one transaction: thousands through the API take a request each."""
    now = time.time()
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        db.executemany(
            "INSERT INTO jobs (id, name, state, priority, spec, created_at, updated_at)"
            " VALUES (?, ?, 'queued', ?, ?, ?, ?)",
            [
                (f"q{n:09d}", spec["name"], priority, json.dumps(spec), now, now)
                for n in range(count)
            ],
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def catches_sigterm(pid: int) -> bool:
    """Whether the process has its own SIGTERM handler yet (`SigCgt` in /proc/PID/status).
    A worker sets one in its first lines; a SIGTERM before then (the interpreter's first
    tens of milliseconds, longer on a busy host) ends it, as it would any process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def wait_catching_sigterm(pids: Callable[[], list[int]], timeout: float = 60.0) -> None:
    """Wait until one of the processes `pids()` gives catches SIGTERM."""
    deadline = time.monotonic() + timeout
    while not any(catches_sigterm(pid) for pid in pids()):
        assert time.monotonic() < deadline, "no process caught SIGTERM in time"
        time.sleep(0.005)


def processes_under(data_dir: Path) -> list[int]:
    """Pids whose command line names something under `data_dir` (workers, TensorBoard)."""
    marker = os.fsencode(str(data_dir))
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_processes_under(data_dir: Path, *, quiet_looks: int = 2, timeout: float = 10.0) -> None:
    """SIGKILL the process groups of `processes_under(data_dir)` until `quiet_looks` looks
    0.1 s apart find none. After a service was SIGKILLed one look is not enough: a process
    between its fork and its exec shows its parent's command line in its parent's group,
    and one in its exec shows none for a moment."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        left = processes_under(data_dir)
        quiet = 0 if left else quiet + 1
        if quiet >= quiet_looks:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        time.sleep(0.1)


class Service:
    """A `towerboard serve` subprocess and an HTTP client for it."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "TOWERBOARD_POLL_SECONDS": "0.1",
            "TOWERBOARD_CANCEL_GRACE_SECONDS": "60",
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.token = self.env.get("TOWERBOARD_TOKEN")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        # The CLI's transport: a GET sent as the service closes an idle connection is sent
        # again (a test that waits on the browser for a minute met that race).
        self.client = httpx.Client(
            base_url=self.base_url,
            timeout=60.0,
            headers=headers,
            transport=ReusedConnectionRetry(),
        )

    @property
    def log(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-serve.log"

    def start(self) -> float:
        """Start the service and wait for /healthz; returns the seconds that took."""
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port),
                 "--data-dir", str(self.data_dir), "--no-access-log"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return time.monotonic() - started
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited: {self.log.read_text()[-3000:]}")
            if time.monotonic() - started > 30:
                raise RuntimeError(f"service did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the service (its workers live on in their own sessions)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the service; SIGKILL it after `timeout` seconds."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        """Stop the service, then every worker and TensorBoard it left."""
        self.stop()
        self.client.close()
        kill_processes_under(self.data_dir, quiet_looks=1)  # stopped: it spawns no more

    # --- helpers over the API --------------------------------------------------------

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/api/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        job: dict[str, Any] = response.json()
        return job

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        return job

    def wait_for(
        self, job_id: str, predicate: Any, *, timeout: float = WORKER_WAIT, what: str = ""
    ) -> dict[str, Any]:
        """Poll the job until `predicate(job)` holds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if predicate(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or predicate}: {job}")
            time.sleep(0.1)

    def wait_state(self, job_id: str, *states: str, timeout: float = WORKER_WAIT) -> dict[str, Any]:
        return self.wait_for(
            job_id, lambda job: job["state"] in states, timeout=timeout, what=f"state {states}"
        )

    def release(self, job_id: str) -> None:
        """Let the job's "linger" stand-in exit, its "loading" one load on, or its
        "evaluates" one write its eval."""
        (self.data_dir / "runs" / job_id / "release").touch()

    def wait_exited(self, job_id: str, timeout: float = 60.0) -> None:
        """Wait until the service has seen the ended job's worker exit (the store's
        `exiting` is cleared): a worker outlives its result.json by TensorFlow's teardown,
        seconds on a busy host, and until then a DELETE or resume gets a 409."""
        store = self.data_dir / "towerboard.db"
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
                (exiting,) = db.execute(
                    "SELECT exiting FROM jobs WHERE id = ?", (job_id,)
                ).fetchone()
            if exiting is None:
                return
            assert time.monotonic() < deadline, f"job {job_id}'s worker still exiting: {exiting}"
            time.sleep(0.05)

    def wait_reported(self, job_id: str, timeout: float = WORKER_WAIT) -> dict[str, Any]:
        """Wait until the job's worker has written its first progress line (a step): from
        its start until then the job shows only the phase `preparing`. For a first
        attempt only: a later one shows the step its job had reached from the start."""
        return self.wait_for(
            job_id,
            lambda job: (job["progress"] or {}).get("step") is not None,
            timeout=timeout,
            what="the worker's first report",
        )

    def wait_checkpoint(self, job_id: str, timeout: float = WORKER_WAIT) -> dict[str, Any]:
        """Wait until a running job has written a checkpoint (so it is past TF's start)."""
        return self.wait_for(
            job_id,
            lambda job: (job["progress"] or {}).get("checkpoint") is not None,
            timeout=timeout,
            what="a checkpoint",
        )
