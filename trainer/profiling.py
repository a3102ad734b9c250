"""Device traces: capture with TensorFlow's profiler, and read each tower's time from them.

A capture writes `tb/plugins/profile/<run>/<host>.xplane.pb`, which TensorBoard's profile
plugin shows (trace viewer, one row per device thread, ops named `tower_i/...`). Each
tower's compute time is the sum of the durations of its ops in that trace, forward and
backward, per traced step: measured, never estimated (on a GPU, its kernels' time on the
device).

Ending a capture (`TraceCapture.end`) is off the training loop: the loop stops marking
steps at once, and a background thread stops the profiler (which collects and writes the
trace: some 40 ms on an H200 host), names its folder by the steps and reads the towers'
times from it, while the loop goes on launching steps. So the profiler records a few steps
past the traced ones; the times count only the traced steps' window, which their step
markers (`train`, `step_num`) bound.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NamedTuple

import tensorflow as tf

log = logging.getLogger(__name__)

# A tower's ops: its forward pass under `tower_<i>/`, and its backward pass, which the
# gradient tape names `gradient_tape/tower_<i>/...` (two thirds of a step's compute: leaving
# it out made `compute_ms` a third of the tower's time). Under a tf.distribute strategy
# (trainer/multiworker.py) the second and later towers of a worker sit inside its
# `replica_<k>/` scope, on either side of the tape's. Eval ops (`eval/tower_<i>/`) never match.
_TOWER_OP = re.compile(r"^(?:replica_\d+/)?(?:gradient_tape/)?(?:replica_\d+/)?tower_(\d+)/")


# The profiler's own name for a capture's folder: the local time it was written,
# `2026_11_22_10_42_17`; a capture named by its steps has `_steps_20-22` after it.
_PROFILER_RUN = re.compile(r"\d{4}(?:_\d\d){5}")


# The marker the loop puts around each traced step (`Controller._step`), and its stat.
STEP_MARKER = "train"
_STEP_NUM = "step_num"
_HOST_PLANE = "/host:CPU"


def _xplane_pb2():  # noqa: ANN202 - generated protobuf module
    # The XPlane schema ships inside TensorFlow; importing it lazily keeps module import cheap.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2


class TraceTimes(NamedTuple):
    """What an ended capture gave: its trace file, and each tower's time a traced step,
    or (`tower_ms` None) why the trace gave no times (`error`)."""

    path: Path
    tower_ms: list[float] | None
    error: str | None = None


class TraceCapture:
    """Starts and stops the profiler; never fatal (a failure is logged and training goes on)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.active = False
        # The traces under the profiler's own folder names when the capture started: the
        # one it writes is the one not among them.
        self._before: set[Path] = set()
        # The wall-clock second the last capture left under the profiler's own folder name
        # was written in (see `stop`).
        self._unnamed_second = -1
        # The thread `end` hands a capture's stop and reading to (made at the first), and
        # the last capture it was handed.
        self._thread: ThreadPoolExecutor | None = None
        self._ending: Future[TraceTimes | None] | None = None

    def start(self) -> bool:
        if self.active:
            return True
        # The profiler takes one session at a time: a stop still in flight ends first.
        self.wait()
        self._before = self._unnamed_traces()
        try:
            options = tf.profiler.experimental.ProfilerOptions(
                host_tracer_level=2, python_tracer_level=0, device_tracer_level=1
            )
            tf.profiler.experimental.start(str(self.logdir), options=options)
        except Exception as e:  # noqa: BLE001 - optional I/O must not stop training
            log.warning("could not start the profiler: %s", e)
            return False
        self.active = True
        return True

    def stop(self, steps: tuple[int, int] | None = None) -> Path | None:
        """Stop, and return the trace file written (None if there is none).

        `steps`, the first and last step traced, go into the capture's folder name, which is
        the run TensorBoard's profile plugin lists: `2026_11_22_10_42_17_steps_20-22` says
        which steps it holds, where the profiler's own name is a time and no more.
        """
        if not self.active:
            return None
        self.active = False
        return self._stop(steps)

    def end(self, steps: range, towers: int, on_gpus: bool = False) -> Future[TraceTimes | None]:
        """Stop capturing, and read each tower's time of the traced `steps` from the trace:
        `TraceTimes`; without times where the trace was written but they cannot be read
        (the reason in its `error`), or None where no trace was written (both logged,
        never raised).

        For the loop, the capture ends at once (`active` is False: the steps after are
        not marked). The rest runs on a background thread: stopping the profiler (it
        collects and writes the trace, releasing the GIL while it does), naming its folder
        (`stop`) and reading the times (`tower_times_ms`), while the loop goes on. The
        next `start` waits for it, and `close` joins the thread.
        """
        assert self.active, "end() of a capture that is not running"
        self.active = False
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-stop")
        self._ending = self._thread.submit(self._stop_and_read, steps, towers, on_gpus)
        return self._ending

    def wait(self) -> None:
        """Wait for the stop `end` handed over, if one is still in flight."""
        if self._ending is not None:
            wait([self._ending])

    def close(self) -> None:
        """Join the background thread (a stop in flight ends first): no profiler stop may
        run on while the interpreter shuts down. The next `end` makes another."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def _stop_and_read(self, steps: range, towers: int, on_gpus: bool) -> TraceTimes | None:
        """`end`'s work, on its thread. Any failure is logged, never raised: a trace we
        cannot stop or read must not stop training. A trace written but not read (no
        CUPTI on a GPU host, no step markers) is still one: its line says so and why, so a
        page that asked for it is answered rather than left waiting."""
        try:
            path = self._stop((steps[0], steps[-1]) if steps else None)
        except Exception as e:  # noqa: BLE001
            log.warning("could not stop the profiler and name its trace: %s", e)
            return None
        if path is None or not steps:
            return None
        try:
            return TraceTimes(path, tower_times_ms(path, towers, steps, on_gpus=on_gpus))
        except Exception as e:  # noqa: BLE001
            log.warning("could not read the trace %s: %s", path, e)
            return TraceTimes(path, None, str(e) or type(e).__name__)

    def _stop(self, steps: tuple[int, int] | None) -> Path | None:
        # The profiler names a capture's folder by the wall-clock second it stops in, so a
        # capture that stops within the second of one still under that name would write
        # over it (steps 200-201 of a job, with an eval between, were lost to a trace of
        # 204-205). A capture named by its steps has left that name by now, so only one
        # that was not (no steps given, or its renaming failed) is waited out: up to a
        # second, which trace steps 100 and 200 of a 4 ms GPU step paid on the loop every
        # time before captures were named (on `end`'s thread now, the loop would not).
        left = self._unnamed_second + 1 - time.time()
        if left > 0:
            time.sleep(left + 0.01)
        try:
            tf.profiler.experimental.stop()
        except Exception as e:  # noqa: BLE001
            log.warning("could not stop the profiler: %s", e)
            return None
        finally:
            stopped_second = math.floor(time.time())
        written = self._unnamed_traces() - self._before
        if not written:
            # No `trace` line comes of it: the log is all that says why a page that asked
            # for this trace is not answered.
            which = "" if steps is None else f" of {_steps_text(*steps)}"
            log.warning("the profiler wrote no trace%s under %s", which, self.logdir)
            return None
        trace = max(written, key=lambda p: p.stat().st_mtime)
        if steps is None:
            self._unnamed_second = stopped_second
            return trace
        first, last = steps
        label = _steps_text(first, last, "_")
        # The time stays first, so the plugin's runs still sort by when they were taken.
        named = trace.parent.with_name(f"{trace.parent.name}_{label}")
        try:
            trace.parent.rename(named)
        except OSError as e:  # the trace under the profiler's name is still a trace
            log.warning("could not name the trace %s by its steps: %s", trace.parent, e)
            self._unnamed_second = stopped_second
            return trace
        return named / trace.name

    def _unnamed_traces(self) -> set[Path]:
        """The trace files in folders the profiler named (the time they were written)."""
        return {
            path
            for path in self.logdir.glob("plugins/profile/*/*.xplane.pb")
            if _PROFILER_RUN.fullmatch(path.parent.name)
        }


def tower_times_ms(trace: Path, towers: int, steps: range, on_gpus: bool = False) -> list[float]:
    """Per traced step, the milliseconds each tower's ops ran in the traced `steps`,
    summed from the trace.

    On a GPU the time is the kernels' time on the device: each kernel event of a
    `/device:GPU:N` plane carries the TensorFlow op that launched it in its `tf_op` stat.
    The host's events for those ops only time their launch, so where the GPU planes name
    any tower, they alone count. Without GPUs (towers on logical CPU devices) each op runs
    on the host, and its host event is its compute time.

    Only the events that start inside the traced steps' window count: from the earliest
    start to the latest end of their step markers (`Controller._step` wraps each traced
    step, the read of its loss included, in a `train` event with its `step_num`). The
    profiler records on until `TraceCapture.end`'s thread stops it, so the trace holds
    ops of the steps launched after the traced ones too. By start, not end: a GPU kernel
    ends before the loss read that waits for it, inside the marker, and an op is not lost
    to a clock conversion that puts its end a hair past it.

    Raises `ValueError` where the trace has no marker of these steps. Counting all of it
    instead would add the steps after the traced ones, as many as the loop launched
    while the profiler stopped, to the traced ones' time: a figure too high by an amount
    nobody could tell. The loop marks every traced step, so a trace without markers is
    not one of its own, and gives no times.

    `on_gpus`: the towers ran on GPUs, so a trace without their kernels (the profiler
    could not load CUPTI, and TensorFlow only logs that) has no compute time to give:
    its host events would pass launch times off as compute. Raises `ValueError` then.
    """
    space = _xplane_pb2().XSpace()
    space.ParseFromString(trace.read_bytes())
    begin, end = _steps_window(space, steps)
    kernels, on_host = [0] * towers, [0] * towers
    for plane in space.planes:
        is_gpu = plane.name.startswith("/device:GPU:")
        totals = kernels if is_gpu else on_host
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        tf_op = next((key for key, name in stat_names.items() if name == "tf_op"), None)
        # A host event's op is its metadata's name: matched once a name, not once an event.
        host_tower = {key: _tower_index(meta.name) for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            # An event's time is its line's (ns) plus its offset (ps). A GPU plane's kernel
            # events are on the host's clock too: TensorFlow's CUPTI collector converts
            # them, which is how the trace viewer lines them up with the host's rows (not
            # checked on a GPU here: none on this project's test host).
            line_ps = line.timestamp_ns * 1000
            for event in line.events:
                tower = (
                    _tower_index(_gpu_op_name(event, tf_op, stat_names))
                    if is_gpu
                    else host_tower.get(event.metadata_id)
                )
                if (
                    tower is not None
                    and tower < towers
                    and begin <= line_ps + event.offset_ps <= end
                ):
                    totals[tower] += event.duration_ps
    if on_gpus and not any(kernels):
        raise ValueError(
            "Expected the trace to hold the towers' GPU kernels. Received: none (the "
            "profiler records them through CUPTI; see the worker's log for why it could not "
            "load it). No compute times from this trace: its host events only time launches"
        )
    total_ps = kernels if any(kernels) else on_host
    return [round(ps / 1e9 / max(len(steps), 1), 3) for ps in total_ps]


def _steps_window(space, steps: range) -> tuple[int, int]:  # noqa: ANN001 - an XSpace
    """The earliest start and latest end (ps) of the host's step markers of `steps`."""
    begin, end = None, None
    for plane in space.planes:
        if plane.name != _HOST_PLANE:
            continue
        markers = {key for key, meta in plane.event_metadata.items() if meta.name == STEP_MARKER}
        step_num = next(
            (key for key, meta in plane.stat_metadata.items() if meta.name == _STEP_NUM), None
        )
        for line in plane.lines:
            line_ps = line.timestamp_ns * 1000
            for event in line.events:
                if event.metadata_id in markers and any(
                    stat.metadata_id == step_num and _stat_int(stat) in steps
                    for stat in event.stats
                ):
                    start = line_ps + event.offset_ps
                    stop = start + event.duration_ps
                    begin = start if begin is None else min(begin, start)
                    end = stop if end is None else max(end, stop)
    if begin is None or end is None:
        which = _steps_text(steps[0], steps[-1]) if steps else "no steps"
        raise ValueError(
            f"Expected the trace's {_HOST_PLANE} plane to mark {which} ('{STEP_MARKER}' "
            f"events with a {_STEP_NUM}). Received: no marker of them. No compute times from "
            "this trace: the profiler records past the traced steps, so without their "
            "window it cannot tell their ops from the next steps'"
        )
    return begin, end


def _steps_text(first: int, last: int, space: str = " ") -> str:
    """`steps 20-22`, or `step 20` for one: in messages, and with `_` for `space` in the
    name of a trace's folder (`..._steps_20-22`), which the profile plugin lists."""
    return f"step{space}{last}" if first == last else f"steps{space}{first}-{last}"


def _stat_int(stat) -> int | None:  # noqa: ANN001 - an XStat
    """An integer stat's value (TensorFlow writes `step_num` as an int64), else None."""
    kind = stat.WhichOneof("value")
    return getattr(stat, kind) if kind in ("int64_value", "uint64_value") else None


@functools.lru_cache(maxsize=4096)
def _tower_index(name: str) -> int | None:
    """The tower whose op an event name is, or None. Cached: a trace names the same few
    hundred ops in thousands of events."""
    match = _TOWER_OP.match(name)
    return int(match.group(1)) if match else None


def _gpu_op_name(event, tf_op: int | None, stat_names: dict[int, str]) -> str:  # noqa: ANN001 - an XEvent
    """The TensorFlow op a GPU kernel event ran for (its `tf_op` stat), or ''."""
    for stat in event.stats:
        if stat.metadata_id == tf_op:
            return stat.str_value or stat_names.get(stat.ref_value, "")
    return ""


def trace_op_names(trace: Path) -> set[str]:
    """Every event name in a trace (tests look for the towers' names here)."""
    space = _xplane_pb2().XSpace()
    space.ParseFromString(trace.read_bytes())
    return {meta.name for plane in space.planes for meta in plane.event_metadata.values()}
