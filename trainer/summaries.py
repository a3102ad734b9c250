"""What a job writes to TensorBoard: scalars, histograms, images and the step's graph.

Event files are made lazily, one per sub-directory (`train`, `eval`), and a manager
without a logdir writes nothing, so callers never branch on whether summaries are on.

A process's files begin with a `SessionLog.START` at its first step (`start`): a run
resumed from a checkpoint older than where a killed worker got to (a crash retried, a
failed job resumed) writes those steps again, and TensorBoard's Python loader (the
service's, `--load_fast false`) drops what it read past a later START's step. Without it,
every chart went back from where the dead worker was to the checkpoint's step and drew
those steps twice.

Each tag carries its description (`trainer.descriptions`), which TensorBoard shows with
its chart. Scalars and histograms carry their metadata in a file's first value of a tag
only, as TensorFlow's own v1 writer did: TensorBoard takes a tag's metadata from its first
value and keeps it, and a description repeated in each of the 8,000 scalar values of 10k
default steps would triple the event file's scalars.

Cost is the point here: the defaults must take at most 3% of throughput, on a GPU step of
3 ms as on a CPU step of 36 ms. So no summary runs a TensorFlow op on the training loop
(but the activations' forward pass, the controller's, at histograms steps: `activations`):
- every summary is an `Event` protobuf built in Python and appended to its event file
  (a TFRecord file, TensorFlow's own record writer, about 6 µs with the flush);
  12 scalars cost 0.03 ms this way, against 0.25 ms through `write_raw_pb` with
  `make_tensor_proto` and 6.4 ms as eager `tf.summary.scalar` ops (a `tf.function` of
  summary ops costs about a second to trace, per job). Scalars, the one kind written
  every few steps, are encoded straight to the wire format once their tags are described
  (`scalars_event`): between a worker's steps, messages took 60 µs a call, this 26
  (8 in a loop of its own);
- histograms and images take only a host copy of their tensors on the loop; a background
  thread buckets the histograms (TensorBoard's stock op takes about 100 ms for 1.6M
  values here) and encodes the images' PNGs (on the CPU: on an H100 each new GPU kernel
  is compiled from PTX first, 0.6–1.5 s at a job's first images). On a GPU host that
  thread runs on a core the loop leaves idle, and costs the loop only the GIL it holds:
  so it buckets in numpy calls that release the GIL as they run (`histogram_buckets`).
  On a CPU host it shares the cores with training, so its work costs what it takes.
  At most `MAX_PENDING` calls wait for the thread; the next one waits for the oldest
  before it takes its copies.
Measured by `bench/towers_bench.py` and recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.compat.proto.summary_pb2 import SummaryMetadata
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from trainer.descriptions import describe

log = logging.getLogger(__name__)

HISTOGRAM_BUCKETS = 30
# Values bucketed at a time: a float64 copy of a chunk (8 MiB) at most, whatever the tensor.
BUCKETING_CHUNK = 1 << 20
# Calls handed to the background thread and not yet written; the next one waits for the
# oldest before it takes its host copies. Two, so that a step's histograms and its images
# do not wait on each other; the copies held stay at two calls' worth (13 MB for the
# `cnn`'s weights and gradients).
MAX_PENDING = 2

_file_serial = itertools.count()  # two files of one process in one second get two names


class _Metadata(Protocol):
    """A TensorBoard plugin's metadata module (`scalar_metadata`, `histogram_metadata`)."""

    def create_summary_metadata(self, display_name: str, description: str) -> SummaryMetadata: ...


class EventFile:
    """One event file: `Event` protobufs as TFRecords, the format TensorFlow's own writer
    makes (`tf.io.TFRecordWriter` frames and checksums them in C++). Every event is flushed
    as it is written (6 µs here), so TensorBoard shows a value once its call returns and a
    killed worker loses none. Shared by the loop and the background thread."""

    def __init__(self, directory: Path, start_step: int | None = None) -> None:
        """`start_step`: the writing process's first step, said as a `SessionLog.START`
        (see the module doc); None: not said."""
        directory.mkdir(parents=True, exist_ok=True)
        stamp = f"{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self.path = directory / f"events.out.tfevents.{stamp}.{next(_file_serial)}"
        self._records = tf.io.TFRecordWriter(str(self.path))
        self._lock = threading.Lock()
        self.write(event_pb2.Event(file_version="brain.Event:2"))
        if start_step is not None:
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self.write(event_pb2.Event(step=start_step, session_log=start))

    def write(self, event: event_pb2.Event) -> None:
        """Append `event`, stamped with the time now unless it has a time already."""
        event.wall_time = event.wall_time or time.time()
        self.write_serialized(event.SerializeToString())

    def write_serialized(self, data: bytes) -> None:
        """Append an `Event` already in its wire format."""
        with self._lock:
            self._records.write(data)
            self._records.flush()

    def close(self) -> None:
        with self._lock:
            self._records.close()


def histogram_buckets(values: np.ndarray, buckets: int = HISTOGRAM_BUCKETS) -> np.ndarray:
    """[buckets, 3] of (left edge, right edge, count), the histogram plugin's format: the
    buckets of `np.histogram(values, buckets)`, counted the same (a value on an edge goes
    to the bucket that edge opens; the last bucket holds the maximum too).

    Only finite values are counted: a NaN or infinity has no place on the axis (and
    `np.histogram` refuses a range that holds one: a gradient that overflowed at a step
    whose loss was still finite failed the job). A tensor of one value gets TensorBoard's
    own shape for it (`tf.summary.histogram`): every edge at the value, every count in the
    last bucket, so the distributions chart shows the value and not a spread from it to
    value + 1. No values (empty, or none finite): zeros, as TensorBoard writes them.
    """
    flat = np.asarray(values).ravel()
    if flat.dtype.kind not in "biuf":  # not a number type: as float64, or a clear error
        flat = flat.astype(np.float64)
    if not flat.size:
        return np.zeros((buckets, 3))
    # Float64 is exact for every value's order, so these are the minimum and maximum of
    # the float64 values `np.histogram` would see, without a float64 copy of the tensor.
    low, high = float(flat.min()), float(flat.max())
    if not (math.isfinite(low) and math.isfinite(high)):  # a NaN or infinity is min or max
        flat = flat[np.isfinite(flat)]
        if not flat.size:
            return np.zeros((buckets, 3))
        low, high = float(flat.min()), float(flat.max())
    if high == low:
        one = np.full((buckets, 3), low)
        one[:, 2] = 0.0
        one[-1, 2] = flat.size
        return one
    edges = _bucket_edges(low, high, buckets)
    counts = np.zeros(buckets + 1, np.int64)
    for start in range(0, flat.size, BUCKETING_CHUNK):
        chunk = flat[start : start + BUCKETING_CHUNK].astype(np.float64)
        # Each value's bucket: the last edge at or below it, by binary search; the maximum
        # lands one past the last bucket and is folded into it below. Not `np.histogram`,
        # which takes a third of this time but loops in Python over blocks of 65,536
        # values: it took the GIL back hundreds of times for the `cnn`'s 1.6M values, and
        # a training loop bound by its own launches (as a short GPU step is) ran a fifth
        # slower meanwhile. These are a few calls a chunk, each releasing the GIL as it
        # runs (bench/bucketing_bench.py; docs/benchmarks.md).
        found = np.searchsorted(edges, chunk, side="right")
        counts += np.bincount(found, minlength=buckets + 2)[1:]
    counts[buckets - 1] += counts[buckets]
    return np.stack([edges[:-1], edges[1:], counts[:buckets].astype(np.float64)], axis=1)


def _bucket_edges(low: float, high: float, buckets: int) -> np.ndarray:
    """`buckets` + 1 edges from `low` to `high` (low < high): `np.histogram`'s own where
    float64 can cut the range into `buckets` finite widths. Where it cannot (a range too
    narrow for its precision, or too wide to subtract), interpolated without overflow and
    kept in order, some buckets then empty or zero-wide."""
    if math.isfinite(high - low):
        edges = np.linspace(low, high, buckets + 1)
        if (edges[:-1] < edges[1:]).all():
            return edges
    t = np.arange(buckets + 1) / buckets
    return np.maximum.accumulate(low * (1.0 - t) + high * t)  # rounding: keep sorted


def _scalar_proto(value: float) -> tensor_pb2.TensorProto:
    """A float32 scalar, built directly: `make_tensor_proto` takes 13 µs for one."""
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[value])
    proto.tensor_shape.SetInParent()  # a scalar: a shape with no dimensions
    return proto


def _varint(value: int) -> bytes:
    """`value` (at least 0) as a protobuf varint: 7 bits a byte, low bits first."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=1024)
def _scalar_value_head(tag: str) -> bytes:
    """A `Summary.Value` of `tag` holding a float32 scalar tensor, as field 1 of a
    `Summary` in wire format, all but the value's 4 bytes: the tag (field 1), then the
    tensor (field 8): dtype DT_FLOAT (field 1), an empty shape (field 2: a scalar) and
    `float_val` packed (field 5), the fields `_scalar_proto` sets, in its order."""
    name = tag.encode()
    tensor = b"\x08\x01\x12\x00\x2a\x04"  # the float's 4 bytes follow
    value = b"\x0a" + _varint(len(name)) + name + b"\x42" + _varint(len(tensor) + 4) + tensor
    return b"\x0a" + _varint(len(value) + 4) + value


_FLOAT32 = struct.Struct("<f").pack
_DOUBLE = struct.Struct("<d").pack


def _float32_bytes(value: float) -> bytes:
    """`value` as a float32, as protobuf stores a float field: one too large for a float32
    is an infinity of its sign, where `struct` raises."""
    try:
        return _FLOAT32(value)
    except OverflowError:
        return _FLOAT32(math.copysign(math.inf, value))


def scalars_event(step: int, wall_time: float, values: Mapping[str, float]) -> bytes:
    """The `Event` (at `step`, `wall_time`) of float32 scalars `values`, with no metadata,
    in the wire format, encoded here and not built as protobuf messages: the same bytes
    as `Event(step=..., wall_time=..., summary=...)` of `_scalar_proto` values (tested).

    A job writes one every 10 steps by default, on the training loop: built as messages
    it took 60 µs a call between the steps of a worker here (17 µs in a loop of its own:
    the steps between evict its code and objects from the caches), and a loop bound by
    its launches pays all of it; this takes 26 (8 in a loop of its own). The fields:
    `wall_time` (1, a double), `step` (2, a varint; a negative int64 in two's
    complement), `summary` (5), whose values are `_scalar_value_head`'s."""
    summary = b"".join(
        _scalar_value_head(tag) + _float32_bytes(value) for tag, value in values.items()
    )
    # Proto3 leaves out a field at its default (a step of 0), and so does this.
    time_field = b"\x09" + _DOUBLE(wall_time) if wall_time else b""
    # `int`: a numpy integer (which protobuf takes) cannot be masked past its own width.
    step_field = b"\x10" + _varint(int(step) & 0xFFFF_FFFF_FFFF_FFFF) if step else b""  # int64
    return time_field + step_field + b"\x2a" + _varint(len(summary)) + summary


def _png_images(batch: np.ndarray) -> tensor_pb2.TensorProto:
    """The image plugin's tensor for a batch of [0, 1] images: width, height, then a PNG
    an image. Values in bytes as `tf.summary.image` makes them (`convert_image_dtype`:
    times 255.5, truncated); the PNGs by TensorFlow's encoder, on the CPU."""
    pixels = np.minimum(np.clip(batch, 0.0, 1.0) * np.float32(255.5), 255.0).astype(np.uint8)
    with tf.device("/CPU:0"):
        pngs = [tf.io.encode_png(image).numpy() for image in pixels]
    height, width = batch.shape[1:3]
    strings = [str(width).encode(), str(height).encode(), *pngs]
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=strings)
    proto.tensor_shape.dim.add(size=len(strings))
    return proto


def _host_copy(tensor: tf.Tensor | tf.Variable | np.ndarray) -> np.ndarray:
    """The values as they are now, on the host. A variable's `numpy()` outlives later
    updates: TensorFlow copies a variable's buffer before updating it while a read of it is
    alive (tested by tests/trainer/test_summaries.py)."""
    if isinstance(tensor, tf.Tensor | tf.Variable):
        return tensor.numpy()
    return np.asarray(tensor)


class SummaryManager:
    """Writes summaries under `logdir/<subdir>`; a no-op when `logdir` is None.

    `histograms` and `images` return once their host copies are taken; `flush` (at every
    checkpoint) and `close` wait for what they handed over, and raise what failed there."""

    def __init__(self, logdir: Path | None) -> None:
        self.logdir = logdir
        self._files: dict[str, EventFile] = {}
        self._start_step: int | None = None  # `start`'s
        self._start_steps: dict[str, int] = {}  # `start`'s, of a sub-directory of its own
        self._warned_nonfinite: set[str] = set()  # the background thread's alone
        # Per sub-directory, the tags its file has metadata for (see the module doc).
        self._described: dict[str, set[str]] = {}
        self._background: ThreadPoolExecutor | None = None
        # Each pending call, with the tags it was first to describe (see `_collect`).
        self._pending: deque[tuple[Future[None], str, list[str]]] = deque()

    def start(self, step: int, **firsts: int) -> None:
        """This process trains from `step` on: each event file it makes says so first, so
        that TensorBoard drops what an earlier process wrote from there on (see the module
        doc). `firsts`: a sub-directory's own first step, where this process writes it
        from another (a final eval written again). Before any summary is written."""
        self._start_step = step
        self._start_steps = dict(firsts)

    def open(self, subdir: str) -> None:
        """Make `subdir`'s event file now, not at its first summary: its START drops what
        an earlier process wrote from there on even where this one writes nothing more."""
        if self.logdir is not None:
            self._file(subdir)

    def _file(self, subdir: str) -> EventFile:
        assert self.logdir is not None
        if subdir not in self._files:
            start = self._start_steps.get(subdir, self._start_step)
            self._files[subdir] = EventFile(self.logdir / subdir, start)
        return self._files[subdir]

    def _add(
        self, summary: summary_pb2.Summary, subdir: str, tag: str, plugin: _Metadata
    ) -> summary_pb2.Summary.Value:
        """A value of `tag`, with its metadata if its file has none yet. On the loop's
        thread only: which value is a tag's first is decided in call order."""
        value = summary.value.add(tag=tag)
        described = self._described.setdefault(subdir, set())
        if tag not in described:
            described.add(tag)
            metadata = plugin.create_summary_metadata(
                display_name="", description=describe(subdir, tag)
            )
            value.metadata.CopyFrom(metadata)
        return value

    def _write(self, subdir: str, summary: summary_pb2.Summary, step: int) -> None:
        self._file(subdir).write(event_pb2.Event(step=step, summary=summary))

    def _hand_over(
        self, work: Callable[[], None], subdir: str, summary: summary_pb2.Summary
    ) -> None:
        """Run `work` on the background thread; a failure there is raised here, at the
        next call. The caller made room first (`_make_room`), before its host copies."""
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="summaries")
        described = [value.tag for value in summary.value if value.HasField("metadata")]
        self._pending.append((self._background.submit(work), subdir, described))

    def _make_room(self) -> None:
        """Wait for the oldest call while `MAX_PENDING` are in flight: so that a call takes
        its host copies only once there is room for them."""
        self._collect(keep=MAX_PENDING - 1)

    def _collect(self, keep: int = 0) -> None:
        """Wait until at most `keep` handed-over calls are pending; raise the first failure.
        The tags a failed call was first to describe are described again by the next
        value: its event, and their metadata with it, never reached the file."""
        while self._pending and (len(self._pending) > keep or self._pending[0][0].done()):
            future, subdir, described = self._pending.popleft()
            if future.exception() is not None:
                self._described.get(subdir, set()).difference_update(described)
            future.result()

    def scalars(self, subdir: str, values: Mapping[str, float], step: int) -> None:
        if self.logdir is None:
            return
        if self._described.get(subdir, set()).issuperset(values):
            # No tag's first value in this file, so no metadata: every call after a file's
            # first (see `scalars_event`).
            self._file(subdir).write_serialized(scalars_event(step, time.time(), values))
            return
        summary = summary_pb2.Summary()
        for tag, value in values.items():
            self._add(summary, subdir, tag, scalar_metadata).tensor.CopyFrom(
                _scalar_proto(float(value))
            )
        self._write(subdir, summary, step)

    def histograms(
        self,
        subdir: str,
        tensors: Mapping[str, tf.Tensor | tf.Variable | np.ndarray],
        step: int,
        zero_fractions: Mapping[str, str] | None = None,
    ) -> None:
        """One histogram per tensor, bucketed on the background thread; and for each tag
        of `zero_fractions` (a histogram's tag to a scalar's), the fraction of its values
        that are exactly 0, counted there too (a pass over the values it copied)."""
        if self.logdir is None:
            return
        zero_fractions = zero_fractions or {}
        self._make_room()
        summary, wall_time = summary_pb2.Summary(), time.time()
        copies = []
        for tag, tensor in tensors.items():
            value = self._add(summary, subdir, tag, histogram_metadata)
            zero_tag = zero_fractions.get(tag)
            zeros = self._add(summary, subdir, zero_tag, scalar_metadata) if zero_tag else None
            copies.append((value, tag, _host_copy(tensor), zeros))
        file = self._file(subdir)

        def work() -> None:
            for value, tag, values, zeros in copies:
                if zeros is not None:
                    # Of no values (a layer of none), none is 0.
                    fraction = np.count_nonzero(values == 0) / max(values.size, 1)
                    zeros.tensor.CopyFrom(_scalar_proto(fraction))
                buckets = histogram_buckets(values)
                if tag not in self._warned_nonfinite and (
                    dropped := values.size - buckets[:, 2].sum()
                ):
                    # Once a tag: the log says why its histogram holds fewer values than
                    # the tensor.
                    self._warned_nonfinite.add(tag)
                    log.warning(
                        "%s holds %d NaN or infinite values at step %d; its histogram counts "
                        "the finite ones (said once)",
                        tag, int(dropped), step,
                    )  # fmt: skip
                value.tensor.CopyFrom(tensor_util.make_tensor_proto(buckets))
            file.write(event_pb2.Event(step=step, wall_time=wall_time, summary=summary))

        self._hand_over(work, subdir, summary)

    def images(
        self,
        subdir: str,
        images: Mapping[str, tf.Tensor | np.ndarray],
        step: int,
        max_images: int,
    ) -> None:
        """Up to `max_images` images a tag, values clipped to [0, 1], encoded on the
        background thread. One channel shows as grayscale, three as RGB; four show their
        first three as RGB, since TensorBoard would take the fourth for alpha and hide every
        pixel where it is low (to a model it is data: depth, infrared, or an alpha it reads
        as any channel); any other count shows channel 0."""
        if self.logdir is None:
            return
        self._make_room()
        summary, wall_time = summary_pb2.Summary(), time.time()
        batches = []
        for tag, batch in images.items():
            pixels = np.array(batch[:max_images])  # a copy of these alone, not of the batch
            if pixels.shape[-1] == 4:
                pixels = pixels[..., :3]
            elif pixels.shape[-1] not in (1, 3):
                pixels = pixels[..., :1]
            batches.append((self._add(summary, subdir, tag, image_metadata), pixels))
        file = self._file(subdir)

        def work() -> None:
            for value, pixels in batches:
                value.tensor.CopyFrom(_png_images(pixels))
            file.write(event_pb2.Event(step=step, wall_time=wall_time, summary=summary))

        self._hand_over(work, subdir, summary)

    def hparams(self, values: Mapping[str, bool | float | str], trial: str) -> None:
        """The job's hyperparameters (`trainer.hparams`), in the logdir itself: TensorBoard's
        HParams dashboard makes a folder holding them one session, with the runs below it
        (`train`, `eval`) as its metrics. `trial`: the session's name (the job's folder)."""
        if self.logdir is None:
            return
        summary = hparams_summary.hparams_pb(
            dict(values), trial_id=trial, start_time_secs=time.time()
        )
        self._file("").write(event_pb2.Event(step=0, summary=summary))

    def graph(self, subdir: str, graph: tf.Graph) -> None:
        if self.logdir is None:
            return
        graph_def = graph.as_graph_def().SerializeToString()
        self._file(subdir).write(event_pb2.Event(step=0, graph_def=graph_def))

    def flush(self) -> None:
        """Wait for the calls handed to the background thread (each event is on disk once
        written)."""
        self._collect()

    def close(self) -> None:
        """Wait for the background thread, then close every file; a failure there is
        raised after the files are closed."""
        try:
            self._collect()
        finally:
            # After a failure, the calls left still run (the shutdown waits for them, so
            # the files close after their writes), but their own failures are dropped.
            self._pending.clear()
            if self._background is not None:
                self._background.shutdown(wait=True)
                self._background = None
            for file in self._files.values():
                file.close()
            self._files.clear()
            self._described.clear()  # a file made after this starts with metadata again


def variable_tag(name: str) -> str:
    """A TensorBoard-friendly tag for a variable path (`dense/kernel` stays as it is)."""
    return name.replace(":", "_")
