"""Worker processes: start one for a job, find it again after a restart, signal it, reap it.

A worker is `python -m trainer run --job-dir runs/<id>`, started under `nice` so the API
stays quick while training uses every core, with stdout and stderr appended to the run's
worker.log. It leads its own session, so Ctrl-C or a signal to the service does not reach it
and it outlives a service restart. Linux's autogroup scheduler shares CPU between sessions
first and applies a process's nice only inside its session, so the session itself is niced
too (/proc/<pid>/autogroup); otherwise the worker would compete with the service as an
equal. After a restart, a worker is only ours again if it is the same process (see
`service.processes`): same pid, same start time, its job dir in its argv. A service that
died between starting a worker and storing its pid finds it by that argv instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.processes import find_by_argv, is_same_process, start_time
from service.runfiles import inside
from trainer import datafiles
from trainer.rundir import RunDir, write_json_atomic

log = logging.getLogger(__name__)

# An interpreter as far as a module's syntax goes: its implementation ("cpython") and its
# major and minor version. Two of the same compile the same source alike.
PythonVersion = tuple[str, int, int]

# The project root, so `python -m trainer` imports this checkout's trainer from anywhere.
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended: an exit code, a signal, or neither when it was adopted (not our
    child, so its status cannot be read)."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_returncode(cls, returncode: int) -> WorkerExit:
        return cls(signal=-returncode) if returncode < 0 else cls(code=returncode)


def is_worker_alive(pid: int, started: int | None, run_dir: Path) -> bool:
    """True when `pid` is still the worker started for `run_dir` (not a reused pid)."""
    return is_same_process(pid, started, str(run_dir))


@dataclass
class Worker:
    """A running worker the supervisor watches."""

    job_id: str
    run: RunDir
    pid: int
    started: int | None
    process: subprocess.Popen[bytes] | None  # None when adopted after a restart
    term_sent_at: float | None = None
    killed: bool = False

    def poll(self) -> WorkerExit | None:
        """How the worker ended, or None while it runs."""
        if self.process is not None:
            returncode = self.process.poll()
            return None if returncode is None else WorkerExit.from_returncode(returncode)
        if is_worker_alive(self.pid, self.started, self.run.root):
            return None
        return WorkerExit()

    def terminate(self) -> None:
        """SIGTERM: the trainer finishes its step, writes a checkpoint and exits 3."""
        self.term_sent_at = time.monotonic()
        self._signal(signal.SIGTERM, group=False)

    def kill(self) -> None:
        """SIGKILL the worker and anything it started."""
        self.killed = True
        self._signal(signal.SIGKILL, group=True)

    def _signal(self, signum: signal.Signals, *, group: bool) -> None:
        if self.process is None and not is_worker_alive(self.pid, self.started, self.run.root):
            return  # never signal a pid that is no longer our worker
        if self.process is not None and self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, signum)  # the worker leads its own session
            else:
                os.kill(self.pid, signum)


def worker_pythonpath() -> list[str]:
    """A worker's PYTHONPATH: this project first, then the service's own PYTHONPATH."""
    own = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return [str(_PROJECT_ROOT), *filter(None, own)]


def child_environment(**changes: str | None) -> dict[str, str]:
    """The environment of a Python process the service starts (a worker, TensorBoard, the
    check of TOWERBOARD_PYTHON): the service's own with `changes` (None unsets one),
    less the service's API token, importing this project first and never from its
    working directory."""
    env = dict(os.environ)
    # No child needs the token, and any could show it: a custom model's code runs in the
    # worker, and whatever it prints (an environment dump on error) lands in worker.log,
    # which the API serves and a failed job's error quotes; TensorBoard is behind the
    # proxy, and anything it loads (a plugin) could read its environment.
    env.pop("TOWERBOARD_TOKEN", None)
    # The trainer, and TensorBoard's main (`service.guarded_tensorboard`), are found so:
    # an interpreter of another environment (TOWERBOARD_PYTHON) has the project on its
    # path only so.
    env["PYTHONPATH"] = os.pathsep.join(worker_pythonpath())
    # `python -m` (and `-c`) puts its working directory first on sys.path, where a module
    # would shadow any of its name (numpy, the trainer itself, tensorboard): a worker's is
    # its run directory, and a module there would pass admission's check unseen;
    # TensorBoard's, and the check's, is the service's own, wherever it was started (a
    # home folder, a checkout). Each imports from its PYTHONPATH and the installed
    # packages alone (Python 3.11 on; an older TOWERBOARD_PYTHON ignores the variable).
    env["PYTHONSAFEPATH"] = "1"
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# Run by TOWERBOARD_PYTHON at start: what it lacks to run workers and TensorBoard. A
# module is found, not imported (a package's own __init__ is, to find its __main__).
_PROBE = """\
import importlib.util, json, sys
def spec_of(name):
    try:
        return importlib.util.find_spec(name)
    except Exception:  # a parent package that fails to import
        return None
module = sys.argv[1]
spec = spec_of(module)
runnable = spec is not None and (
    spec.submodule_search_locations is None or spec_of(module + ".__main__") is not None)
print(json.dumps({"version": list(sys.version_info[:2]), "runnable": runnable,
                  "implementation": sys.implementation.name,
                  "missing": [n for n in ("tensorflow", "tensorboard") if spec_of(n) is None]}))
"""


def this_python() -> PythonVersion:
    """The service's own interpreter, as the check of TOWERBOARD_PYTHON says that one."""
    return (sys.implementation.name, sys.version_info.major, sys.version_info.minor)


@dataclass(frozen=True)
class WorkerCommand:
    """What the check of the worker command at start found: the interpreter's `python`
    (None when it did not run the check), and (setting, problem) for each reason it could
    not run a job here."""

    python: PythonVersion | None
    problems: list[tuple[str, str]]


def check_worker_command(python: str, module: str) -> WorkerCommand:
    """Whether `python -m module` can run a job here, and which Python `python` is.

    Checked at start: otherwise every job failed long after ("exited with code 1", a
    ModuleNotFoundError in its log) and every TensorBoard start with it. About 0.04 s.
    """
    env = child_environment()

    def not_python(why: str) -> WorkerCommand:
        problem = f"Expected a Python 3.11+ interpreter. Received: {python!r}, {why}"
        return WorkerCommand(None, [("TOWERBOARD_PYTHON", problem)])

    try:
        probe = subprocess.run(
            [python, "-c", _PROBE, module],
            capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return not_python(f"which could not be run ({error})")
    try:
        answer = json.loads(probe.stdout.strip().splitlines()[-1])
        major, minor = answer["version"]
        found: PythonVersion = (str(answer["implementation"]), int(major), int(minor))
    except (ValueError, IndexError, KeyError, TypeError):
        said = (probe.stderr or probe.stdout).strip().splitlines()[-1:]
        return not_python(f"which did not run Python's check (exit {probe.returncode}"
                          f"{': ' + said[0] if said else ''})")  # fmt: skip
    problems = []
    if found[1:] < (3, 11):
        problems.append((
            "TOWERBOARD_PYTHON",
            f"Expected Python 3.11 or newer. Received: {python!r}, Python {found[1]}.{found[2]}",
        ))  # fmt: skip
    if answer["missing"]:
        problems.append((
            "TOWERBOARD_PYTHON",
            "Expected an interpreter with TensorFlow and TensorBoard installed. Received: "
            f"{python!r}, which lacks {' and '.join(answer['missing'])}",
        ))  # fmt: skip
    if not answer["runnable"]:
        problems.append((
            "TOWERBOARD_WORKER_MODULE",
            f"Expected a module that TOWERBOARD_PYTHON can run as `python -m MODULE` (found "
            f"on its sys.path or PYTHONPATH). Received: {module!r}, not found",
        ))  # fmt: skip
    return WorkerCommand(found, problems)


def spawn_worker(
    *,
    job_id: str,
    spec: dict[str, Any],
    run: RunDir,
    python: str,
    module: str,
    nice: int,
    cuda_visible_devices: str,
    attempt: int,
    data_roots: list[Path],
) -> Worker:
    """Write spec.json and start the worker process for one attempt of a job."""
    run.root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run.spec, spec)
    # A result.json left by an earlier attempt would be read as this attempt's.
    run.result.unlink(missing_ok=True)
    command = [python, "-m", module, "run", "--job-dir", str(run.root)]
    if nice > 0:
        command = ["nice", "-n", str(nice), *command]
    env = child_environment(
        # A job the service runs trains on this host's devices alone. A TF_CONFIG left in
        # the service's environment (a shell that also launched a multi-worker job) would
        # make every worker wait for a cluster that is not coming (trainer/cluster.py).
        TF_CONFIG=None,
        CUDA_VISIBLE_DEVICES=cuda_visible_devices,
        PYTHONUNBUFFERED="1",
        TOWERBOARD_JOB_ID=job_id,
        # Checked at submit, and by the worker again as it starts (trainer/datafiles.py):
        # a link put in a data folder while the job was queued could lead out of them.
        **{datafiles.ROOTS_ENV: datafiles.roots_to_environ(data_roots)},
    )
    with open(run.log, "ab") as log_file:
        log_file.write(
            _banner(
                f"attempt {attempt} of job {job_id} starting at {_now()},"
                f" CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}"
            )
        )
        log_file.flush()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=run.root,
            env=env,
            start_new_session=True,
        )
    if nice > 0:
        _nice_session(process.pid, nice)
    log.info("Started worker pid %d for job %s (attempt %d)", process.pid, job_id, attempt)
    return Worker(
        job_id=job_id,
        run=run,
        pid=process.pid,
        started=start_time(process.pid),
        process=process,
    )


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def _banner(text: str) -> bytes:
    """A line of the service's own in a job's worker.log, told apart from the worker's."""
    return f"--- towerboard: {text} ---\n".encode()


def log_requeue(run: RunDir, job_id: str, attempt: int, why: str) -> None:
    """Say in the job's worker.log why `attempt` ended and the job was queued again (a
    worker killed, a service that stopped it as it shut down): the log read on from the
    attempt's last line to the next one's start, and only the service's own log, which a
    user of the API may never see, said why. Not through a link a custom model put there
    (see `inside`), and not at all when the log cannot be written: the requeue stands."""
    if not inside(run.root, run.log):
        return
    try:
        with open(run.log, "ab") as log_file:
            log_file.write(
                _banner(
                    f"attempt {attempt} of job {job_id} ended at {_now()}: {why}; queued again "
                    f"as attempt {attempt + 1} to resume from its latest checkpoint"
                )
            )
    except OSError as error:
        log.warning("Job %s: could not write to its worker.log: %s", job_id, error)


def _nice_session(pid: int, nice: int) -> None:
    """Lower the CPU share of the worker's session (its autogroup) below the service's."""
    # Popen returns after the child's exec, so it already leads its own session; check
    # anyway, since this would otherwise lower the service's own share.
    if os.getsid(pid) != pid or os.getsid(pid) == os.getsid(0):
        return
    # Without autogroup in the kernel there is no such file, and plain nice is enough.
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def adopt_worker(
    *, job_id: str, run: RunDir, pid: int | None, started: int | None
) -> Worker | None:
    """The worker a previous service started for this job, if it is still running.

    Without a pid (the service died after starting the worker, before storing its pid) it
    is the one process whose argv names this job dir after `--job-dir`.
    """
    if pid is None:
        found = find_by_argv("--job-dir", str(run.root))
        if len(found) != 1:
            return None
        pid, started = found[0], start_time(found[0])
    if not is_worker_alive(pid, started, run.root):
        return None
    log.info("Adopted running worker pid %d for job %s", pid, job_id)
    return Worker(job_id=job_id, run=run, pid=pid, started=started, process=None)
