"""The outer training loop: everything around the step that touches files or the clock.

The `TowerTrainer` computes; the controller decides when to write summaries, capture a
device trace, evaluate, checkpoint and report progress, and how the loop ends (done,
SIGTERM, non-finite numbers: `trainer.divergence`). Steps are counted from 1: step s is the s-th update.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tensorflow as tf

from trainer.activations import ActivationProbe, activation_probe
from trainer.checkpoints import Checkpointer
from trainer.cluster import Cluster
from trainer.devicememory import TowerMemory
from trainer.divergence import (
    NonFiniteLoss,
    first_non_finite,
    non_finite_gradients,
    non_finite_weights,
)
from trainer.errors import one_line
from trainer.hparams import spec_hparams
from trainer.profiling import STEP_MARKER, TraceCapture, TraceTimes
from trainer.rundir import (
    PROFILE_STEPS_DEFAULT,
    PROFILE_STEPS_MAX,
    Outcome,
    ProgressWriter,
    RunDir,
    accuracy_digits,
    evaluated_at,
    json_object,
    reported_at,
    significant,
)
from trainer.spec import JobSpec
from trainer.summaries import SummaryManager, variable_tag
from trainer.towers import REQUESTS, TowerTrainer, host_tower_sizes

log = logging.getLogger(__name__)

PROGRESS_EVERY_SECONDS = 2.0
# Progress lines are also the service's metric series, which the dashboard charts: a job
# reports at every hundredth of its steps too, so a short one draws a curve and not two
# points, but no more often than this (each line is a store write and an SSE event).
PROGRESS_MIN_SECONDS = 0.25
CHART_POINTS = 100

# How many steps with nothing but their loss due (most of them) the loop launches before it
# reads their losses. Reading any tensor from a GPU waits for all the work queued on it
# (TensorFlow's device-to-host copy waits on the compute stream), so a loop that read each
# step's loss before launching the next would leave the device idle for the loop's own
# time every step; reading every tenth, it idles once in ten. Ten is the default scalars
# cadence, whose steps are read anyway. A non-finite loss is found up to this many steps
# late, and named by its own step.
UNREAD_STEPS_MAX = 10
# What the loop keeps of a step whose loss it reads later: what a report reads. The rest
# (the averaged gradients, as large as the model) is let go at once.
_KEPT_UNREAD = ("loss", "accuracy", "learning_rate")


def _metrics(loss: float, out: dict[str, Any] | None) -> dict[str, float]:
    """Loss and accuracy of the last step (read only when reported: one sync less a step),
    rounded as the progress lines carry them: the result's and the end line's are the
    API's last point of the series, and showed 0.10326767712831497 after 0.244084."""
    if out is None:
        return {}
    return {"loss": significant(loss), "accuracy": accuracy_digits(float(out["accuracy"]))}


def _float32_digits(value: float) -> float:
    """A float32 `value` (the optimizer's learning rate) as the shortest decimal that is
    that float32: 0.001, not the float64 reading of its bits, 0.0010000000474974513."""
    return float(str(np.float32(value)))


def _read_losses(losses: list[Any]) -> list[float]:
    """Launched steps' losses as floats: in one copy from a device, and in none from the
    host. Each copy from a GPU is a sync of its own, so losses there are stacked and
    copied back once. Losses on the host (a CPU parameter device, or towers on CPUs) need
    no copy, and reading each costs less than the eager stack: 37 against 216 µs for ten,
    between steps of an `mlp` on this project's 2-core CPU, every tenth step of a job."""
    if len(losses) > 1 and not _on_host(getattr(losses[0], "device", "")):
        return tf.stack(losses).numpy().tolist()
    return [float(loss) for loss in losses]


@functools.lru_cache(maxsize=64)
def _on_host(device: str) -> bool:
    """Whether a tensor's `device` (its full name) is a CPU: parsed once a name."""
    return bool(device) and tf.DeviceSpec.from_string(device).device_type == "CPU"


def _rounded(examples_per_sec: float | None) -> float | None:
    return None if examples_per_sec is None else round(examples_per_sec, 2)


class _StepClock:
    """Seconds spent in steps, how many, and the examples they trained on, since it was last read."""

    def __init__(self) -> None:
        self.seconds, self.steps, self.examples = 0.0, 0, 0

    def add(self, seconds: float, examples: int, steps: int) -> None:
        """`seconds` of the loop that read `steps` steps' losses, of `examples` in all
        (none, for a launch whose loss is read in the next span)."""
        self.seconds += seconds
        self.steps += steps
        self.examples += examples

    def take(self) -> tuple[float, float] | None:
        """The mean seconds a step and the examples a second since the last take (None if
        no step was timed); resets. Examples are counted, not assumed to be `batch_size`
        each: the last batch of an epoch is partial."""
        timed = (
            (self.seconds / self.steps, self.examples / self.seconds)
            if self.steps and self.seconds > 0
            else None
        )
        self.seconds, self.steps, self.examples = 0.0, 0, 0
        return timed


# How far back the ETA looks: long enough to take in the evals and checkpoints between
# steps (every few hundred steps), short enough to follow the host's load. The whole run
# was 95% off on a shared host whose load dropped halfway.
ETA_WINDOW_SECONDS = 300.0


class _Pace:
    """Wall-clock seconds a step over the last `ETA_WINDOW_SECONDS`, everything between
    steps included (summaries, evals, checkpoints): for the ETA."""

    def __init__(self, window: float = ETA_WINDOW_SECONDS) -> None:
        self._window = window
        self._marks: collections.deque[tuple[float, int]] = collections.deque()

    def mark(self, now: float, step: int) -> None:
        """Where the run is at `now` (first, the first timed step: not the one that traces)."""
        self._marks.append((now, step))
        # Keep the newest mark at or before the window's start: the span always covers it.
        while len(self._marks) > 2 and self._marks[1][0] <= now - self._window:
            self._marks.popleft()

    def seconds_per_step(self) -> float | None:
        """None until two marks steps apart."""
        if len(self._marks) < 2:
            return None
        (then, first), (now, last) = self._marks[0], self._marks[-1]
        return (now - then) / (last - first) if last > first else None


@dataclass(frozen=True)
class _Launched:
    """A step started on the devices: its number, outputs (tensors, maybe not computed
    yet) and example count."""

    step: int
    out: dict[str, Any]
    examples: int


def _due(every: int, step: int) -> bool:
    """Whether a cadence of `every` steps (0: off) falls on `step`."""
    return bool(every) and step % every == 0


def _summary_due(every: int, step: int, last: bool) -> bool:
    """Whether a summary kind of cadence `every` is written at `step`: by the cadence, and
    also at the job's first and last steps. The first shows at once the inputs as the
    towers got them, the weights one update from their initial values, and the initial
    loss (of the weights before that update): a wrong scale or a dead layer shows in
    seconds, not after `histograms_every` steps (500 by default, minutes for a big model).
    A resumed worker's first step is not the job's, and the charts have it already."""
    return bool(every) and (step % every == 0 or step == 1 or last)


@dataclass
class _Loop:
    """What `Controller.run` carries from step to step."""

    first_step: int  # this process's first: it traces the step function, so is timed apart
    chart_every: int  # steps between chart points: a hundredth of the job
    last_report: float  # `time.monotonic()` of the last progress line
    loss: float = math.nan
    out: dict[str, Any] | None = None  # the outputs of the last step whose loss is read
    read_step: int = 0  # that step: the last read whose loss was finite
    reported_step: int | None = None  # the step of the last progress line
    # Steps with nothing due after them but their losses, launched up to UNREAD_STEPS_MAX
    # at a time before the loop reads them: on a GPU a call returns as its step is queued,
    # and the loop runs ahead of the device (see there). A CPU runs a call to its end, so
    # there it changes only the order of the reads.
    pending: list[_Launched] = field(default_factory=list)
    # Step time is the time spent in steps alone: waiting for input, the step, reading
    # the loss. Summaries, evals and checkpoints between steps are left out, and so is
    # this process's first step (it traces the function). The ETA counts everything.
    scalar_clock: _StepClock = field(default_factory=_StepClock)
    report_clock: _StepClock = field(default_factory=_StepClock)
    pace: _Pace = field(default_factory=_Pace)
    examples_per_sec: float | None = None  # until a step other than the first is timed
    graph_written: bool = False
    # The last step whose gradient norm was read and found finite (`_check_gradients`).
    norm_checked_at: int | None = None

    def report_due(self, step: int, now: float) -> bool:
        """Whether a progress line is due at `step`: one 2 s after the last (slow steps
        report on time), or a chart point (a hundredth of the job) but no sooner than
        PROGRESS_MIN_SECONDS after the last."""
        since = now - self.last_report
        return since >= PROGRESS_EVERY_SECONDS or (
            step % self.chart_every == 0 and since >= PROGRESS_MIN_SECONDS
        )

    def time(self, seconds: float, read: list[_Launched]) -> None:
        """`seconds` of the loop that read the losses of `read` (none: a launch whose loss
        is read later), on both clocks."""
        examples = sum(each.examples for each in read)
        for clock in (self.scalar_clock, self.report_clock):
            clock.add(seconds, examples, len(read))


@dataclass
class RunSummary:
    """How the loop ended and the last metrics it saw."""

    outcome: Outcome
    step: int
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    eval: dict[str, float] | None = None  # loss, accuracy, the examples and step they are of
    checkpoint: str | None = None


class Controller:
    def __init__(
        self,
        *,
        spec: JobSpec,
        trainer: TowerTrainer,
        train_batches: Iterator[tuple[tf.Tensor, tf.Tensor]],
        eval_data: tf.data.Dataset | None,
        total_steps: int,
        rundir: RunDir,
        progress: ProgressWriter,
        summaries: SummaryManager,
        checkpointer: Checkpointer,
        stop: threading.Event,
        cluster: Cluster | None = None,
        steps_per_epoch: int | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self.trainer = trainer
        self.train_batches = train_batches
        self.eval_data = eval_data
        self.total_steps = total_steps
        self.rundir = rundir
        self.progress = progress
        self.summaries = summaries
        self.checkpointer = checkpointer
        self.stop = stop
        # In a cluster every worker trains, and the chief alone evaluates, traces and
        # takes the service's profile requests; the others wait for it at the next step.
        self.cluster = cluster or Cluster()
        # Said in the start line: the service checks a later `{"epochs": N}` resume by it.
        self.steps_per_epoch = steps_per_epoch
        # Said in the start line too, for the job's status: `Arrays.summary`.
        self.data = data
        self.trace = TraceCapture(rundir.tensorboard)
        self._trace_steps = set(spec.summaries.trace_steps) if self.cluster.is_chief else set()
        if past := sorted(s for s in self._trace_steps if s > total_steps):
            # The spec cannot know an epochs job's length: said here, once the worker does.
            log.warning(
                "summaries.trace_steps %s: past this job's %d steps, so no trace of %s",
                ", ".join(map(str, past)), total_steps, "it" if len(past) == 1 else "them",
            )  # fmt: skip
        # The first step of the trace running: the trace holds it through the step run
        # last, whether the loop ends the trace or a failure does (after its step's
        # summaries, an eval's or a checkpoint's, or before them, a non-finite loss's).
        self._trace_first = 0
        # Steps a profile request (the service's) asked to trace, until a trace takes them:
        # that trace's line says `requested`, so a page that asked knows its answer from
        # the spec's own traces.
        self._requested_steps: set[int] = set()
        self._request_refused = False  # a request could not be taken: said once
        self._tower_ms: list[float] | None = None
        # The trace being stopped and read off the loop (`TraceCapture.end`): its last step,
        # whether a request asked for it, and what it gives. Its line is written at the next
        # step that is not quiet, or when it is waited for.
        self._trace_ending: tuple[int, bool, Future[TraceTimes | None]] | None = None
        self._towers_on_gpus = any(
            tf.DeviceSpec.from_string(d).device_type == "GPU" for d in trainer.tower_devices
        )
        self.memory = TowerMemory(trainer.tower_devices)
        self._last_eval: dict[str, float] | None = None
        self._checkpoint_path: str | None = None
        self._probe: ActivationProbe | Literal[False] | None = False  # False: not made yet
        # The step being run, or the last one run: where a crash happened.
        self.at_step = 0

    # -- the loop --------------------------------------------------------------------

    def run(self) -> RunSummary:
        try:
            return self._run()
        finally:
            if self.trace.active:
                # A failure inside a trace (a non-finite loss at a traced step, say): the
                # profiler is stopped and its trace kept, the failing step the last in it,
                # not left running (a process that goes on, a test's, could trace no more).
                self.trace.end(
                    range(self._trace_first, self.at_step + 1),
                    self.trainer.local_towers,
                    self._towers_on_gpus,
                )
            # On every way out, a failure's too, the thread that stops the profiler is
            # joined: no stop runs on into the interpreter's shutdown. A failure drops what
            # a trace gave (its file stays on disk): what the job writes next is how it
            # failed.
            self.trace.close()

    def _run(self) -> RunSummary:
        step = int(self.trainer.step.numpy())
        self.progress.write(
            "start",
            step=step,
            total=self.total_steps,
            phase="starting",
            towers=self.trainer.num_towers,
            **({"steps_per_epoch": self.steps_per_epoch} if self.steps_per_epoch else {}),
            **({"data": dict(self.data)} if self.data else {}),
            **({"workers": self.cluster.workers} if self.cluster.is_multi_worker else {}),
        )
        # What an earlier process wrote to TensorBoard past here, this one writes again.
        if step < self.total_steps:
            self.summaries.start(step + 1)
        else:
            # Nothing to train: a job finished at a checkpoint of a run that went on past
            # it (a failed one), or a worker restarted at the final checkpoint. Its train
            # file is made now, so its START drops the steps that run charted past the
            # checkpoint (a job that succeeded at step 200 charted loss on to 250, and
            # HParams showed that as its last); its final eval writes the checkpoint's
            # step again, so the eval's START is at it (else that step was drawn twice).
            self.summaries.start(step + 1, eval=step)
            self.summaries.open("train")
        if step == 0:
            self._write_hparams()
        self._trace_past_first_step(step + 1)
        loop = _Loop(
            first_step=step + 1,
            chart_every=max(1, self.total_steps // CHART_POINTS),
            last_report=time.monotonic(),
        )
        self.at_step = step
        self._evaluate_if_cut_short(step)
        if step < self.total_steps:
            self._activation_probe()  # its first call's cost here, not on the loop
        s = self.spec.summaries
        requests = np.zeros(len(REQUESTS), np.int32)
        # One process stops before its next step; a cluster's workers stop after the step
        # whose requests carried the stop, all of them at that step.
        in_cluster = self.cluster.is_multi_worker
        while step < self.total_steps:
            if loop.pending and (self.stop.is_set() or step + 1 in self._trace_steps):
                # The steps in flight are read first: a stop checkpoints after them, and a
                # trace must not take in their end.
                self._read_pending(loop)
            if not in_cluster and self.stop.is_set():
                return self._finish_cancelled(step, _metrics(loop.loss, loop.out))
            self.at_step = step + 1
            if step + 1 in self._trace_steps and not self.trace.active:
                self._write_trace(wait=True)  # the profiler takes one session at a time
                if self.trace.start():
                    self._trace_first = step + 1
            began = time.monotonic()
            # Every kind is also written at the job's first and last steps, so its charts
            # begin and end where the job did (a 2050-step job with scalars every 100
            # ended its charts at 2000).
            last = step + 1 == self.total_steps
            scalars_due = _summary_due(s.scalars_every, step + 1, last)
            images, quiet, read = self._step(loop, step + 1, scalars_due, requests)
            step += 1
            if step == loop.first_step:
                loop.pace.mark(time.monotonic(), step)
            else:
                loop.time(time.monotonic() - began, read)
            if quiet:
                if read:
                    self._report_if_due(loop, read[-1].step, step)
                continue
            # One process's requests are its own (no read back from the step's outputs).
            assert loop.out is not None
            agreed = loop.out["requests"].numpy() if in_cluster else requests
            stop_asked, checkpoint_asked = (bool(r) for r in agreed)
            checkpoint_due = (
                self.checkpointer.due_by_steps(step) or checkpoint_asked
            ) and step < self.total_steps
            self._write_summaries(loop, step, images, scalars_due, last)
            # A checkpoint's step is always reported: a job finished at that checkpoint
            # later ("finish here") carries that report's loss and accuracy as its result.
            # So is a worker's first step: its loss is the job's initial one (a wrong scale
            # shows at once), or where a resume starts; left to the clock, a step function
            # traced in under 2 s went unreported, and the charts began a hundredth in.
            # And an eval's step, so its eval has the train loss beside it (a CSV row, a
            # chart's point): one line an eval, which costs far more than it.
            first = step == loop.first_step
            e = self.spec.eval
            eval_due = _due(e.every_steps, step) and step < self.total_steps
            self._report_if_due(loop, step, step, force=checkpoint_due or first or eval_due)
            # A stop carried by the last step ends the job as one process's does: trained
            # (its final checkpoint and export), not cancelled at N of N with neither.
            if in_cluster and stop_asked and step < self.total_steps:
                return self._finish_cancelled(step, _metrics(loop.loss, loop.out))
            if eval_due and not self.stop.is_set():
                self._evaluate(step)
            if checkpoint_due:
                self._save(step)
        return self._finish(loop, step)

    # -- pieces of the loop ----------------------------------------------------------

    def _write_hparams(self) -> None:
        """The spec as TensorBoard hyperparameters (`trainer.hparams`), by a worker that
        starts the job: TensorBoard keeps the first a run wrote."""
        values, dropped = spec_hparams(self.spec.model_dump(mode="json"))
        if dropped:
            log.info(
                "TensorBoard's hyperparameters: the spec's first %d values; %d more left out",
                len(values),
                dropped,
            )
        self.summaries.hparams(values, self.rundir.root.name)

    def _trace_past_first_step(self, first: int) -> None:
        """A process's first step traces the step function (a second or more), which a
        device trace of it would show as the step: the trace steps that run on from `first`
        (a trace a restart lands in, or `trace_steps` from 1) move one step later."""
        if first not in self._trace_steps:
            return
        after = first
        while after in self._trace_steps:
            after += 1
        self._trace_steps.discard(first)
        if after <= self.total_steps:
            self._trace_steps.add(after)
        log.info(
            "trace of step %d %s: this process's first step traces the step function, which "
            "a device trace would show as the step",
            first,
            f"moved to step {after}" if after <= self.total_steps else "left out (the job's last)",
        )

    def _evaluate_if_cut_short(self, step: int) -> None:
        """On a resume after an eval step whose eval never ended (a stop during it skips
        it), evaluate first, or the eval charts lack that point for good."""
        e = self.spec.eval
        # The last eval step at or before the one resumed from (0: none yet).
        due = step - step % e.every_steps if e.every_steps else 0
        if (
            due
            and step < self.total_steps
            and not self.stop.is_set()
            and self.eval_data is not None  # who evaluates: a cluster's chief alone
            and self.cluster.is_chief
            and not evaluated_at(self.rundir.progress, due, through=step)  # reads it all
        ):
            # One process stops before its next step, so it checkpointed at the eval step
            # itself (due == step). A cluster's workers stop after the next step they
            # all agree on, so they checkpointed a step (or more) past it: the weights of
            # the eval step are gone, and the eval is of the step resumed from, written
            # as that step. So an eval of any step from `due` through `step` counts: one
            # such resumed run that ended its eval has done the one due.
            self._evaluate(step)

    def _step(
        self, loop: _Loop, step: int, scalars_due: bool, requests: np.ndarray
    ) -> tuple[tf.Tensor, bool, list[_Launched]]:
        """Launch `step` and read the losses due: (its images, whether nothing but its
        loss is due after it, the steps whose losses were read). `requests` are set here,
        for the step to carry: a stop asked while the input was awaited goes with it."""
        in_cluster = self.cluster.is_multi_worker
        images, labels = next(self.train_batches)
        examples = int(images.shape[0])
        requests[:] = (self.stop.is_set(), self.checkpointer.due_by_time())
        # A traced step is marked as one (`step_num`), as Keras's fit marks its steps:
        # the profile plugin's overview page and input-pipeline analyzer find steps by
        # this marker alone, and without it said "No step marker observed" and 0 ms. The
        # read is inside it: on a GPU the launch returns before the step is done.
        with (
            tf.profiler.experimental.Trace(STEP_MARKER, step_num=step, _r=1)
            if self.trace.active
            else contextlib.nullcontext()
        ):
            launched = _Launched(
                step,
                self.trainer.train_step(
                    images,
                    labels,
                    with_scalars=scalars_due,
                    requests=tf.constant(requests) if in_cluster else None,
                ),
                examples,
            )
            # A step that a report is due at is read at once: a chart point (a hundredth
            # of the job) or one 2 s after the last report (slow steps report on time).
            quiet = (
                not in_cluster
                and not loop.report_due(step, time.monotonic())
                and self._only_its_loss_due(
                    step, loop.first_step, scalars_due, bool(requests.any())
                )
            )
            if quiet:
                kept = {k: launched.out[k] for k in _KEPT_UNREAD}
                loop.pending.append(_Launched(launched.step, kept, examples))
                read = loop.pending if len(loop.pending) >= UNREAD_STEPS_MAX else []
            else:
                read = [*loop.pending, launched]
            if read:
                loop.pending = []
            self._settle(loop, read)
        return images, quiet, read

    def _settle(self, loop: _Loop, launched: list[_Launched]) -> None:
        """Read launched steps' losses, the host-device sync point, then check them in
        order."""
        losses = _read_losses([each.out["loss"] for each in launched])
        for each, value in zip(launched, losses, strict=True):
            if not math.isfinite(value):
                self._report_last_finite(loop)
                raise NonFiniteLoss(each.step, value)
            loop.loss, loop.out, loop.read_step = value, each.out, each.step

    def _read_pending(self, loop: _Loop) -> None:
        """Read the steps launched and not yet read, timed as steps."""
        began = time.monotonic()
        self._settle(loop, loop.pending)
        loop.time(time.monotonic() - began, loop.pending)
        loop.pending = []

    def _report_if_due(self, loop: _Loop, at: int, launched: int, force: bool = False) -> None:
        """A progress line for step `at` (read) when one is due, or `force`d; `launched`:
        the last step started, after which a profile request's steps come."""
        assert loop.out is not None
        now = time.monotonic()
        if not (force or loop.report_due(at, now) or at == self.total_steps):
            return
        timed = loop.report_clock.take()
        step_seconds = None
        if timed is not None:
            step_seconds, loop.examples_per_sec = timed
        loop.pace.mark(now, at)
        self._report_read(loop, at, loop.pace.seconds_per_step() or step_seconds)
        loop.last_report = now
        self._take_profile_request(launched)

    def _report_read(self, loop: _Loop, at: int, wall_per_step: float | None) -> None:
        """The progress line of step `at`, the last read (`loop.loss`, `loop.out`), with its
        ETA from `wall_per_step` (None: none)."""
        assert loop.out is not None
        self._report(
            at,
            _metrics(loop.loss, loop.out),
            loop.examples_per_sec,
            wall_per_step,
            float(loop.out["learning_rate"]),
        )
        loop.reported_step = at

    def _report_last_finite(self, loop: _Loop) -> None:
        """Before the job fails for a non-finite loss (or gradient norm, under the step's
        finite loss): a progress line for the last step whose loss was finite, unless one
        was written. A run that blew up within seconds of its start had reported its first
        step alone (reports fall due every 2 s or a hundredth of the job), so the dashboard's charts, which the progress lines make,
        held that one point, and not the climb TensorBoard's scalars showed. The failure
        path only: the step's outputs were read with its loss, so this costs the loop no
        sync; no ETA (the job ends here). A line that cannot be written (a full disk) is
        logged, and the job fails for its loss all the same."""
        if loop.out is None or loop.read_step == loop.reported_step:
            return
        timed = loop.report_clock.take()
        if timed is not None:
            loop.examples_per_sec = timed[1]
        try:
            self._report_read(loop, loop.read_step, None)
        except Exception as e:  # noqa: BLE001 - the loss's failure is what the job ends with
            log.warning("could not report step %d before the failure: %s", loop.read_step, e)

    def _write_summaries(
        self, loop: _Loop, step: int, images: tf.Tensor, scalars_due: bool, last: bool
    ) -> None:
        """What is due to TensorBoard after `step` (read): a trace ended before and read
        by now, the end of a trace, the graph once, scalars, histograms and images."""
        assert loop.out is not None
        s = self.spec.summaries
        self._write_trace(wait=False)
        if self.trace.active and step + 1 not in self._trace_steps:
            self._finish_trace(step)
        if s.graph and not loop.graph_written:
            self.summaries.graph("train", self.trainer.train_function.get_concrete_function().graph)
            loop.graph_written = True
        if scalars_due:
            timed = loop.scalar_clock.take()
            values = self._write_scalars(step, loop.out, *(timed or (None, None)))
            # After the write: the chart shows the non-finite norm the job fails on.
            self._check_gradients(loop, step, values)
        if _summary_due(s.histograms_every, step, last):
            self._write_histograms(step, loop.out["grads"], images)
        if _summary_due(s.images_every, step, last):
            self._write_images(step, images)

    def _finish(self, loop: _Loop, step: int) -> RunSummary:
        """The job's end after its last step: a trace still open, the final eval, the final
        checkpoint."""
        if self.trace.active:
            self._finish_trace(step)
        self._write_trace(wait=True)
        metrics = {
            **_metrics(loop.loss, loop.out),
            "examples_per_sec": _rounded(loop.examples_per_sec),
        }
        if loop.out is None:
            # Started at its final step, no step ran here: restarted from the final
            # checkpoint (the worker died while exporting), or finished at the checkpoint
            # of a cancelled or failed run (resumed with `steps` equal to its step). The
            # result carries what the run that trained reported of that step.
            metrics = self._reported(step)
        if self.spec.eval.every_steps and not self.stop.is_set():
            self._evaluate(step)
        self._save(step)
        return RunSummary(Outcome.SUCCEEDED, step, metrics, self._last_eval, self._checkpoint_path)

    def _only_its_loss_due(
        self, step: int, first_step: int, scalars_due: bool, requested: bool
    ) -> bool:
        """Whether nothing but reading its loss follows `step` (just launched), so the loop
        may launch more steps before it reads it: no summary, trace, eval or checkpoint
        due after it, no stop or checkpoint asked for, and not the first step (timed apart)
        or the last. Each of those reads the step's outputs or the variables as the step
        left them."""
        s, e = self.spec.summaries, self.spec.eval
        due = (
            step in (first_step, self.total_steps)
            or requested
            or scalars_due
            or self.trace.active
            or step + 1 in self._trace_steps
            or _due(s.histograms_every, step)
            or _due(s.images_every, step)
            or _due(e.every_steps, step)
            or self.checkpointer.due_by_steps(step)
        )
        return not due

    def _reported(self, step: int) -> dict[str, float | None]:
        """Loss, accuracy and examples/sec that progress.jsonl says of `step` (a cancelled
        run's end line says no speed), or none of them where no line does (a checkpoint
        of an earlier version, which did not report each checkpoint's step)."""
        report = reported_at(self.rundir.progress, step) or {}
        return {k: report.get(k) for k in ("loss", "accuracy", "examples_per_sec")}

    def _report(
        self,
        step: int,
        metrics: dict[str, float],
        examples_per_sec: float | None,
        wall_per_step: float | None,
        learning_rate: float,
    ) -> None:
        remaining = self.total_steps - step
        fields: dict[str, Any] = {
            "step": step,
            "total": self.total_steps,
            "loss": significant(metrics["loss"]),
            "accuracy": accuracy_digits(metrics["accuracy"]),
            "examples_per_sec": _rounded(examples_per_sec),
            "eta_seconds": round(remaining * wall_per_step, 1) if wall_per_step else None,
            "learning_rate": _float32_digits(learning_rate),
            "phase": "training",
        }
        if self._tower_ms is not None:
            fields["tower_ms"] = self._tower_ms
        if (memory := self.memory.peak_mb()) is not None:
            fields["memory_mb"] = memory
        self.progress.write("progress", **fields)

    def _write_scalars(
        self,
        step: int,
        out: dict[str, tf.Tensor],
        step_seconds: float | None,
        examples_per_sec: float | None,
    ) -> dict[str, float]:
        """Writes and returns a scalars step's values. `step_seconds`: the mean time of the
        steps since the last write, and `examples_per_sec`: the examples those steps
        trained on a second (both None: none timed)."""
        # The step's scalars, packed by the step itself: one copy back (each copy from a
        # GPU is a sync of its own) and no eager op on the loop.
        # As Python floats in one call each, not a numpy scalar a value.
        read = out["scalars"].numpy().tolist()
        names = self.trainer.scalar_names
        values: dict[str, float] = dict(zip(names, read, strict=False))
        if step_seconds is not None and examples_per_sec is not None:
            values["step_time_ms"] = step_seconds * 1000.0
            values["examples_per_sec"] = examples_per_sec
        # A tower whose shard was empty (a last batch smaller than the tower count) has no
        # loss this step; a 0 would plot as a perfect tower.
        # The example counts are made on the host: reading them costs no sync.
        for i, (tower_loss, count) in enumerate(
            zip(read[len(names) :], out["tower_examples"].numpy().tolist(), strict=True)
        ):
            if count > 0:
                values[f"tower_{i}/loss"] = tower_loss
        for i, mb in enumerate(self.memory.interval_mb() or []):
            values[f"tower_{i}/memory_mb"] = mb
        self.summaries.scalars("train", values, step)
        return values

    def _check_gradients(self, loop: _Loop, step: int, values: Mapping[str, float]) -> None:
        """Fails the job on a scalars step's non-finite gradient norm (its loss, read
        before, was finite). Not under a loss scale: there an overflowing step's update is
        skipped, as it is meant to be (`trainer.lossscale`), and its norm charts as inf."""
        norm = values["grad_norm"]
        if math.isfinite(norm) or self.trainer.loss_scale is not None:
            loop.norm_checked_at = step
            return
        every = self.spec.summaries.scalars_every
        self._report_last_finite(loop)  # this step's loss and accuracy: finite, read
        raise non_finite_gradients(step, norm, values["loss"], every, loop.norm_checked_at)

    def _write_histograms(self, step: int, grads: list[tf.Tensor], images: tf.Tensor) -> None:
        """The weights, the averaged gradients and, if asked, the activations of tower 0's
        first examples of `images` (the step's batch) as the step left the weights, with
        each rectifier's zero fraction."""
        tensors: dict[str, tf.Tensor] = {}
        for var, grad in zip(self.trainer.model.trainable_variables, grads, strict=True):
            tag = variable_tag(var.path)
            tensors[f"weights/{tag}"] = var.numpy()
            tensors[f"gradients/{tag}"] = grad
        zero_fractions: dict[str, str] = {}
        if (probe := self._activation_probe()) is not None:
            shard = host_tower_sizes(len(images), self.trainer.num_towers)[0]
            try:
                tensors.update(probe(images[:shard]))
                zero_fractions = probe.zero_fractions
            except Exception as error:  # e.g. a device out of memory: the job trains on
                self._probe = None
                log.warning("activations: no more histograms of them: %s", one_line(error))
        self.summaries.histograms("train", tensors, step, zero_fractions)

    def _activation_probe(self) -> ActivationProbe | None:
        """Made and warmed (`ActivationProbe.warm`) as the loop starts, once; None: not
        asked for, nothing written here (a cluster's other workers), or a model whose
        activations cannot be read (logged once)."""
        if self._probe is False:
            self._probe = None
            s = self.spec.summaries
            if s.histograms_every and s.activations and self.summaries.logdir is not None:
                try:
                    self._probe = activation_probe(
                        self.trainer.model, self.trainer.tower_devices[0]
                    )
                    if self._probe is not None:
                        self._probe.warm()
                except Exception as error:
                    # A summary is never fatal: a model Keras builds no probe over (a
                    # structure not foreseen here) trains without these histograms.
                    self._probe = None
                    log.warning("activations: no histograms of them: %s", one_line(error))
        return self._probe

    def _write_images(self, step: int, images: tf.Tensor) -> None:
        # The split the step made (`tower_sizes`), so each grid shows what its tower trained
        # on. In numpy: the input pipeline's batches are on the host, so `numpy()` is a copy
        # in host memory with no device in it. As eager ops, the split and the sizes'
        # arithmetic cost 10 ms on the loop at a job's first images, and 1 ms after.
        batch = images.numpy()
        sizes = host_tower_sizes(len(batch), self.trainer.num_towers)
        ends = list(itertools.accumulate(sizes))
        self.summaries.images(
            "train",
            {
                f"tower_{i}/inputs": batch[end - size : end]
                for i, (size, end) in enumerate(zip(sizes, ends, strict=True))
                if size > 0
            },
            step,
            self.spec.summaries.max_images,
        )

    def _finish_trace(self, step: int) -> None:
        """End the trace after `step`, its last: the loop goes on at once, and the
        profiler's stop and the reading of the towers' times run on a background thread
        (`TraceCapture.end`), whose result `_write_trace` writes."""
        traced = range(self._trace_first, step + 1)
        requested = not self._requested_steps.isdisjoint(traced)
        self._requested_steps.difference_update(traced)
        ending = self.trace.end(traced, self.trainer.local_towers, self._towers_on_gpus)
        self._trace_ending = (step, requested, ending)

    def _write_trace(self, wait: bool) -> None:
        """Write what an ended trace gave (the towers' times to TensorBoard and the `trace`
        line), once its thread is done; `wait`: wait for it (a job's end, a cancel, the
        next trace's start). A trace written whose times could not be read still has its
        line, with why (`tower_ms_error`) in place of the times; one never written has
        none (both were logged on its thread)."""
        if self._trace_ending is None:
            return
        step, requested, ending = self._trace_ending
        if not (wait or ending.done()):
            return
        self._trace_ending = None
        read = ending.result()
        if read is None:
            return
        # The times of an older trace go too where this one gave none: later reports,
        # labelled by this trace's step, would pass them off as its times.
        self._tower_ms = read.tower_ms
        if read.tower_ms is not None:
            self.summaries.scalars(
                "train", {f"tower_{i}/compute_ms": ms for i, ms in enumerate(read.tower_ms)}, step
            )
            times: dict[str, Any] = {"tower_ms": read.tower_ms}
        else:
            times = {"tower_ms_error": read.error}
        self.progress.write(
            "trace",
            step=step,
            **times,
            trace_dir=str(read.path.parent.relative_to(self.rundir.root)),
            **({"requested": True} if requested else {}),
        )

    def _take_profile_request(self, step: int) -> None:
        """A trace asked for by the service (`RunDir.profile_request`), taken at a report."""
        if not self.cluster.is_chief:
            return
        try:
            text = self.rundir.take_profile_request()
        except UnicodeDecodeError:  # taken, and no text: junk, read below as the default
            text = ""
        except OSError as e:
            # Not taken (a folder of its name, or of the name it is taken by): no trace.
            # Taken for one of the default steps, it was there again at every report, and
            # the traces ran on into one of the whole job.
            if not self._request_refused:
                self._request_refused = True
                log.warning("could not take the profile request (no trace taken): %s", e)
            return
        if text is None:
            return
        try:
            steps = int((json_object(text) or {}).get("steps", PROFILE_STEPS_DEFAULT))
        # A hand-written file is never fatal: `{"steps": 1e400}` is an OverflowError.
        except (ValueError, TypeError, OverflowError):
            steps = PROFILE_STEPS_DEFAULT
        steps = max(1, min(steps, PROFILE_STEPS_MAX))
        self._trace_steps.update(range(step + 1, step + 1 + steps))
        self._requested_steps.update(range(step + 1, step + 1 + steps))

    def _evaluate(self, step: int) -> None:
        if self.eval_data is None or not self.cluster.is_chief:
            return
        with self.trainer.eval_weights():
            sums = self._eval_sums(step)
        if sums is None or sums[2] == 0:
            return
        loss_sum, correct, count = sums
        metrics = {"loss": loss_sum / count, "accuracy": correct / count}
        self.summaries.scalars("eval", metrics, step)
        # How many examples the figures are over: `eval.batches` may read only the first of
        # them, which a figure alone does not say. And of which step: a stop during the
        # final eval skips it, and the job's result then carries an earlier one's.
        # Rounded as its eval line: the result's eval is the API's eval series' last point.
        loss, accuracy = significant(metrics["loss"]), accuracy_digits(metrics["accuracy"])
        self._last_eval = {"loss": loss, "accuracy": accuracy, "examples": int(count), "step": step}
        self.progress.write(
            "eval",
            step=step,
            total=self.total_steps,
            eval_loss=loss,
            eval_accuracy=accuracy,
            eval_examples=int(count),
            phase=self._phase_after("eval", step),
        )

    def _eval_sums(self, step: int) -> tuple[float, float, float] | None:
        """Loss sum, correct count and example count; None if a stop came first.

        Reports how many batches are done as it goes (`phase_done` of `phase_total`), so a
        long eval shows progress and is not taken for a hung worker.
        """
        assert self.eval_data is not None
        batches = int(self.eval_data.cardinality())  # finite and known: a batched range

        def report(done: int) -> None:
            self.progress.write(
                "phase",
                step=step,
                total=self.total_steps,
                phase="eval",
                phase_done=done,
                phase_total=batches,
            )

        report(0)
        last_report = time.monotonic()
        totals = np.zeros(3)
        for done, (images, labels) in enumerate(self.eval_data):
            if self.stop.is_set():  # a cancel must not wait out a long eval (and its SIGKILL)
                return None
            if time.monotonic() - last_report >= PROGRESS_EVERY_SECONDS:
                report(done)
                last_report = time.monotonic()
            totals += self.trainer.eval_step(images, labels).numpy()
        return float(totals[0]), float(totals[1]), float(totals[2])

    def _save(self, step: int) -> None:
        # Said before the save, which takes seconds for a large model, and not only after.
        self.progress.write("phase", step=step, total=self.total_steps, phase="checkpoint")
        # No checkpoint (nor the export after the last) holds a NaN a resume would load.
        if (name := first_non_finite(self.trainer.model.variables)) is not None:
            raise non_finite_weights(step, name, self.spec.summaries.scalars_every)
        path = self.checkpointer.save(step)
        self._checkpoint_path = str(Path(path).relative_to(self.rundir.root))
        self.summaries.flush()
        self.progress.write(
            "checkpoint",
            step=step,
            total=self.total_steps,
            checkpoint=self._checkpoint_path,
            phase=self._phase_after("checkpoint", step),
        )

    def _phase_after(self, phase: str, step: int) -> str:
        """The phase an eval's or a checkpoint's line, written as it ends, leaves the job
        in: training again, unless the job ends or stops (then the line after says what
        comes). A job checkpointing twice a second showed "checkpoint" most of the time."""
        return "training" if step < self.total_steps and not self.stop.is_set() else phase

    def _finish_cancelled(self, step: int, metrics: dict[str, float]) -> RunSummary:
        # A cluster's worker stops on the stop another worker was sent: its own event
        # too, so what it writes from here on (the checkpoint's phase) says it stops.
        self.stop.set()
        if self.trace.active:
            self._finish_trace(step)
        self._write_trace(wait=True)
        self._save(step)
        return RunSummary(Outcome.CANCELLED, step, metrics, self._last_eval, self._checkpoint_path)
