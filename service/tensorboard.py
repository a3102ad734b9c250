"""The one TensorBoard the service runs for its users, as a subprocess on loopback.

TensorBoard reads a "view" logdir that mirrors the shown jobs' `tb/` folders with links,
a folder a job named by the job's name and id (`view_name`):

    <data_dir>/tensorboard/logdir/<name> · <job_id>/train   -> runs/<job_id>/tb/train
    <data_dir>/tensorboard/logdir/<name> · <job_id>/plugins/profile
                                                            -> runs/<job_id>/tb/plugins/profile

so its runs are named `mnist-cnn · 3fkkyci9jr/train`, `mnist-cnn · 3fkkyci9jr/eval`: the
run selector, which sorts runs by name, lists jobs by what their users called them (those
of one name together), and the id keeps each job's runs apart from another's of the same
name (a job's run directory is never renamed: only the view is). Real folders down to
`plugins/` are needed because the profile plugin neither follows a linked folder while it
searches nor understands `--logdir_spec`. The mirror is refreshed every few seconds, so folders a
worker creates later (and, when every job is shown, jobs submitted later) appear. The
view's file work (most of a second over 2,000 jobs) runs in threads, each under the
launcher's lock: a start that restarts TensorBoard makes the new view beside the old one
(`logdir.next`) while the running TensorBoard serves on, and renames it into place once
that one has stopped. It serves under `--path_prefix /tensorboard`, which the service
proxies (`service.proxy`).
The service never imports TensorFlow or TensorBoard itself; this only starts a process.
It is stopped after `tb_idle_minutes` without a proxied request (counted from when it is
ready, never while it starts), and a TensorBoard left by a killed service is stopped at
the next start. One that exits on its own (a crash, a kill) is noticed at the next look
(status, proxy, /metrics, or the watch loop every few seconds): it is reaped, reported
"stopped", and why is kept in `last_error`.

It is shared, so a start never takes a job away from the running one without saying so:
a start over a superset of what it shows (or over every job) adds the jobs to it in
place, with no restart, so tabs already open on it carry on; `merge` asks for that
union whatever the selection; only a start that leaves out jobs it shows restarts it, and
the new instance keeps what it `replaced` (its jobs, pid, start and last use) for the
start's answer and the status to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from service.guard import Guard
from service.guarded_tensorboard import SECRET_ENV, SECRET_HEADER
from service.processes import is_same_process, signal_name, start_time
from service.safename import safe_name
from service.settings import Settings
from service.upstream import Upstream
from service.workers import child_environment
from trainer.rundir import json_object, write_json_atomic

log = logging.getLogger(__name__)

PATH_PREFIX = "/tensorboard"
_READY_TIMEOUT = 120.0  # TensorBoard imports TensorFlow: tens of seconds on a busy host
_STOP_TIMEOUT = 10.0
_MIRROR_SECONDS = 3.0
_RELOAD_SECONDS = 5  # TensorBoard's --reload_interval: how soon it finds added runs
# A start that adds jobs in place answers once TensorBoard lists their runs (two reloads
# and some), so a tab opened on its answer shows them; past this it answers anyway.
_ADDED_RUNS_TIMEOUT = 3 * _RELOAD_SECONDS


# tensorboard.log, kept across starts (the output of one that crashed is there to read,
# as `last_error` says), grew for the service's whole life: each start adds its imports'
# warnings (some 2 KB) and each deleted job it showed two lines. Past this size a start
# moves it to tensorboard.log.1, replacing the one before: at most twice this on disk.
LOG_ROTATE_BYTES = 1024 * 1024


def _rotated(log_path: Path) -> Path:
    """`log_path`, moved aside first (to `<name>.1`) when it has reached LOG_ROTATE_BYTES.

    A link is left as it is: someone pointed the log elsewhere and keeps it there; moved,
    the link went to `<name>.1` and the output to a new file here, without a word. A move
    that fails is logged, and the log appended to as before: a TensorBoard that did not
    start for it was a worse loss than a log that grows."""
    try:
        if not log_path.is_symlink() and log_path.stat().st_size >= LOG_ROTATE_BYTES:
            os.replace(log_path, log_path.with_name(f"{log_path.name}.1"))
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning(
            "%s not moved aside at %d bytes, appended to: %s", log_path, LOG_ROTATE_BYTES, error
        )
    return log_path


def _link(link: Path, target: Path) -> None:
    with contextlib.suppress(FileExistsError):
        link.symlink_to(target, target_is_directory=True)


# A job's folder in the view: its name made a folder name, this, then its id. The name
# first: the run selector sorts runs by name, and a user looks for a job by its name. The id
# after the last separator, so it is read back from a folder (`job_of`) whatever the name.
NAME_SEPARATOR = " · "


def view_name(job_id: str, name: str | None) -> str:
    """The folder of job `job_id`, named `name`, in the view: `<name> · <job_id>`, or
    the id alone where the job has no name (its spec unreadable) or nothing of it is left
    (`safe_name`)."""
    safe = safe_name(name) if name else ""
    return f"{safe}{NAME_SEPARATOR}{job_id}" if safe else job_id


def job_of(folder: str) -> str:
    """The job id of a folder of the view (one `view_name` made, or an older version's,
    named by the id alone)."""
    return folder.rpartition(NAME_SEPARATOR)[2]


# Each runs folder's jobs' folders in the view: job id -> `view_name`. A job's name never
# changes, so its spec.json is read once (a custom model's `params` can make it a MiB),
# not at each refresh of a job that writes; a job deleted is forgotten.
_FOLDERS: dict[Path, dict[str, str]] = {}


def view_folder(runs_dir: Path, job_id: str) -> str:
    """The folder of job `job_id` (its run directory in `runs_dir`) in the view, named
    by its spec.json's `name`. A spec not there (yet) is read again next time."""
    folders = _FOLDERS.setdefault(runs_dir, {})
    if (folder := folders.get(job_id)) is not None:
        return folder
    try:
        raw = (runs_dir / job_id / "spec.json").read_bytes()
    except OSError:
        return job_id
    spec = json_object(raw) or {}
    name = spec.get("name")
    folders[job_id] = folder = view_name(job_id, name if isinstance(name, str) else None)
    return folder


# What each view logdir holds: its path -> (its inode, job id -> the modification times
# of the job's tb/ and tb/plugins/ when they were linked, and the folder they were linked
# into). A job whose two folders have not changed since has nothing new to link: two
# stats, where linking it again (a scan, a mkdir and a link tried for each folder) took
# 1.6-3 s a pass over 20,000 jobs, a pass every 3 s while TensorBoard runs, the
# launcher's lock held throughout. The inode tells a view made again at that path (a
# restart's, renamed into place) from the one linked.
_LINKED: dict[Path, tuple[int, dict[str, tuple[tuple[int, int], str]]]] = {}
# A folder changed this recently may change again within its clock's tick (a few ms),
# leaving its time as it was: it is linked again at the next pass, not trusted.
_SETTLED_NS = 2_000_000_000


def _stamp(source: str) -> tuple[int, int] | None:
    """The modification times of a job's tb/ and tb/plugins/ (0: none); None when it
    has no tb/ (not started yet, or deleted)."""
    try:
        folder = os.stat(source).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        plugins = os.stat(f"{source}/plugins").st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        plugins = 0
    return folder, plugins


def mirror_logdir(logdir: Path, runs_dir: Path, job_ids: tuple[str, ...] | None) -> None:
    """Bring the view logdir up to date with the jobs' tb/ folders (None: every job)."""
    with os.scandir(runs_dir) as found:
        runs = {e.name for e in found if e.is_dir() and not e.name.startswith(".")}
    named = _FOLDERS.setdefault(runs_dir, {})
    for job_id in named.keys() - runs:  # deleted: forgotten
        del named[job_id]
    inode = os.stat(logdir).st_ino
    known = _LINKED.get(logdir)
    linked = known[1] if known and known[0] == inode else {}
    _LINKED[logdir] = (inode, linked)
    owners = _drop_deleted(logdir, runs)
    if len(owners) != len(set(owners.values())):  # a job with two folders (`_drop_others`)
        by_job: dict[str, list[str]] = {}
        for folder, job_id in owners.items():
            by_job.setdefault(job_id, []).append(folder)
        for job_id, folders in by_job.items():
            if len(folders) > 1:
                _drop_others(logdir, owners, folders, view_folder(runs_dir, job_id))
    for job_id in [job for job, (_, folder) in linked.items() if folder not in owners]:
        del linked[job_id]  # deleted, or its folder in the view gone
    for job_id in sorted(runs) if job_ids is None else job_ids:
        source = f"{runs_dir}/{job_id}/tb"  # a str: a Path each cost 0.05 s a pass of 20,000
        stamp = _stamp(source)
        was = linked.get(job_id)
        if stamp is None or (was is not None and was[0] == stamp):
            continue  # not started yet, deleted, or nothing new since it was linked
        try:
            entries = list(os.scandir(source))
        except (FileNotFoundError, NotADirectoryError):
            continue
        folder = view_folder(runs_dir, job_id)
        view = logdir / folder
        view.mkdir(exist_ok=True)
        for entry in entries:
            if entry.name == "plugins" and entry.is_dir(follow_symlinks=False):
                (view / "plugins").mkdir(exist_ok=True)
                # Gone meanwhile when a delete moves the run directory away: nothing to link.
                for plugin in _entries(Path(entry.path)):
                    _link(view / "plugins" / plugin.name, Path(plugin.path))
            else:
                _link(view / entry.name, Path(entry.path))
        # The folder it had, when named otherwise: by its id alone (an older version's, or
        # made while its spec.json could not be read), or as it was last linked.
        _drop_others(logdir, owners, [job_id, *([was[1]] if was else [])], folder)
        if time.time_ns() - max(stamp) > _SETTLED_NS:
            linked[job_id] = (stamp, folder)


def _drop_others(logdir: Path, owners: dict[str, str], folders: list[str], folder: str) -> None:
    """Take those of a job's `folders` that the view has (`owners`), other than `folder`,
    its own, out of it: TensorBoard would list the job's runs twice, once under each."""
    for other in folders:
        if other != folder and other in owners:
            shutil.rmtree(logdir / other)
            del owners[other]


def _drop_deleted(logdir: Path, runs: set[str]) -> dict[str, str]:
    """Take the view of every deleted job (its run directory gone: not in `runs`) out of
    the logdir: its links lead nowhere, and TensorBoard would list its runs on as empty.
    The folders the view has then, each with its job's id."""
    with os.scandir(logdir) as views:
        owners = {
            v.name: v.name.rpartition(NAME_SEPARATOR)[2]  # `job_of`, inline: 20,000 calls
            for v in views
            if v.is_dir(follow_symlinks=False)
        }
    for folder in [folder for folder, job_id in owners.items() if job_id not in runs]:
        shutil.rmtree(logdir / folder)  # links and the plugins/ folder: never what they lead to
        del owners[folder]
    return owners


def includes(selection: tuple[str, ...] | None, shown: tuple[str, ...] | None) -> bool:
    """Whether `selection` holds every job of `shown` (None: every job, and jobs to come)."""
    if selection is None:
        return True
    return shown is not None and set(shown) <= set(selection)


@dataclass(frozen=True)
class ReplacedInstance:
    """The TensorBoard a start stopped because it showed jobs the new one leaves out."""

    job_ids: tuple[str, ...] | None
    pid: int
    started_at: float
    last_used_at: float


@dataclass(frozen=True)
class TensorBoardInstance:
    """A TensorBoard process the service started."""

    pid: int
    pid_started: int | None
    port: int
    logdir: Path
    job_ids: tuple[str, ...] | None  # None: every job, including jobs submitted later
    started_at: float
    replaced: ReplacedInstance | None = None
    # Sent with each request (`SECRET_HEADER`): TensorBoard refuses any request without it
    # (`service.guarded_tensorboard`), so its loopback port is no way round the proxy.
    secret: str = field(default="", repr=False)

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What each request to it must carry."""
        return {SECRET_HEADER: self.secret}


def _union(shown: tuple[str, ...] | None, wanted: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if shown is None or wanted is None:
        return None
    return tuple(sorted(set(shown) | set(wanted)))


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _command(python: str, logdir: Path, port: int) -> list[str]:
    """TensorBoard's command line: its guarded main over `logdir`, on loopback `port`."""
    return [
        python, "-m", "service.guarded_tensorboard",
        "--logdir", str(logdir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--path_prefix", PATH_PREFIX,
        "--reload_interval", str(_RELOAD_SECONDS),
        # TensorBoard keeps a random 1,000 points of each scalar series a run: a
        # 200,000-step job showed (and its CSV download held) 1,000 of 20,000. 5,000
        # costs some 100 KB a series in the shared TensorBoard.
        # Images: it keeps 10 steps of a tag a run (a seeded random pick, and the newest),
        # so a 50,000-step job's 100 image steps (`images_every` 500) showed as the same 10
        # at every load (its 4th, 21st, ... 68th and 100th), never step 1. 100 shows them
        # all; a longer job's are a random 100. A kept step is its PNGs (`max_images` a
        # tower): 2-7 KB at 28x28, 23 KB at 32x32x3, 1 MB at 224x224x3 (noise, PNG's
        # worst), so a 4-tower job of 224x224x3 inputs holds 420 MiB here, against 42 MiB
        # at 10 (docs/benchmarks.md). Histograms keep TensorBoard's 500: 250,000 steps at
        # `histograms_every` 500, some 1 KB a tag a step.
        "--samples_per_plugin", "scalars=5000,images=100",
        # Not the Rust data server (`auto` starts it where its package is installed):
        # it serves the runs over gRPC on a loopback port of its own with no auth,
        # which the service's secret cannot guard. The Python loader reads the same runs.
        "--load_fast", "false",
    ]  # fmt: skip


class StartOutcome(Enum):
    """What a start did: the route answers 201 for STARTED, 200 for the others."""

    STARTED = "started"  # a new process (none was up, or it replaced one)
    REUSED = "reused"  # already up over these jobs
    ADDED = "added"  # the jobs were added to the running one, in place


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
        upstream: Upstream,
        job_exists: Callable[[str], bool] = lambda job_id: False,
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._job_exists = job_exists
        self._home = settings.data_dir / "tensorboard"
        self._record = self._home / "instance.json"
        self._instance: TensorBoardInstance | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = asyncio.Event()
        self._ready_task: asyncio.Task[None] | None = None
        self._last_used = time.time()
        self.last_error: str | None = None
        self._lock = asyncio.Lock()
        self._guard = Guard(log)  # the watch loop's: an error is logged, the loop goes on

    # --- state -------------------------------------------------------------------------

    @property
    def instance(self) -> TensorBoardInstance | None:
        self._reap_if_dead()
        self._forget_deleted()
        return self._instance

    def _forget_deleted(self) -> None:
        """Take deleted jobs (their run directories gone) out of the running TensorBoard's
        selection: its status listed them on, and a start over the jobs left replaced it,
        warning that it had shown jobs that no longer exist. A queued job has no run
        directory yet either: the store says it is still there (asked only for a job
        without one), or the job would be dropped before it ever started."""
        current = self._instance
        if current is None or current.job_ids is None:
            return
        kept = tuple(
            job
            for job in current.job_ids
            if (self._settings.runs_dir / job).is_dir() or self._job_exists(job)
        )
        if kept != current.job_ids:
            self._instance = replace(current, job_ids=kept)

    @property
    def state(self) -> str:
        self._reap_if_dead()
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
        self._reap_if_dead()
        instance = self._instance
        if instance is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self._instance if self._ready.is_set() else None

    # --- start / stop ------------------------------------------------------------------

    async def start(
        self, job_ids: list[str] | None, *, merge: bool = False
    ) -> tuple[TensorBoardInstance, StartOutcome]:
        """Show `job_ids` (every job when None). A running TensorBoard that shows them is
        reused; one whose jobs they include (None includes all) gets them added in place;
        with `merge`, so does any running one (it then shows its jobs and these). Only a
        selection that leaves out jobs it shows restarts it, recording what it replaced."""
        selection = tuple(sorted(set(job_ids))) if job_ids is not None else None
        async with self._lock:
            last_used = self._last_used
            self.touch()
            self._forget_deleted()
            current = self._instance if self._alive() else None
            if current is not None and merge:
                selection = _union(current.job_ids, selection)
            if current is not None and includes(selection, current.job_ids):
                if selection == current.job_ids:
                    return current, StartOutcome.REUSED
                return await self._add_locked(current, selection), StartOutcome.ADDED
            instance = await self._restart_locked(current, selection, last_used)
            return instance, StartOutcome.STARTED

    async def _add_locked(
        self, current: TensorBoardInstance, selection: tuple[str, ...] | None
    ) -> TensorBoardInstance:
        """The running TensorBoard, showing `selection` (all it shows and more) from now:
        mirrored into its view, no restart. Under the lock."""
        added = replace(current, job_ids=selection)
        self._instance = added
        # Now, not at the watch loop's next pass: TensorBoard's next reload finds them.
        await asyncio.to_thread(mirror_logdir, added.logdir, self._settings.runs_dir, selection)
        log.info(
            "Added %s to TensorBoard pid %d",
            "every job" if selection is None else ", ".join(selection),
            added.pid,
        )
        return added

    async def _restart_locked(
        self,
        current: TensorBoardInstance | None,
        selection: tuple[str, ...] | None,
        last_used: float,
    ) -> TensorBoardInstance:
        """A new TensorBoard over `selection`, in place of `current` (if any, last used at
        `last_used`), which it records as `replaced`. Under the lock."""
        replaced = None
        if current is not None:
            replaced = ReplacedInstance(
                job_ids=current.job_ids,
                pid=current.pid,
                started_at=current.started_at,
                last_used_at=last_used,
            )
        # The file work in a thread (over 2,000 jobs, removing the old view and mirroring
        # the new took 0.3-0.7 s, every request of the service stalled that long on the
        # loop); the new view made beside the old one while the running TensorBoard goes
        # on serving, so no status in between says "stopped" (a page told so stops
        # following it, never told of the one that replaced it).
        view = await asyncio.to_thread(self._make_view, selection)
        await self._stop_locked()
        logdir, old = self._swap_view(view)
        instance = self._launch(logdir, selection, replaced)
        await asyncio.to_thread(shutil.rmtree, old, ignore_errors=True)
        return instance

    async def wait_runs_listed(self, instance: TensorBoardInstance, job_ids: list[str]) -> None:
        """Wait (a bounded time) until a running TensorBoard lists a run of each of
        `job_ids` that has one to list: it finds added jobs at its next reload."""
        runs_dir = self._settings.runs_dir
        pending = {
            folder
            for folder in (view_folder(runs_dir, job_id) for job_id in job_ids)
            if any(entry.name != "plugins" for entry in _entries(instance.logdir / folder))
        }
        if not pending or not self._ready.is_set():
            return  # nothing written yet, or it loads them as it starts
        deadline = time.monotonic() + _ADDED_RUNS_TIMEOUT
        url = f"{instance.upstream}{PATH_PREFIX}/data/runs"
        while pending and time.monotonic() < deadline:
            current = self._instance
            if current is None or current.pid != instance.pid:
                return  # stopped or replaced meanwhile: nothing to wait for
            with contextlib.suppress(*self._upstream.errors, ValueError):
                answer = await self._upstream.client.get(url, headers=instance.headers, timeout=2.0)
                runs = answer.json()
                if isinstance(runs, list):
                    pending = {
                        folder
                        for folder in pending
                        if not any(str(run).startswith(f"{folder}/") for run in runs)
                    }
            if pending:
                await asyncio.sleep(0.25)

    async def stop(self) -> bool:
        """Stop TensorBoard; False when none was running."""
        async with self._lock:
            return await self._stop_locked()

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _reap_if_dead(self) -> None:
        """Forget a TensorBoard that exited on its own: reap it and say why in `last_error`."""
        process, instance = self._process, self._instance
        if process is None or instance is None or self._lock.locked():
            return  # none running, or a start or stop under way settles it
        code = process.poll()  # reaps it: no zombie left behind
        if code is None:
            return
        self.last_error = self._exit_reason(instance.pid, code, ready=self._ready.is_set())
        log.error("%s", self.last_error)
        task, self._ready_task = self._ready_task, None
        if task is not None:
            task.cancel()
        self._forget_instance()

    def _forget_instance(self) -> None:
        """No TensorBoard from now on (its process has ended): wake anyone waiting for
        readiness, who finds no instance and gives up, and remove its record."""
        self._process, self._instance = None, None
        self._ready.set()
        self._ready = asyncio.Event()
        self._record.unlink(missing_ok=True)

    def _exit_reason(self, pid: int, code: int, *, ready: bool) -> str:
        how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
        when = "after it was ready" if ready else "while starting"
        return (
            f"TensorBoard (pid {pid}) {how} {when}; see "
            f"{self._settings.data_dir / 'tensorboard.log'}."
        )

    def _make_view(self, selection: tuple[str, ...] | None) -> Path:
        """A view logdir over `selection`, made apart from the one a running TensorBoard
        reads, for `_swap_view` to put in its place. Blocking file work: for a thread."""
        view, old = self._home / "logdir.next", self._home / "logdir.old"
        for left in (view, old):  # by a service killed while it started one
            shutil.rmtree(left, ignore_errors=True)
        view.mkdir(parents=True)
        # Made anew: what was linked into one before at this path (a start that failed) is
        # not in it, even should the folder have that one's inode again.
        _LINKED.pop(view, None)
        mirror_logdir(view, self._settings.runs_dir, selection)
        return view

    def _swap_view(self, view: Path) -> tuple[Path, Path]:
        """`view` made the logdir, once no TensorBoard reads the old one: two renames. The
        logdir, and where the old one now is, to be removed (in a thread)."""
        logdir, old = self._home / "logdir", self._home / "logdir.old"
        with contextlib.suppress(FileNotFoundError):  # the first start
            os.rename(logdir, old)
        os.rename(view, logdir)
        if (linked := _LINKED.pop(view, None)) is not None:
            _LINKED[logdir] = linked  # what the next refresh need not link again
        return logdir, old

    def _launch(
        self, logdir: Path, selection: tuple[str, ...] | None, replaced: ReplacedInstance | None
    ) -> TensorBoardInstance:
        """Start TensorBoard over `logdir`, the view of `selection` (`_make_view`)."""
        port, secret = _free_port(), secrets.token_urlsafe(32)
        self._process = self._spawn(_command(self._settings.python, logdir, port), secret)
        instance = TensorBoardInstance(
            pid=self._process.pid,
            pid_started=start_time(self._process.pid),
            port=port,
            logdir=logdir,
            job_ids=selection,
            started_at=time.time(),
            replaced=replaced,
            secret=secret,
        )
        self._instance = instance
        self.last_error = None
        self._ready = asyncio.Event()
        self._ready_task = asyncio.create_task(self._await_ready(instance))
        self._write_record(instance)
        log.info(
            "Started TensorBoard pid %d on 127.0.0.1:%d for %s%s",
            instance.pid,
            port,
            "every job" if selection is None else ", ".join(selection),
            "" if replaced is None else f", replacing pid {replaced.pid}",
        )
        return instance

    def _spawn(self, command: list[str], secret: str) -> subprocess.Popen[bytes]:
        """TensorBoard's process, in a session of its own, its output to tensorboard.log."""
        # Its main is this project's, found on PYTHONPATH as a worker finds the trainer.
        # PYTHONSAFEPATH too, as a worker's (it was left out here, an oversight): its
        # working directory is the service's, wherever that was started, and a module
        # there of a name TensorBoard imports (a checkout's `tensorboard/`, a stray
        # `numpy.py`) shadowed the real one; nothing it runs needs that folder.
        env = child_environment(
            CUDA_VISIBLE_DEVICES="",  # never hold GPU memory jobs need
            # In its environment, not its argv: only its own user can read that.
            **{SECRET_ENV: secret},
        )
        with open(_rotated(self._settings.data_dir / "tensorboard.log"), "ab") as log_file:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def _write_record(self, instance: TensorBoardInstance) -> None:
        """What the next service needs to stop this TensorBoard if this one is killed
        (`stop_orphan`): its pid, its start time and its logdir (in its argv)."""
        # Under a temporary name, then renamed: a record cut short (a full disk, a kill)
        # could not be read, and the TensorBoard it named was never stopped.
        write_json_atomic(
            self._record,
            {
                "pid": instance.pid,
                "pid_started": instance.pid_started,
                "logdir": str(instance.logdir),
            },
        )

    async def _await_ready(self, instance: TensorBoardInstance) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        probe = f"{instance.upstream}{PATH_PREFIX}/data/environment"
        while time.monotonic() < deadline:
            process = self._process
            if process is None:
                return  # stopped meanwhile; the stop cancels this task too
            code = process.poll()
            if code is not None:
                self.last_error = self._exit_reason(instance.pid, code, ready=False)
                break
            with contextlib.suppress(*self._upstream.errors):
                answer = await self._upstream.client.get(
                    probe, headers=instance.headers, timeout=2.0
                )
                if answer.status_code == 200:
                    # The idle clock starts now: on a busy host the start alone can take
                    # longer than a short idle timeout, and nobody has used it yet.
                    self.touch()
                    self._ready.set()
                    log.info("TensorBoard pid %d is ready", instance.pid)
                    return
            await asyncio.sleep(0.25)
        else:
            self.last_error = f"TensorBoard did not answer within {_READY_TIMEOUT:g} s."
        log.error("%s", self.last_error)
        async with self._lock:
            # By pid: a start that adds jobs swaps in a copy of the same instance.
            if self._instance is not None and self._instance.pid == instance.pid:
                await self._stop_locked(error=self.last_error)

    async def _stop_locked(self, error: str | None = None) -> bool:
        process, instance = self._process, self._instance
        task, self._ready_task = self._ready_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(process.wait), _STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait)
        self._forget_instance()  # only now "stopped": the process is gone
        if instance is None:
            return False
        log.info("Stopped TensorBoard pid %d%s", instance.pid, f" ({error})" if error else "")
        return True

    def stop_orphan(self) -> None:
        """Stop a TensorBoard that a killed service left running (found by its record)."""
        record = self._read_record()
        if record is None:
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

    def _read_record(self) -> dict[str, Any] | None:
        """The record a previous service left, or None: none, or none that names a process
        (not JSON, not an object, not readable). Read at start: what it holds must never
        keep the service from starting."""
        try:
            raw = self._record.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            log.warning("Ignoring %s, which cannot be read: %s", self._record, error)
            return None
        record = json_object(raw)
        if record is None:
            log.warning("Ignoring %s, which holds no JSON object", self._record)
        return record

    async def watch(self) -> None:
        """Run forever: keep the view logdir current, and stop TensorBoard once it has gone
        unused for the idle timeout. A pass that fails is logged (once while it fails
        alike) and the next one goes on: nobody awaits this task, and an error that ended
        it went unseen while TensorBoard was never again stopped for idleness."""
        while True:
            await asyncio.sleep(min(_MIRROR_SECONDS, max(0.5, self.idle_seconds / 4)))
            with self._guard("watch", "Watching TensorBoard"):
                await self._watch_once()

    async def _watch_once(self) -> None:
        """One pass of `watch`: reap, stop for idleness, or refresh the view."""
        instance = self.instance  # reaps one that exited on its own; asks the store
        if instance is None:
            return
        if not self._ready.is_set():
            return  # still starting: _await_ready stops it if it never answers
        if time.time() - self._last_used > self.idle_seconds:
            log.info(
                "TensorBoard unused for %g minutes; stopping it", self._settings.tb_idle_minutes
            )
            await self.stop()
            return
        # Under the lock, as every change to the view is: a refresh still running as a
        # start swapped the views would write the old selection's links into the new.
        async with self._lock:
            current = self._instance
            if current is None or current.pid != instance.pid:
                return  # stopped or replaced meanwhile
            with self._guard("refresh", "Refreshing TensorBoard's view"):
                await asyncio.to_thread(
                    mirror_logdir, current.logdir, self._settings.runs_dir, current.job_ids
                )
