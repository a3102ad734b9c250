"""The supervisor: one background thread that keeps the store true to the worker processes.

Every `poll_seconds` (or at once when woken by a submit, cancel or resume) it
  1. tails each running job's progress.jsonl into the store and out to event listeners,
  2. sends SIGTERM to workers whose job was cancelled, SIGKILL after the grace period,
  3. reaps workers that ended and records the final state (see `service.outcomes`),
     as soon as a worker has written its `end` progress line and then result.json, its
     last file (a result.json alone may be a custom model's, whose code runs in the run
     directory, while the job trains on): a worker's exit can take seconds more
     (TensorFlow's memory going back to the system, at a low CPU priority on a busy
     host; 30 s was seen), and the job is over. Its devices stay held
     until the process is gone, then an `exited` event says they are free; one that has
     not exited within the cancel grace period is killed,
  4. starts the queued jobs the scheduler places on free devices.

On start it recovers from a previous service: a living worker is adopted, a job whose
worker is gone is requeued (it resumes from its latest checkpoint), or finished from its
result.json when the worker ended while nobody watched (not one between the attempt's
start and end lines, where the trainer writes none: `_not_the_trainers`). A worker that checkpointed and
stopped on a SIGTERM that no cancel asked for (a service manager stopping the whole
control group, say) is requeued the same way, whether it ends while watched or not;
so is one killed by a signal (the OOM killer), up to `crash_retries` times a job.

One job's trouble never stops the pass: each job (its tail, cancel and reaping, and the
exit of its worker once the job has ended), and the scheduling, runs under its own guard
that logs an error once (again only when it changes) and retries on the next tick; so
does each job's recovery at start, which never stops the service starting. A worker is
watched from its spawn, before the store records it; a running job that nothing watches
(the store failed between marking it running and starting its worker) is taken over by
the next tick as at a start.
The in-memory progress tail moves on only after the store has taken the lines, so a
failed write is retried from the same offset and no line is lost; a job whose worker has
ended is settled only once its last lines are stored, so a failed read or write holds
its end back to a later tick rather than ending it without them; after
SETTLE_WAIT_SECONDS of refusals it ends without them (logged), so that a line the store
never takes cannot hold the job, its devices and the queue for good.

progress.jsonl is read a bounded part at a time (`read_progress_chunk`), each part stored
before the next is read: a file that grew by 50 MB while the service was down was read,
folded and stored at once (half a GB, and 18 s before the service answered). What a gone
worker wrote while nobody watched is read at start up to RECOVER_PARTS parts, and the job
ended or requeued there as before; past that, the ticks read on after the service has
started, and settle the job once all of it is stored. A pass that read a whole part runs
the next at once.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.devices import DevicePool
from service.events import JobEvent
from service.guard import Guard
from service.outcomes import crashed, final_state, interrupted
from service.progress import PROGRESS_READ_BYTES, fold_progress, read_progress_chunk, restarted_at
from service.runfiles import inside, tail_lines
from service.scheduler import next_placements
from service.settings import Settings
from service.store import PREPARING, JobRecord, JobState, JobStore
from service.workers import Worker, WorkerExit, adopt_worker, log_requeue, spawn_worker
from trainer.rundir import ENDED_PHASES, OUTCOME_EXIT_CODES, Outcome, RunDir, finite_json

log = logging.getLogger(__name__)

# Lines of worker.log kept with a failed job.
ERROR_LOG_LINES = 30
# Parts of a gone worker's progress.jsonl read before the service answers (4 MiB, some
# 16,000 lines: nine hours of reports, one every 2 s); the rest is read by the ticks.
RECOVER_PARTS = 4
# How long a job whose worker has ended waits for its last progress lines to be stored
# before it ends without them: a store that refuses them this long (a line it never takes)
# must not hold the job, its devices and the queue behind it for good.
SETTLE_WAIT_SECONDS = 60.0


@dataclass
class _Tail:
    """Where the supervisor is in one job's progress.jsonl, and what it folded so far."""

    offset: int
    progress: dict[str, Any] | None
    eval: dict[str, Any] | None
    # Whether the attempt's `start` and `end` lines have been read (stored, or refused by
    # the store): between the two the trainer writes no result.json (`_not_the_trainers`).
    started: bool = False
    ended: bool = False

    @classmethod
    def of(cls, job: JobRecord) -> _Tail:
        """Where the store left the job's tail: its attempt's phase says which of its
        `start` and `end` lines are in (`mark_running` sets `preparing`)."""
        phase = (job.progress or {}).get("phase")
        return cls(
            job.progress_offset,
            job.progress,
            job.eval,
            started=phase not in (None, PREPARING),
            ended=phase in ENDED_PHASES,
        )


@dataclass
class _Exiting:
    """A worker whose job is over (it wrote result.json, and the store took the job's end)
    and whose exit the store has not yet recorded: until it has, `devices` are listed as
    held (`held_after_their_jobs`) and a resume or delete of the job waits."""

    job_id: str
    # None: gone already as this service started, its exit not yet recorded (the store
    # refused it): its devices stay listed as held until it is, as the store says.
    worker: Worker | None
    devices: list[str]
    since: float


class Supervisor:
    def __init__(
        self,
        *,
        settings: Settings,
        store: JobStore,
        pool: DevicePool,
        publish: Callable[[JobEvent], None],
    ) -> None:
        self._settings = settings
        self._store = store
        self._pool = pool
        self._publish = publish
        self._workers: dict[str, Worker] = {}
        self._tails: dict[str, _Tail] = {}
        self._exiting: dict[str, _Exiting] = {}
        # Running jobs whose worker was gone at start: their progress is read on, then each
        # is ended or requeued (see `_settle_gone`).
        self._gone: set[str] = set()
        # Jobs whose worker has ended and whose last lines the store refused: since when
        # (`_stored_or_given_up`).
        self._unstored: dict[str, float] = {}
        # Jobs whose worker has ended: the space left on the disk of its run directory when
        # that was first seen (None: unknown), for a failure without a result to name a full
        # disk. Measured then: a store on that disk records the end only once there is
        # space again.
        self._free_at_end: dict[str, int | None] = {}
        # Each job's part of a tick ((job id, part)) and the scheduling (("", "schedule"))
        # run under it: an error is logged, once while it repeats (not five times a
        # second), and the next tick tries again.
        self._guard = Guard(log)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._starting = threading.Event()  # cleared: start no more workers (shutting down)
        self._starting.set()
        self._stopping_workers = threading.Event()  # set: stop_workers sent the SIGTERMs
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching. Workers keep running; the next service adopts them."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def stop_starting(self) -> None:
        """Start no more workers, but go on watching: the service is shutting down.

        A service manager stopping the whole control group SIGTERMs the workers with the
        service; while the server drains its connections they checkpoint, exit and are
        requeued, and starting them again then would only leave a worker behind it.
        """
        if self._starting.is_set():
            log.info(
                "Shutting down: no more workers will be started; running ones are %s",
                "stopped at a checkpoint (TOWERBOARD_STOP_WORKERS_ON_EXIT), to resume on the "
                "next start"
                if self._settings.stop_workers_on_exit
                else "left to the next service",
            )
        self._starting.clear()

    def stop_workers(self, timeout: float) -> bool:
        """SIGTERM every running worker and wait up to `timeout` s for them to end; True if
        all did. Each checkpoints and exits 3, and with no cancel asked for its job goes
        back to the queue, to resume from that step (call `stop_starting` first)."""
        self._stopping_workers.set()  # their exit 3 is this stop's, not a stranger's
        for worker in list(self._workers.values()):
            worker.terminate()
        deadline = time.monotonic() + timeout
        while self._workers and time.monotonic() < deadline:
            self._wake.set()  # reap each as soon as it ends
            time.sleep(0.05)
        if self._workers:
            log.warning(
                "Shutting down: %d worker(s) still running after %g s", len(self._workers), timeout
            )
        return not self._workers

    def wake(self) -> None:
        """Look at the store now (a job was submitted or cancelled)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Never let one bad tick stop supervision. What a tick does outside its parts'
            # guards is read the store's running jobs: a store that fails them all fails
            # each tick alike, logged once (not five times a second) while it does.
            with self._guard(("", "tick"), "A supervisor tick"):
                self.tick()
            self._wake.wait(self._settings.poll_seconds)
            self._wake.clear()

    def run_dir(self, job_id: str) -> RunDir:
        return RunDir(self._settings.runs_dir / job_id)

    # --- recovery ----------------------------------------------------------------------

    def recover(self) -> None:
        """Take over from a previous service: adopt each running job's living worker or
        settle its job, and wait for each ended job's exiting worker. Each job under its own
        guard, as in a pass: one whose recovery fails (a result the store refuses to
        record) is logged and left to the ticks, and never stops the service starting."""
        for job in self._store.running():
            with self._guard((job.id, "watch"), f"Job {job.id}: recovering it"):
                self._recover(job, parts=RECOVER_PARTS)
        for job in self._store.exiting():
            with self._guard((job.id, "exiting"), f"Job {job.id}: finding its exiting worker"):
                exiting = job.exiting or {}
                worker = adopt_worker(
                    job_id=job.id,
                    run=self.run_dir(job.id),
                    pid=exiting.get("pid"),
                    started=exiting.get("pid_started"),
                )
                # Its grace starts again (this service never saw it begin). One gone is
                # recorded so by the reaping below; its devices are listed as held until
                # the store has it (a resume or delete waits until then), as it says.
                devices = list(exiting.get("devices") or [])
                self._exiting[job.id] = _Exiting(job.id, worker, devices, time.monotonic())
        self._reap_exiting()

    def _recover(self, job: JobRecord, *, parts: int) -> None:
        """Watch a running job that nothing watches: its worker adopted while it lives,
        else the job settled from what it left (`_settle_gone`, `parts` parts read now)."""
        run = self.run_dir(job.id)
        self._tails[job.id] = _Tail.of(job)
        worker = adopt_worker(job_id=job.id, run=run, pid=job.pid, started=job.pid_started)
        if worker is not None:
            self._workers[job.id] = worker
            log.info("Job %s: adopted its running worker (pid %d)", job.id, worker.pid)
            # Found by its argv: store what was never stored (a failure is tried again
            # each pass, by `_watch`, the worker watched meanwhile).
            self._record_worker(job, worker)
            return
        log.info("Job %s: its worker ended while no service watched; settling it", job.id)
        # What it wrote while nobody watched: tens of MB are read on by the ticks.
        self._gone.add(job.id)
        self._settle_gone(job.id, job, parts=parts)

    def _record_worker(self, job: JobRecord, worker: Worker) -> None:
        """Store the pid of a watched worker where the store lacks it, so that a restarted
        service adopts it by its pid; a failure is logged and left to the next pass."""
        if job.pid == worker.pid:
            return
        with self._guard((job.id, "worker"), f"Job {job.id}: recording its worker's pid"):
            self._store.set_worker(job.id, pid=worker.pid, pid_started=worker.started)

    # --- one pass ----------------------------------------------------------------------

    def held_after_their_jobs(self) -> dict[str, str]:
        """Devices still held by the process of a job that is over: device -> job id."""
        return {
            device: exiting.job_id
            for exiting in list(self._exiting.values())
            for device in exiting.devices
        }

    def held_devices(self) -> list[str]:
        """Every device held now: by a running job, or by the process of one that is over."""
        held = [device for job in self._store.running() for device in job.devices]
        return held + list(self.held_after_their_jobs())  # the devices, its keys

    def tick(self) -> None:
        self._reap_exiting()
        running = {job.id: job for job in self._store.running()}
        # A running job that nothing watches (neither a worker nor gone) is taken over as
        # at a start. `_start` watches a worker before any store write, but the store can
        # fail after marking a job running and before its worker exists (reading it back,
        # or recording a failed start): such a job sat running, its devices held, until a
        # restart's `recover()` requeued it. First: the jobs this pass settles or starts are
        # no longer, or not yet, in this look at the store.
        for lost in running.values():
            if lost.id in self._workers or lost.id in self._gone:
                continue
            with self._guard((lost.id, "watch"), f"Job {lost.id}: recovering it"):
                log.warning("Job %s: running, and nothing watched it; taking it over", lost.id)
                self._recover(lost, parts=1)
        for job_id in list(self._gone):
            with self._guard((job_id, "watch"), f"Job {job_id}: settling its gone worker"):
                self._settle_gone(job_id, running.get(job_id), parts=1)
        for job_id, worker in list(self._workers.items()):
            job = running.get(job_id)
            if job is None:  # finished by someone else; nothing left to watch
                self._forget(job_id)
                continue
            with self._guard((job_id, "watch"), f"Job {job_id}: watching its worker"):
                self._watch(job, worker)
        with self._guard(("", "schedule"), "Scheduling queued jobs"):
            self._schedule()

    def _settle_gone(self, job_id: str, job: JobRecord | None, *, parts: int) -> None:
        """Up to `parts` parts of what a gone worker wrote; once it is all stored, the job
        ends (its result.json, or a cancel asked for) or is requeued."""
        if job is None:  # no longer running: ended or deleted meanwhile
            self._gone.discard(job_id)
            self._forget(job_id)
            return
        self._note_free_space(job_id)
        for _ in range(parts):
            read = self._read_progress_guarded(job_id)
            if read is None and not self._stored_or_given_up(job_id, stored=False):
                return  # failed (a full disk, a locked store): settled once all of it is stored
            if not read:
                break
        else:
            return  # more to read: the next tick goes on
        self._stored_or_given_up(job_id, stored=True)
        run = self.run_dir(job_id)
        ended = inside(run.root, run.result) and not self._not_the_trainers(job_id)
        if ended or job.cancel_requested_at is not None:
            self._ended(job, WorkerExit(), killed=False)
        elif (cancelled := self._requeue(job, "its worker is gone")) is not None:
            self._ended(cancelled, WorkerExit(), killed=False)
        # Only once settled: a store that cannot finish or requeue the job raises above,
        # and the job stays here for the next tick. Dropped before, nothing looked at it
        # again, and it stayed running, its devices held, until the service restarted.
        self._gone.discard(job_id)

    def _watch(self, job: JobRecord, worker: Worker) -> None:
        # Its pid, where the store refused it so far; guarded, so a refusal stops nothing.
        self._record_worker(job, worker)
        # A progress file that cannot be read or stored does not stop the cancel: the
        # signals go out whatever its lines. The job ends only once its last lines are
        # stored (or the store has refused them for SETTLE_WAIT_SECONDS); until then the
        # next tick reads them again (poll() keeps its exit).
        self._read_progress_guarded(job.id)
        exit = worker.poll()
        if exit is not None:
            self._note_free_space(job.id)
            # The last lines, written just before the exit.
            if self._stored_or_given_up(job.id, stored=self._read_all_progress(job.id)):
                self._ended(job, exit, killed=worker.killed)
            return
        # A worker that is still running: one gone is never signalled (nor taken for one
        # killed after the grace, while its last lines wait for the store).
        self._enforce_cancel(job, worker)
        told = self._told_exit(job)
        if told is not None:
            # The end line, written before result.json.
            if not self._stored_or_given_up(job.id, stored=self._read_all_progress(job.id)):
                return
            # Listed as held before its end is published, so no client sees them free while
            # the process holds them.
            self._exiting[job.id] = _Exiting(job.id, worker, list(job.devices), time.monotonic())
            try:
                self._ended(job, told, killed=False, exiting=worker)
            except Exception:
                # Its job is not over (the store refused its end): `_watch` tries again next
                # pass. Left here, the reaping took its exit for an ended job's, and sent
                # `exited` while the job was still running.
                del self._exiting[job.id]
                raise

    def _told_exit(self, job: JobRecord) -> WorkerExit | None:
        """The exit a running worker's result.json announces, when that ends its job (not a
        stop that requeues it, whose next attempt must wait for this process to be gone).

        Only once the attempt's `end` line has been read (`_run_ended`): a custom model's
        code runs in the run directory and may write a result.json while the job trains,
        which ended the job there, with that file as its result, and killed the worker
        after the grace. The trainer writes its end line once none of the job's code runs
        any more, removing any result.json first, then its own; a worker that writes none
        is ended by its exit, its result.json read then (or, its exit status unknown, by
        none: `_ended`)."""
        if not self._run_ended(job.id):
            return None
        run = self.run_dir(job.id)
        result = run.read_result() if inside(run.root, run.result) else None
        if result is None:
            return None
        try:
            outcome = Outcome(str(result.get("outcome")))
        except ValueError:
            return None  # not the trainer's: let the exit code decide
        if outcome is Outcome.CANCELLED and job.cancel_requested_at is None:
            return None
        return WorkerExit(code=int(OUTCOME_EXIT_CODES[outcome]))

    def _run_ended(self, job_id: str) -> bool:
        """Whether the attempt's `end` line has been read: a result.json only counts after
        it, as the trainer writes it once the job's code is done."""
        tail = self._tails.get(job_id)
        return tail is not None and tail.ended

    def _not_the_trainers(self, job_id: str) -> bool:
        """Whether a result.json there now cannot be the trainer's: the attempt's `start`
        line is in and its `end` line is not. The trainer writes one before its start line
        (a spec or set-up it refuses, whose reason is the job's) and after its end line,
        never between; a custom model's code, which runs in the run directory, may."""
        tail = self._tails.get(job_id)
        return tail is not None and tail.started and not tail.ended

    def _reap_exiting(self) -> None:
        for job_id, exiting in list(self._exiting.items()):
            # Each under its own guard: a store that refuses one `exited` (kept, and tried
            # again next pass) stopped the whole pass, every pass, and its traceback was
            # logged five times a second.
            with self._guard((job_id, "exiting"), f"Job {job_id}: reaping its exiting worker"):
                self._reap(exiting)

    def _reap(self, exiting: _Exiting) -> None:
        """Record an ended job's worker as exited once it is gone; kill it past the grace."""
        grace = self._settings.cancel_grace_seconds
        if exiting.worker is None or exiting.worker.poll() is not None:
            self._store.exited(exiting.job_id)
            del self._exiting[exiting.job_id]
            # Only now that the store (resume, delete) and the devices list
            # (held_after_their_jobs) both have it gone: a client acting on the event
            # is not refused, nor shown the devices still `exiting`.
            self._publish(JobEvent.exited(exiting.job_id, exiting.devices))
        elif not exiting.worker.killed and time.monotonic() - exiting.since > grace:
            log.warning(
                "Job %s: its worker wrote its result %g s ago and has not exited; killing it",
                exiting.job_id,
                grace,
            )
            exiting.worker.kill()

    def _forget(self, job_id: str) -> None:
        """Stop watching a job that is no longer running."""
        self._workers.pop(job_id, None)
        self._tails.pop(job_id, None)
        self._unstored.pop(job_id, None)
        self._free_at_end.pop(job_id, None)
        self._guard.forget(lambda key: isinstance(key, tuple) and key[0] == job_id)

    def _enforce_cancel(self, job: JobRecord, worker: Worker) -> None:
        if job.cancel_requested_at is None:
            return
        if worker.term_sent_at is None:
            log.info("Job %s: cancel requested, sending SIGTERM to pid %d", job.id, worker.pid)
            worker.terminate()
        elif (
            not worker.killed
            and time.monotonic() - worker.term_sent_at > self._settings.cancel_grace_seconds
        ):
            log.warning(
                "Job %s: no exit %gs after SIGTERM, sending SIGKILL",
                job.id,
                self._settings.cancel_grace_seconds,
            )
            worker.kill()

    def _note_free_space(self, job_id: str) -> None:
        """Keep the space left on the job's disk now that its worker has ended (the first
        time it is seen ended)."""
        if job_id not in self._free_at_end:
            try:
                self._free_at_end[job_id] = shutil.disk_usage(self.run_dir(job_id).root).free
            except OSError:  # no run directory (it never started), or none to look at
                self._free_at_end[job_id] = None

    def _stored_or_given_up(self, job_id: str, *, stored: bool) -> bool:
        """Whether a job whose worker has ended may be settled: its last lines are `stored`,
        or the store has refused them for SETTLE_WAIT_SECONDS (then it ends without them,
        logged: its end, its devices and the jobs queued behind it matter more)."""
        if stored:
            self._unstored.pop(job_id, None)
            return True
        since = self._unstored.setdefault(job_id, time.monotonic())
        if time.monotonic() - since < SETTLE_WAIT_SECONDS:
            return False
        log.error(
            "Job %s: its last progress lines could not be stored for %gs; it ends without them",
            job_id,
            SETTLE_WAIT_SECONDS,
        )
        self._unstored.pop(job_id, None)
        return True

    def _read_progress_guarded(self, job_id: str) -> bool | None:
        """Read and store the next part of the job's progress.jsonl; True when that moved
        on (there may be more), False when there was nothing new, None when it failed (the
        error logged; the next read starts from the same offset)."""
        with self._guard((job_id, "progress"), f"Job {job_id}: reading its progress.jsonl"):
            return self._read_progress(job_id)
        return None

    def _read_all_progress(self, job_id: str) -> bool:
        """Every line the worker has written, a part at a time (it has ended, or said so);
        True when all of it is stored, False when a read or write failed on the way."""
        while read := self._read_progress_guarded(job_id):
            pass
        return read is not None

    def _read_progress(self, job_id: str) -> bool:
        tail = self._tails[job_id]
        run = self.run_dir(job_id)
        if not inside(run.root, run.progress):
            return False  # not written yet (or not a plain file of the run directory)
        lines, offset = read_progress_chunk(run.progress, tail.offset)
        if offset == tail.offset:
            return False
        if offset - tail.offset > PROGRESS_READ_BYTES // 2:
            self._wake.set()  # a whole part: read on at the next pass, without waiting
        progress, eval, points = fold_progress(tail.progress, tail.eval, lines)
        # Before the store is asked: lines it refuses for good are given up on, and the
        # job still ends at the result.json its end line announced.
        events = {line.get("event") for line in lines}
        tail.started = tail.started or "start" in events
        tail.ended = tail.ended or "end" in events
        self._store.record_progress(
            job_id,
            offset=offset,
            progress=progress,
            eval=eval,
            points=points,
            forget_after=restarted_at(lines),
        )
        # Only now, with the lines stored: a failed write leaves the tail where it was, and
        # the next tick reads the same lines again.
        tail.offset, tail.progress, tail.eval = offset, progress, eval
        for line in lines:
            self._publish(JobEvent(job_id, str(line.get("event", "progress")), finite_json(line)))
        return True

    def _ended(
        self, job: JobRecord, exit: WorkerExit, *, killed: bool, exiting: Worker | None = None
    ) -> None:
        """The worker has ended (or, `exiting`, said so and is still exiting): requeue the
        job if it was only interrupted, else finish it."""
        run = self.run_dir(job.id)
        present = inside(run.root, run.result)
        if present and exit.code is None and exit.signal is None and self._not_the_trainers(job.id):
            # Its exit status unknown (adopted, or gone while no service ran), only
            # result.json can tell, and this one is not the trainer's: a worker killed as
            # it trained ended its job with a custom model's file as its result.
            log.warning(
                "Job %s: a result.json between its start and end lines is not the trainer's; "
                "judged as none",
                job.id,
            )
            present = False
        result = run.read_result() if present else None
        # Judged as if there were none (a custom model's code may write anything there),
        # and its reason says so.
        unreadable = present and result is None
        cancel_requested = job.cancel_requested_at is not None
        why = interrupted(exit, result, cancel_requested=cancel_requested)
        stopping = why is not None and self._stopping_workers.is_set()
        if stopping:
            why = "its worker stopped after a checkpoint as the service shut down"
        crash = False
        if why is None:
            why = crashed(
                exit, result, cancel_requested=cancel_requested, result_unreadable=unreadable
            )
            crash = why is not None
            if crash and job.crashes >= self._settings.crash_retries:
                why = None  # past the retries: it fails, below
        if why is not None:
            # A cancel asked for since `job` was read: the end judged again, as a cancel's.
            if (cancelled := self._requeue(job, why, killed=crash, expected=stopping)) is not None:
                self._ended(cancelled, exit, killed=killed, exiting=exiting)
            return
        final = final_state(
            exit,
            result,
            cancel_requested=cancel_requested,
            killed_after_grace=killed,
            grace_seconds=self._settings.cancel_grace_seconds,
            # Through the same confinement check as every file served from a run directory.
            log_tail=tail_lines(run.log, ERROR_LOG_LINES) if inside(run.root, run.log) else [],
            restarts_after_kills=job.crashes,
            result_unreadable=unreadable,
            free_bytes=self._free_at_end.get(job.id),
        )
        self._store.finish(
            job.id,
            final.state,
            result=final.result,
            error=final.error,
            exiting=None
            if exiting is None
            else {"pid": exiting.pid, "pid_started": exiting.started, "devices": job.devices},
        )
        self._forget(job.id)
        log.info(
            "Job %s %s%s",
            job.id,
            final.state.value,
            f": {final.error['reason']}" if final.error else "",
        )
        self._publish_state(job.id)

    def _requeue(
        self, job: JobRecord, why: str, *, killed: bool = False, expected: bool = False
    ) -> JobRecord | None:
        """Running -> queued with attempts + 1 (and crashes + 1 if its worker was killed);
        the next attempt resumes from the latest checkpoint. `expected`: the service's own
        doing, logged as information rather than a warning.

        The job as it is now, still watched, when a cancel was asked for since `job` was
        read (the store then refuses the requeue): for the caller to end it as cancelled.
        Requeued, it started again with the request cleared and trained on."""
        # False: no longer running (finished since), or a cancel asked for meanwhile
        requeued = self._store.requeue(job.id, crashed=killed)
        if not requeued:
            now = self._store.get(job.id)
            if now and now.state is JobState.RUNNING and now.cancel_requested_at is not None:
                return now
        self._forget(job.id)
        if requeued:
            log.log(
                logging.INFO if expected else logging.WARNING,
                "Job %s: %s; requeued as attempt %d to resume from its latest checkpoint",
                job.id,
                why,
                job.attempts + 1,
            )
            log_requeue(self.run_dir(job.id), job.id, job.attempts, why)
            self._publish_state(job.id)
        return None

    def _schedule(self) -> None:
        if not self._starting.is_set():
            return
        # Read no more of the queue than can start: each pass read all of it for its first
        # jobs, 16 ms a pass (five a second) for 5,000 queued jobs with no device free.
        # Those that never fit are found in the queue's index, none of it read in Python.
        most = self._pool.most_towers
        for job in [] if most is None else self._store.queue(towers_over=most):
            reason = (
                f"The job needs {self._pool.needed(job.towers)} devices but this "
                f"service has {len(self._pool.devices)}: {self._pool.describe()}."
            )
            if self._store.fail_queued(job.id, error={"reason": reason}):
                self._publish_state(job.id)
        if not self._store.queue(most=1):
            return  # an idle queue reads no running job (each with its spec) every pass
        held = self.held_devices()
        free = len(self._pool.free(held))
        if not free:
            return
        # In strict order a job takes one device at least: no more than `free` can start.
        queued = self._store.queue(most=free)
        for placement in next_placements(queued, self._pool, held):
            self._start(placement.job.id, placement.devices)

    def _start(self, job_id: str, devices: list[str]) -> None:
        # The attempt before's result.json goes before the job is marked running, not only
        # as its worker starts: a service killed between the two left it beside a running
        # job with no worker, and the next start ended the job with that old outcome.
        run = self.run_dir(job_id)
        try:
            run.result.unlink(missing_ok=True)
            # So does a profile request that attempt never took (the job ended first, which
            # the route said leaves it untraced): the next attempt traced it, saying "asked
            # for". Only a running job is asked, so one asked of this attempt comes later.
            run.profile_request.unlink(missing_ok=True)
        except OSError as error:
            # A folder of that name (a custom model's code runs in the run directory), a
            # run directory it made read-only: raised out of the pass, this left the job
            # queued for good, at the head of a strict queue, and no job behind it started.
            log.exception("Job %s: could not start its worker", job_id)
            if self._store.fail_queued(
                job_id, error={"reason": f"Could not start the worker: {error}"}
            ):
                self._publish_state(job_id)
            return
        if not self._store.mark_running(job_id, devices=devices):
            return  # cancelled since the queue was read
        # Running from here: should what follows raise before its worker is watched, the
        # next pass finds a running job nothing watches and takes it over (`tick`).
        # Read now that it runs: nothing but a cancel request changes a running job, where
        # a resume could have given a queued one a new spec since the queue was read.
        job = self._store.get(job_id)
        if job is None:
            return
        try:
            worker = spawn_worker(
                job_id=job.id,
                spec=job.spec,
                run=run,
                python=self._settings.python,
                module=self._settings.worker_module,
                nice=self._settings.worker_nice,
                cuda_visible_devices=self._pool.cuda_visible_devices(devices),
                attempt=job.attempts,
                data_roots=self._settings.allowed_data_roots,
            )
        except Exception as error:
            # Ended here, whatever the error: one that left the pass (anything but an
            # OSError did) left the job running with no worker, and the next pass requeued
            # it as one whose worker was gone, started it again, and so on every pass. A
            # store that refuses this end raises, and that next pass takes the job over.
            log.exception("Job %s: could not start its worker", job.id)
            said = str(error) if isinstance(error, OSError) else f"{type(error).__name__}: {error}"
            self._store.finish(
                job.id,
                JobState.FAILED,
                result=None,
                error={"reason": f"Could not start the worker: {said}"},
            )
            self._publish_state(job.id)
            return
        # Watched before any store write: a set_worker that raised (a store locked past
        # its busy timeout, a full disk) left a live worker nothing watched, its progress
        # never read, a cancel never sent, its end never recorded and its devices held
        # until a restart. Kept, the child's exit status is read as for any other; its pid
        # is stored by `_watch` once the store takes it.
        self._workers[job.id] = worker
        self._tails[job.id] = _Tail.of(job)
        self._record_worker(job, worker)
        self._publish_state(job.id)

    def _publish_state(self, job_id: str) -> None:
        job = self._store.get(job_id)
        if job is not None:
            self._publish(JobEvent.state(job))
