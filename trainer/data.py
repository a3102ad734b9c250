"""Training data: load a spec's examples into memory, and feed them as tf.data pipelines.

Every format is read whole into numpy arrays (`load_arrays`), checked once, and then fed
by index (`train_dataset`): the pipeline's state is a few counters, never images, so a
`tf.train.Checkpoint(iterator=...)` of it is about a kilobyte and a restored iterator
continues with exactly the batches the old one would have given.

The arrays are made where TensorFlow can take them without a copy (`trainer.hostarrays`):
IDX files and .npz members are read straight into them, and conversions write into them,
so the pipelines share the loaded images and a job holds them once, from its start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

import numpy as np
import tensorflow as tf

from trainer import hostarrays, tfexample
from trainer.datafiles import (
    ZIP_READ_ERRORS,
    DataFiles,
    DataFilesError,
    check_tfrecord_framing,
    dtype_problem,
    idx_pair_problem,
    idx_size_problem,
    no_records,
    npz_array_names,
    open_idx,
    read_idx_header,
    read_npy_header,
    resolve_files,
    shape_problem,
    tfrecord_compressed,
    tfrecord_hint,
    unreadable_tfrecord,
)
from trainer.errors import op_reason
from trainer.memory import NotEnoughMemory, available_bytes, check_read
from trainer.preparing import CHECKING, JOINING, LOADING, Preparation
from trainer.spec import AugmentSpec, DataSpec, SyntheticParams

log = logging.getLogger(__name__)

# Class ids must lie below this: the output layer has one logit per id up to the largest.
MAX_CLASSES = 100_000


class DataError(ValueError):
    """A data file is unreadable or its contents break the format's contract."""


@dataclass(frozen=True, eq=False)
class Arrays:
    """A whole data set in memory.

    `x_*` have shape (N, H, W, C) and dtype uint8 (pixels 0-255, scaled when fed) or
    float32 (already in [0, 1]); `y_*` are int32 class ids in [0, num_classes).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    num_classes: int

    @property
    def image_shape(self) -> tuple[int, int, int]:
        height, width, channels = self.x_train.shape[1:]
        return height, width, channels

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_eval(self) -> int:
        return len(self.y_eval)

    @property
    def label_range(self) -> tuple[int, int]:
        """The smallest and largest label of the train and eval examples (of a set with a
        training example, as `load_arrays` gives)."""
        low = min(self.y_train.min(), self.y_eval.min(initial=self.y_train[0]))
        high = max(self.y_train.max(), self.y_eval.max(initial=self.y_train[0]))
        return int(low), int(high)

    def summary(self) -> dict[str, Any]:
        """What a job trains and evaluates on, for its start line (and the service's status):
        example counts, classes and the image shape, as its log says them."""
        return {
            "train_examples": self.num_train,
            "eval_examples": self.num_eval,
            "classes": self.num_classes,
            "image_shape": list(self.image_shape),
        }

    def without_images(self) -> Arrays:
        """The same set with its images dropped (its labels and shapes kept): once the
        input pipelines hold the images, these are at best a second reference to them, and
        at worst (an array TensorFlow had to copy) a second copy for the run."""
        height, width, channels = self.image_shape
        return dataclasses.replace(
            self,
            x_train=np.empty((0, height, width, channels), self.x_train.dtype),
            x_eval=np.empty((0, height, width, channels), self.x_eval.dtype),
        )


def load_arrays(data: DataSpec, seed: int, preparation: Preparation | None = None) -> Arrays:
    """Reads (or, for synthetic data, generates from `seed`) the examples `data` names.

    Where the files give no eval data, the last `eval_fraction` of the train examples,
    in file order, is held out: floor(N * eval_fraction), and always leaving one to train.

    TFRecord files have every record header walked (`check_tfrecord_framing`) before any
    is loaded, so a damaged last file fails the job before minutes of loading the others.

    `preparation` is told the stages and how far each is (`_Meter`): for TFRecord files,
    `checking data`, bytes of the files on disk walked (after each 1 MiB piece the walk
    reads, a gzip'd file's compressed bytes); `loading data`,
    bytes of the files on disk, from 0 as each file's arrays or records are read (every
    16 MiB of an array, every 256 records) to the whole once every file is read; then,
    where several files' examples are joined into one array, `joining data`, bytes of
    their images copied (every 64 MiB). Its `amount` is called that often, and writes a
    line at most once a second.

    Raises:
        DataFilesError: the path names no usable files (see `trainer.datafiles`).
        DataError: a file is unreadable or inconsistent (counts, dims, labels < 0, no
            training examples).
        NotEnoughMemory: a file's arrays would not fit in this host's memory (not the
            job's fault: `trainer.run` fails it with exit 1, not 2).
    """
    if data.format == "synthetic":
        if preparation is not None:
            preparation.stage(LOADING)
        arrays = _synthetic(SyntheticParams.model_validate(data.params), data.eval_fraction, seed)
        _log_loaded(arrays, "synthetic data", None, data.eval_fraction)
        return arrays
    files = resolve_files(data)
    meter = _Meter(files, preparation)
    framing = _check_framing(files, meter) if data.format == "tfrecord" else {}
    meter.begin(LOADING)
    train, evals = _read_files(data.format, files, meter, framing)
    train_files = len(train)
    eval_sources = [chunk.source for chunk in evals] if evals else None
    meter.joining(train, evals)
    x_train, y_train = _concatenate(train, meter)  # empties `train`, and `evals` below
    if eval_sources is not None:
        x_eval, y_eval = _concatenate(evals, meter)
        if x_eval.shape[1:] != x_train.shape[1:]:
            raise DataError(
                "Expected eval images of the train image shape "
                f"{tuple(x_train.shape[1:])}. Received: {tuple(x_eval.shape[1:])} "
                f"({', '.join(eval_sources)})"
            )
        if x_eval.dtype != x_train.dtype:  # one uint8, one float: feed both as float
            x_train, x_eval = _as_float(x_train), _as_float(x_eval)
    else:
        keep = len(y_train) - _held_out_count(len(y_train), data.eval_fraction)
        x_train, x_eval = hostarrays.split(x_train, keep)
        y_train, y_eval = y_train[:keep], y_train[keep:]
    if len(y_train) == 0:
        raise DataError(
            "Expected at least one training example. Received: 0 examples in "
            f"{', '.join(str(path) for path in files.train)}"
        )
    num_classes = max(2, int(max(y_train.max(), y_eval.max(initial=0))) + 1)
    arrays = Arrays(x_train, y_train, x_eval, y_eval, num_classes)
    _log_loaded(arrays, f"{train_files} file(s) in {data.path}", eval_sources, data.eval_fraction)
    # Shards named without a suffix (`train-00000-of-00002`) beside a `train.tfrecord`
    # were left out without a word: the job trained on fewer examples than the folder held.
    if (skipped := files.skipped_note()) is not None:
        log.warning("%s", skipped)
    return arrays


def _log_loaded(
    arrays: Arrays, source: str, eval_sources: list[str] | None, eval_fraction: float
) -> None:
    """Says in the job's log what it trains and evaluates on: the first place to look when
    a number looks wrong (eval files taken as training data, a shape not as expected)."""
    height, width, channels = arrays.image_shape
    if eval_sources is not None:
        held_out = f"from {', '.join(eval_sources)}"
    elif eval_fraction:
        held_out = f"held out: the last {eval_fraction:.10g} of the examples"
    else:
        held_out = "none held out: eval_fraction 0"
    log.info(
        "data: %d train and %d eval examples (%s) of %dx%dx%d %s pixels, %d classes, from %s",
        arrays.num_train,
        arrays.num_eval,
        held_out,
        height,
        width,
        channels,
        arrays.x_train.dtype,
        arrays.num_classes,
        source,
    )
    if channels > 4 and height <= 4 < width:
        # (N, 3, 32, 32), PyTorch's layout, reads as 3-pixel-high images of 32 channels:
        # it trains, on nonsense. Not refused, as the shape could be meant.
        log.warning(
            "images of %dx%dx%d (height x width x channels) look channels-first; the "
            "layout is (N, H, W, C): transpose them, e.g. x.transpose(0, 2, 3, 1)",
            height,
            width,
            channels,
        )
    if arrays.x_train.dtype == np.uint8 and arrays.x_train.size and arrays.x_train.max() == 1:
        # Masks saved as (x > 0).astype(int): integers are read as 0-255, so they train as
        # images of 1/255 at most, while the same array saved as bool trains as 0.0/1.0.
        log.warning(
            "integer pixels are 0 and 1 only: integers are read as 0-255, so these images "
            "are fed as nearly black (1/255 at most); save them as bool or float32 in [0, 1], "
            "or as 0 and 255"
        )
    unseen = np.setdiff1d(arrays.y_eval, arrays.y_train)
    if unseen.size:
        # Files of one class each, or examples sorted by class, hold out whole classes the
        # model never trains on: its eval accuracy then says nothing, without a word.
        classes = ", ".join(str(c) for c in unseen[:10])
        if unseen.size > 10:
            classes += f" and {unseen.size - 10} more"
        count = int(np.isin(arrays.y_eval, unseen).sum())
        log.warning(
            "%d of %d eval examples are of classes no training example has (%s)%s",
            count,
            arrays.num_eval,
            classes,
            ""
            if eval_sources is not None
            else f": the last {eval_fraction:.10g} of the examples, in file order, is held out; "
            "shuffle the examples across files, or give eval data (`x_eval`/`y_eval`, eval "
            "files)",
        )
    if source != "synthetic data":  # whose classes are its params', not its labels'
        _warn_of_classes_without_examples(arrays)
    if arrays.num_eval == 0 and (eval_sources is not None or eval_fraction > 0):
        # Not an error (a tiny set may have nothing to spare), but the user asked for an eval.
        log.warning(
            "no eval examples (%s): the job runs no eval",
            "its eval arrays or files are empty"
            if eval_sources is not None
            else f"eval_fraction {eval_fraction:.10g} of {arrays.num_train} examples is less than one",
        )


def _warn_of_classes_without_examples(arrays: Arrays) -> None:
    """Warns of class ids below the class count that no example has. The count is the
    largest label + 1: labels 1 and 2 make three classes, one (0) never seen, which trains
    a third output on nothing, and `logistic` refuses as not two-class."""
    counts = np.bincount(arrays.y_train, minlength=arrays.num_classes)
    counts += np.bincount(arrays.y_eval, minlength=arrays.num_classes)
    missing = np.flatnonzero(counts == 0)
    if not missing.size:
        return
    classes = ", ".join(str(c) for c in missing[:10])
    if missing.size > 10:
        classes += f" and {missing.size - 10} more"
    low = int(np.flatnonzero(counts)[0])
    log.warning(
        "%d of %d classes have no example (%s): class ids count from 0, and the class count "
        "is the largest label + 1 (2 at least)%s",
        missing.size,
        arrays.num_classes,
        classes,
        f"; the labels begin at {low}: give labels from 0 (e.g. y - {low})" if low else "",
    )


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Batches in one epoch; the last one is partial when `batch_size` does not divide."""
    _check_batch_size(batch_size)
    return math.ceil(num_examples / batch_size)


def train_dataset(arrays: Arrays, data: DataSpec, batch_size: int, seed: int) -> tf.data.Dataset:
    """Endless `(x float32 [b, H, W, C] in [0, 1], y int32 [b])` batches of training data.

    Each epoch is a fresh permutation of all examples, batched with a partial last batch.
    Everything random is a stateless function of `seed` and a position (the epoch for the
    order, the batch counter for augmentations), so results never depend on threading or
    TF's global seed, and a restored iterator continues exactly.

    The permutation is TensorFlow's index shuffle (`_epoch_order`), not `Dataset.shuffle`:
    a shuffle buffer is serialized element by element (about 1.9 MB for 10,000 indices),
    while this needs no state. It is a full shuffle, as a buffer of at least N would
    give; `data.shuffle_buffer` is not needed for data held in memory, so it is unused.
    """
    _check_batch_size(batch_size)
    n = arrays.num_train
    if n == 0:
        raise ValueError("Expected at least one training example. Received: 0")
    per_epoch = steps_per_epoch(n, batch_size)
    gather = _gatherer(arrays.x_train, arrays.y_train)
    augment = _augmenter(data.augment)
    base_seed = tf.constant(seed, tf.int64)

    def make_batch(counter: tf.Tensor, positions: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        epoch = counter // per_epoch
        indices = _epoch_order(positions, tf.stack([base_seed, epoch]), n)
        x, y = gather(indices)
        if augment is not None:
            x = augment(x, tf.stack([base_seed, counter]))
        return x, y

    dataset = (
        tf.data.Dataset.range(n)
        .batch(batch_size)
        .repeat()
        .enumerate()
        .map(make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return dataset.with_options(_pipeline_options())


def eval_dataset(arrays: Arrays, batch_size: int, batches: int | None = None) -> tf.data.Dataset:
    """The eval examples once, in order, unaugmented, with a partial last batch.

    `batches` limits it to the first that many batches (cut before the gather, so no batch
    is made only to be thrown away).
    """
    _check_batch_size(batch_size)
    gather = _gatherer(arrays.x_eval, arrays.y_eval)
    count = arrays.num_eval if batches is None else min(arrays.num_eval, batches * batch_size)
    dataset = (
        tf.data.Dataset.range(count)
        .batch(batch_size)
        .map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return dataset.with_options(_pipeline_options())


# --- feeding -------------------------------------------------------------------------


def _epoch_order(positions: tf.Tensor, seed: tf.Tensor, n: int) -> tf.Tensor:
    """The examples at `positions` of the epoch whose order `seed` draws: a permutation of
    range(n), computed for those positions alone."""
    # Not `tf.random.experimental.index_shuffle`: it takes two seed words and adds a fixed
    # third, and its cipher keeps only as many bits of each word as half its block (8 bits
    # below 65,536 examples). Fed `stateless_fold_in`'s [random, 0], every job drew from
    # the same 256 orders, and epochs repeated each other's order exactly. Three random
    # words give at least 2**24 orders; 8 rounds (TensorFlow's own advice; the wrapper's 4)
    # spread small sets evenly.
    key = tf.random.stateless_uniform([3], seed, minval=None, maxval=None, dtype=tf.int64)
    return tf.raw_ops.RandomIndexShuffle(
        index=positions, seed=key, max_index=tf.constant(n - 1, tf.int64), rounds=8
    )


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(
            f"Expected `batch_size` to be a positive int. Received: batch_size={batch_size}"
        )


def _pipeline_options() -> tf.data.Options:
    options = tf.data.Options()
    # Without this, a checkpoint also stores the batches waiting in the map and prefetch
    # buffers (8 MB for 28x28 batches of 256, far more for large images). Every batch is
    # a pure function of the position, so saving positions and recomputing is exact.
    options.experimental_symbolic_checkpoint = True
    # tf.data's default graph rewrites serialize the pipeline, the images it captures
    # included, and rebuild it: one more copy of every image for the whole run (measured:
    # 330 MB more for 328 MB of images). None of them has anything to do here: the map is
    # parallel, prefetch is there, and nothing is fused or removed. Autotuning stays on.
    options.experimental_optimization.apply_default_optimizations = False
    return options


def _gatherer(x: np.ndarray, y: np.ndarray) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """A function from a batch of example indices to its `(x float32, y int32)` batch."""
    # The loaded arrays themselves, shared with TensorFlow (`hostarrays.to_tensor`; an
    # array the loaders did not make is copied once). Made eagerly, they are captured by
    # the dataset function as inputs, not baked into its graph (which would hit the 2 GB
    # graph limit on large sets and be copied on every trace); on the host, never a GPU,
    # where the input pipeline runs. Not `tf.constant`, whose staging buffer as large as
    # the images stayed for the whole run, nor `tf.identity`, a copy through a temporary.
    x_all = hostarrays.to_tensor(x)
    y_all = hostarrays.to_tensor(hostarrays.cast(y, np.int32))
    scale = x.dtype == np.uint8

    def gather(indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batch = tf.gather(x_all, indices)  # gather uint8 first: a quarter of the bytes
        batch = tf.cast(batch, tf.float32)
        if scale:
            batch = batch / 255.0
        return batch, tf.gather(y_all, indices)

    return gather


def _augmenter(spec: AugmentSpec) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None:
    """Batch-wide augmentation with stateless random ops, or None when none is on.

    Each op draws from its own seed folded from the batch's seed, so turning one on does
    not change what the others do.

    No condition or per-channel value is broadcast over the 4-D batch, and no transform
    computes source coordinates pixel by pixel: TensorFlow's CPU kernels broadcast a
    (b, 1, 1, C) operand slowly (a (b, 1, 1, 1) one collapses to 2-D: brightness is
    cheap), and on 32x32x3 images the flip's 4-D select, the crop's projective transform
    and the contrast's arithmetic each cost 5 to 9 times gathering the batch. The flip as a
    select over 2-D rows (or, with the crop, in its column gather), the crop as row and
    column gathers, the contrast's means tiled along a row: the same bits, at 1.6 to 2.5
    times the examples a second of each there, and 3 times with all four
    (docs/benchmarks.md, "The input pipeline").
    """
    if not spec.any:
        return None

    def augment(x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        shape = tf.shape(x)
        size, height, width, channels = shape[0], shape[1], shape[2], shape[3]

        def op_seed(tag: int) -> tf.Tensor:
            return tf.random.experimental.stateless_fold_in(seed, tag)

        flip = None
        if spec.flip_left_right:
            flip = tf.random.stateless_uniform([size], op_seed(1)) < 0.5
        if flip is not None and not spec.random_crop_padding:  # else in the crop's gather
            flat = tf.reshape(x, [size, -1])
            mirrored = tf.reshape(tf.reverse(x, axis=[2]), [size, -1])
            x = tf.reshape(tf.where(flip[:, None], mirrored, flat), shape)
        if spec.random_crop_padding:
            # A whole-pixel shift in [-p, p] with zero fill: the same images as padding by
            # p and cropping at a random offset, without building the padded batch. Output
            # (u, v) reads input (u - dy, v - dx), or a zero row or column added past the
            # last where that lies outside the image.
            pad = spec.random_crop_padding
            shift = tf.random.stateless_uniform(
                [size, 2], op_seed(2), minval=-pad, maxval=pad + 1, dtype=tf.int32
            )

            def sources(length: tf.Tensor, by: tf.Tensor) -> tf.Tensor:
                read = tf.range(length)[None, :] - by[:, None]
                return tf.where((read >= 0) & (read < length), read, length)

            columns = sources(width, shift[:, 0])
            if flip is not None:  # flipped first: a mirrored image's column c is W - 1 - c
                inside = flip[:, None] & (columns < width)
                columns = tf.where(inside, width - 1 - columns, columns)
            x = tf.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])
            x = tf.gather(x, sources(height, shift[:, 1]), axis=1, batch_dims=1)
            x = tf.gather(x, columns, axis=2, batch_dims=1)
        if spec.brightness:
            delta = tf.random.stateless_uniform(
                [size, 1, 1, 1], op_seed(3), minval=-spec.brightness, maxval=spec.brightness
            )
            x = x + delta
        if spec.contrast:
            factor = tf.random.stateless_uniform(
                [size, 1, 1, 1], op_seed(4), minval=1 - spec.contrast, maxval=1 + spec.contrast
            )
            mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True)  # per image and channel
            if x.shape[3] == 1:  # one value an image: broadcast as a (b, 1) column already
                x = (x - mean) * factor + mean
            else:
                # Rows of pixels, and each image's means tiled along a row, so that the
                # arithmetic broadcasts over the rows alone (on one channel the tile cost
                # more than it saved: MNIST's contrast ran 14% slower).
                rows = tf.reshape(x, [size, height, width * channels])
                mean = tf.reshape(tf.tile(mean, [1, 1, width, 1]), [size, 1, width * channels])
                rows = (rows - mean) * tf.reshape(factor, [size, 1, 1]) + mean
                x = tf.reshape(rows, shape)
        return tf.clip_by_value(x, 0.0, 1.0)

    return augment


# --- loading -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Chunk:
    """Examples from one source, checked: x (N, H, W, C) uint8 or float32, y (N,) int32."""

    x: np.ndarray
    y: np.ndarray
    source: str


def _synthetic(params: SyntheticParams, eval_fraction: float, seed: int) -> Arrays:
    """Class prototypes plus Gaussian noise: learnable, and the same for the same seed."""
    rng = np.random.default_rng(seed)
    shape = tuple(params.shape) if len(params.shape) == 3 else (*params.shape, 1)
    prototypes = rng.uniform(0.0, 1.0, size=(params.classes, *shape)).astype(np.float32)
    # Balanced classes in a random order.
    y = rng.permutation(np.arange(params.size) % params.classes).astype(np.int32)
    x = hostarrays.empty((params.size, *shape), np.float32)
    np.take(prototypes, y, axis=0, out=x, mode="clip")  # "raise" fills a temporary first
    # Noise in slices of 16 MiB, so peak memory stays near one copy of x rather than two
    # (the draws do not depend on how they are sliced).
    rows = max(1, (16 << 20) // (math.prod(shape) * 4))
    for start in range(0, params.size, rows):
        part = x[start : start + rows]
        part += params.noise * rng.standard_normal(part.shape, dtype=np.float32)
        np.clip(part, 0.0, 1.0, out=part)
    keep = params.size - _held_out_count(params.size, eval_fraction)
    x_train, x_eval = hostarrays.split(x, keep)
    return Arrays(x_train, y[:keep], x_eval, y[keep:], params.classes)


def _held_out_count(n: int, fraction: float) -> int:
    # round() first, so 0.29 * 100 (28.999999999999996) holds out 29, not 28.
    return min(max(n - 1, 0), math.floor(round(n * fraction, 6)))


class _Meter:
    """A load's way, told to a `Preparation`: through its files, in their bytes on disk
    (`CHECKING`, TFRecord files alone: the files walked so far, and of the one being
    walked the bytes its walk has reached; `LOADING`: the files read so far, and of the one
    being read the share its reader says it has read, of its arrays' bytes or of its
    records, so a gzip'd file moves at the pace of its inflated data); then through the
    join of several files' examples (`JOINING`: bytes of their images copied). Without a
    `Preparation` it does nothing."""

    def __init__(self, files: DataFiles, preparation: Preparation | None) -> None:
        self._preparation = preparation
        self._sizes: dict[Path, int] = {}
        self._before = 0  # bytes of the files read, or of the images joined
        self._size = 0  # of the file being read
        if preparation is not None:
            for path in [*files.train, *files.eval]:
                for each in (path, files.pairs.get(path)):
                    if each is not None:
                        with contextlib.suppress(OSError):  # gone: its reader says so
                            self._sizes[each] = os.stat(each).st_size
        self._total = sum(self._sizes.values())

    def begin(self, stage: str) -> None:
        """A pass through the files begins (`CHECKING` or `LOADING`), from 0 of their bytes."""
        self._before = 0
        if self._preparation is not None:
            self._preparation.stage(stage, 0, self._total)

    @contextlib.contextmanager
    def file(self, path: Path) -> Iterator[None]:
        """`path` is read inside this; its bytes count as read once it is."""
        self._size = self._sizes.get(path, 0)
        yield
        self._before += self._size
        self._size = 0
        self._amount(self._before)

    def part(self, done: int, of: int) -> None:
        """`done` of `of` of the file being read (bytes of its arrays, or its records)."""
        if of > 0:
            self._amount(self._before + self._size * min(done, of) // of)

    def at(self, byte: int) -> None:
        """The file being walked is read up to `byte` of its bytes on disk."""
        self._amount(self._before + min(byte, self._size))

    def joining(self, *chunk_lists: list[_Chunk]) -> None:
        """The join of these chunks begins: the images of each list of several."""
        self._before = 0
        self._total = sum(_joined_bytes(chunks) for chunks in chunk_lists)
        if self._preparation is not None and self._total:
            self._preparation.stage(JOINING, 0, self._total)

    def joined(self, done: int) -> None:
        """`done` more bytes of images joined."""
        self._before += done
        self._amount(self._before)

    def _amount(self, done: int) -> None:
        if self._preparation is not None:
            self._preparation.amount(min(done, self._total), self._total)


_NO_METER = _Meter(DataFiles([], []), None)


@dataclass(frozen=True)
class _Framed:
    """What `check_tfrecord_framing` found of a file: its whole records, and the file's
    size and modification time when it was walked (`_framed`)."""

    records: int
    size: int
    mtime_ns: int


def _framed(path: Path, reached: Callable[[int], None] | None = None) -> _Framed:
    """`check_tfrecord_framing` of `path`, its failure a `DataError`."""
    stat = os.stat(path)
    try:
        records = check_tfrecord_framing(path, reached=reached)
    except DataFilesError as error:
        raise DataError(str(error)) from None
    return _Framed(records, stat.st_size, stat.st_mtime_ns)


def _check_framing(files: DataFiles, meter: _Meter) -> dict[Path, _Framed]:
    """Every TFRecord file's record headers walked (`check_tfrecord_framing`), train then
    eval, before any is loaded: a damaged last file fails the job at once, not after the
    others' minutes of loading. The `checking data` stage, in the files' bytes on disk."""
    meter.begin(CHECKING)
    framing = {}
    for path in [*files.train, *files.eval]:
        with meter.file(path):
            framing[path] = _framed(path, meter.at)
    return framing


def _read_files(
    fmt: str, files: DataFiles, meter: _Meter, framing: dict[Path, _Framed]
) -> tuple[list[_Chunk], list[_Chunk]]:
    """Train and eval chunks of every file, in order; `framing`: each TFRecord file's walk."""
    train: list[_Chunk] = []
    evals: list[_Chunk] = []
    # An empty TFRecord file is a valid one (a sharded writer leaves some when it has fewer
    # examples than shards): it adds no examples, and has no image shape to check.
    empty: list[Path] = []
    for path in files.train:
        if fmt == "idx":
            train.append(_read_idx_pair(path, files.pairs[path], meter))
        elif fmt == "npz":
            with meter.file(path):
                chunk, eval_chunk = _read_npz(path, meter)
            train.append(chunk)
            if eval_chunk is not None:
                evals.append(eval_chunk)
        else:
            with meter.file(path):
                record_chunk = _read_tfrecord(path, meter, framing.get(path))
            if record_chunk is not None:
                train.append(record_chunk)
            else:
                empty.append(path)
    if not train:
        raise DataError(no_records(empty))
    for path in files.eval:
        if fmt == "idx":
            evals.append(_read_idx_pair(path, files.pairs[path], meter))
        elif fmt == "npz":
            with meter.file(path):
                evals.extend(chunk for chunk in _read_npz(path, meter) if chunk is not None)
        else:
            with meter.file(path):
                record_chunk = _read_tfrecord(path, meter, framing.get(path))
            if record_chunk is not None:
                evals.append(record_chunk)
    if files.eval and not evals:
        # Eval files that hold no records: no eval, as with empty `x_eval` arrays (not a
        # hold-out of the training examples, which the user did not ask for). Copies of
        # no examples: a view would keep the first training file alive beside the join.
        sources = ", ".join(str(path) for path in files.eval)
        evals.append(_Chunk(train[0].x[:0].copy(), train[0].y[:0].copy(), sources))
    return train, evals


def _concatenate(chunks: list[_Chunk], meter: _Meter = _NO_METER) -> tuple[np.ndarray, np.ndarray]:
    """Every chunk's examples, in order, in one pair of arrays. Empties `chunks`: each file's
    arrays go once copied, so joining files holds their images about once, not twice."""
    shapes = {chunk.x.shape[1:] for chunk in chunks}
    if len(shapes) > 1:
        received = ", ".join(f"{tuple(chunk.x.shape[1:])} in {chunk.source}" for chunk in chunks)
        raise DataError(f"Expected every file to hold images of one shape. Received: {received}")
    xs, ys = [chunk.x for chunk in chunks], [chunk.y for chunk in chunks]
    chunks.clear()  # the lists above hold the only references: each goes as it is copied
    if len(xs) == 1:
        return xs[0], ys[0]
    if len({x.dtype for x in xs}) > 1:
        xs = [_as_float(x) for x in xs]
    return hostarrays.concatenate(xs, meter.joined), hostarrays.concatenate(ys)


def _joined_bytes(chunks: list[_Chunk]) -> int:
    """The bytes of images `_concatenate` copies to join `chunks`: none for one; where their
    dtypes differ, the uint8 ones' as `_as_float` makes them (float32, 4 bytes a pixel)."""
    if len(chunks) < 2:
        return 0
    mixed = len({chunk.x.dtype for chunk in chunks}) > 1
    return sum(
        chunk.x.size * 4 if mixed and chunk.x.dtype == np.uint8 else chunk.x.nbytes
        for chunk in chunks
    )


def _as_float(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.uint8:
        return x
    floats = hostarrays.cast(x, np.float32)
    floats /= 255.0
    return floats


def _checked(
    x: np.ndarray, y: np.ndarray, source: str, names: tuple[str, str] = ("x", "y")
) -> _Chunk:
    """Checks one source's arrays and brings them to the `Arrays` layout and dtypes."""
    x_name, y_name = names
    if problem := shape_problem(x.shape, y.shape, source, names) or dtype_problem(
        x.dtype, y.dtype, source, names
    ):
        raise DataError(problem)
    if x.ndim == 3:
        x = x[..., np.newaxis]
    if y.ndim == 2:  # (N, 1)
        y = y[:, 0]
    return _Chunk(_pixels(x, x_name, source), _labels(y, y_name, source), source)


def _pixels(x: np.ndarray, name: str, source: str) -> np.ndarray:
    """uint8 stays uint8; other integers must be 0-255; floats must lie in [0, 1]. Of
    numbers (`dtype_problem`, checked first: strings and records have no min(), and
    numpy's error names neither the array nor the file)."""
    if x.dtype == np.uint8 or x.size == 0:
        return x if x.dtype == np.uint8 else hostarrays.cast(x, np.float32)
    low, high = x.min(), x.max()
    if np.issubdtype(x.dtype, np.integer):
        if low < 0 or high > 255:
            raise DataError(
                f"Expected integer pixels `{name}` in 0-255. Received: values {low} to {high} ({source})"
            )
        return hostarrays.cast(x, np.uint8)
    if not (np.isfinite(low) and np.isfinite(high)):
        # NaN spreads to min() and max() alike: "values nan to nan" did not say it plainly.
        nan = bool(np.isnan(low))
        bad = np.isnan(x) if nan else np.isinf(x)  # a temporary, on the way to failing
        count = int(bad.sum())
        first = int(np.argmax(bad.reshape(-1))) // math.prod(x.shape[1:])
        raise DataError(
            f"Expected float pixels `{name}` in [0, 1]. Received: {count:,} "
            f"{'NaN (not a number)' if nan else 'infinite'} value{'s' if count > 1 else ''}, "
            f"the first in example {first} ({source})"
        )
    if not (low >= 0.0 and high <= 1.0):
        raise DataError(
            f"Expected float pixels `{name}` in [0, 1]. Received: values {low} to {high} ({source})"
        )
    return hostarrays.cast(x, np.float32)


def _labels(y: np.ndarray, name: str, source: str) -> np.ndarray:
    if y.size == 0 or y.dtype == np.bool_:  # bool: two-class data, as `r.random(n) > 0.5`
        return hostarrays.cast(y, np.int32)
    integral = np.issubdtype(y.dtype, np.integer) or (
        np.issubdtype(y.dtype, np.floating) and np.array_equal(y, np.round(y))
    )
    if not integral:
        # Float labels that are whole numbers are read: name the value that is not one
        # (labels of no number type are refused before, by `dtype_problem`).
        value = y.flat[np.flatnonzero(y != np.round(y))[0]]
        raise DataError(
            f"Expected integer class ids in `{name}`. Received: a label of {value} ({y.dtype}) ({source})"
        )
    low, high = y.min(), y.max()
    if low < 0:
        raise DataError(f"Expected labels `{name}` >= 0. Received: a label of {low} ({source})")
    if high >= MAX_CLASSES:
        # The model gets one logit per id up to the largest: a stray id of 2e9 asks for a
        # 2e9-wide output layer, which fails seconds later as an out-of-memory crash.
        raise DataError(
            f"Expected labels `{name}` to be class ids below {MAX_CLASSES:,} (the model has one "
            f"output per id up to the largest). Received: a label of {high} ({source})"
        )
    return hostarrays.cast(y, np.int32)


# IDX: magic 0x00 0x00 <dtype> <ndim>, then ndim big-endian uint32 sizes, then the data.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: Path, meter: _Meter = _NO_METER) -> np.ndarray:
    """One IDX file (gzip-compressed or plain, told by its first bytes) as a numpy array,
    read straight into an aligned one (`trainer.hostarrays`): no copy of it on the way."""
    try:
        with open_idx(path) as (stream, size, at_most):
            return _read_idx_stream(cast(_Stream, stream), path, size, at_most, meter)
    except DataFilesError as error:  # a header that is none, or a damaged gzip stream
        raise DataError(str(error)) from None


def _read_idx_stream(
    stream: _Stream,
    path: Path,
    size: int | None,
    at_most: int | None = None,
    meter: _Meter = _NO_METER,
) -> np.ndarray:
    """The IDX array `stream` holds; `size`: its bytes, where known before reading;
    `at_most`: a bound on them where that alone is known (a gzip file's)."""
    code, dims = read_idx_header(cast(BinaryIO, stream), path)
    dtype, ndim = _IDX_DTYPES[code], len(dims)
    expected = math.prod(dims) * dtype.itemsize

    def wrong_size(received: int) -> DataError:
        return DataError(
            f"Expected {expected} bytes of data for dims {dims}. "
            f"Received: {received} bytes ({path})"
        )

    # Known before reading a byte of it.
    received = None if size is None else size - 4 - 4 * ndim
    if problem := idx_size_problem(dims, code, path, received, at_most):
        raise DataError(problem)
    check_read(expected, f"{path} (dims {dims})", available_bytes())
    try:
        # Untouched pages cost nothing: a header that claims more than the stream holds
        # fills only what the stream has before it is refused below.
        array: np.ndarray | None = hostarrays.empty(dims, dtype)
    except MemoryError:  # more than this host could ever hold: say what the file holds
        array = None
    read = 0 if array is None else _read_into(stream, array, meter.part)
    received = read + _count_rest(stream)
    if received != expected:
        raise wrong_size(received)
    if array is None:
        raise DataError(
            f"Expected data that fits in memory. Received: {expected:,} bytes for dims {dims} "
            f"({path})"
        )
    if not dtype.isnative:  # IDX is big-endian: swapped in place, still aligned
        array = array.byteswap(inplace=True).view(dtype.newbyteorder("="))
    return array


class _Stream(Protocol):
    """A binary file, gzip stream or zip member, read from its current position."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


def _read_into(
    stream: _Stream, array: np.ndarray, told: Callable[[int, int], None] | None = None
) -> int:
    """Fill `array` (C-contiguous) from `stream`; the bytes read, fewer if it ended first.
    `told(done, of)` after each piece: the bytes read so far of the array's."""
    view = array.reshape(-1).view(np.uint8).data
    done = 0
    # In pieces of 16 MiB: a zip member's or gzip stream's `readinto` reads into bytes of
    # the size asked for and copies them over, so a piece is a temporary of its size.
    while done < len(view) and (n := stream.readinto(view[done : done + (16 << 20)])):
        done += n
        if told is not None:
            told(done, len(view))
    return done


def _count_rest(stream: _Stream) -> int:
    """The bytes left in `stream`, read in pieces and dropped."""
    return sum(len(piece) for piece in iter(lambda: stream.read(1 << 20), b""))


def _read_idx_pair(images_path: Path, labels_path: Path, meter: _Meter = _NO_METER) -> _Chunk:
    with meter.file(images_path):
        images = read_idx(images_path, meter)
    with meter.file(labels_path):
        labels = read_idx(labels_path, meter)
    if problem := idx_pair_problem(images.shape, labels.shape, images_path, labels_path):
        raise DataError(problem)
    return _checked(images, labels, f"{images_path}, {labels_path}", names=("images", "labels"))


def _read_npz(path: Path, meter: _Meter = _NO_METER) -> tuple[_Chunk, _Chunk | None]:
    """`x`, `y` and, if present, its eval pair (`npz_array_names`) of one .npz file."""
    try:
        train_names, eval_names = npz_array_names(path)
    except DataFilesError as error:
        raise DataError(str(error)) from None
    try:
        with zipfile.ZipFile(path) as archive:
            # The arrays by name, as np.load names them: each member's name less `.npy`.
            members = {name.removesuffix(".npy"): name for name in archive.namelist()}
            # These alone: another array in the file costs no memory.
            wanted = [*train_names, *(eval_names or ())]
            # How far the file is read: each array's share of it as its stored bytes'.
            shares = [archive.getinfo(members[name]).compress_size for name in wanted]
            arrays = {}
            for index, name in enumerate(wanted):
                before, share = sum(shares[:index]), shares[index]

                def told(done: int, of: int, before: int = before, share: int = share) -> None:
                    meter.part(before + share * done // of, sum(shares))

                arrays[name] = _npy(archive, members[name], told)
    except NotEnoughMemory:  # a RuntimeError, and no damage: said as it is
        raise
    except ZIP_READ_ERRORS as error:
        raise DataError(f"Expected a readable .npz file. Received: {error} ({path})") from None
    if unread := sorted(members.keys() - set(wanted)):
        # A test split kept back behind a validation pair, or arrays of the maker's own:
        # said, so that none is taken for read (eval data under a name not read as such).
        log.info(
            "%s: arrays %s not read (train: %s%s)",
            path,
            ", ".join(unread),
            ", ".join(train_names),
            f"; eval: {', '.join(eval_names)}" if eval_names else "",
        )
    chunk = _checked(arrays[train_names[0]], arrays[train_names[1]], str(path), names=train_names)
    if eval_names is None:
        return chunk, None
    eval_chunk = _checked(arrays[eval_names[0]], arrays[eval_names[1]], str(path), names=eval_names)
    # Named by its arrays too where the log says what eval came from: the file's name
    # alone read as the train file given twice.
    return chunk, replace(eval_chunk, source=f"{', '.join(eval_names)} of {path}")


def _npy(
    archive: zipfile.ZipFile, name: str, told: Callable[[int, int], None] | None = None
) -> np.ndarray:
    """One .npy member, as `np.load(allow_pickle=False)` reads it, but read straight into
    an aligned array (`trainer.hostarrays`) where it is in C order: numpy's own copy would
    be copied again into TensorFlow's memory."""
    with archive.open(name) as opened:
        member = cast(_Stream, opened)  # a ZipExtFile, which typeshed calls IO[bytes]
        try:
            header = read_npy_header(cast(BinaryIO, member), name, archive.getinfo(name).file_size)
        except ValueError:
            # A damaged byte in the header: the member's CRC, checked at its end, says so
            # better than the header's parse does (numpy read the whole member first).
            _count_rest(member)
            raise
        if (
            header is None
            or header.fortran_order
            or header.dtype.hasobject
            or not header.dtype.itemsize
        ):
            # numpy's own way: it refuses pickled objects (an uploaded file must not run
            # code when loaded), and any other such array is copied once when handed over.
            opened.seek(0)
            return np.lib.format.read_array(opened, allow_pickle=False)
        shape, dtype = header.shape, header.dtype
        nbytes = math.prod(shape) * dtype.itemsize
        check_read(nbytes, f"{archive.filename} ({name}, shape {shape})", available_bytes())
        array = hostarrays.empty(shape, dtype)
        if (received := _read_into(member, array, told)) != array.nbytes:
            raise ValueError(
                f"EOF: reading array data, expected {array.nbytes} bytes got {received}"
            )
        _count_rest(member)  # to the member's end, where zipfile checks its CRC
        return array


_TFRECORD_FEATURES = {
    name: tf.io.FixedLenFeature([], tf.string if dtype == "string" else tf.int64)
    if required
    # The image shape features (`tfexample.SHAPE_FEATURES`): 0 = absent.
    else tf.io.FixedLenFeature([], tf.int64, default_value=0)
    for name, (dtype, required) in tfexample.PARSED.items()
}


def _read_tfrecord(
    path: Path, meter: _Meter = _NO_METER, framed: _Framed | None = None
) -> _Chunk | None:
    """All examples of one TFRecord file (GZIP if named `.gz`); None if it has none.
    `framed`: the file's walk (`_check_framing`), where it was walked before.

    This holds the whole file in memory, as every format here does: the pipeline then
    feeds by index, so its checkpoints hold positions instead of buffered records.
    """
    compressed = tfrecord_compressed(path)
    # Walked before TensorFlow reads it: a header claiming 2^40 bytes killed the worker
    # (SIGSEGV) as TensorFlow allocated them, and a file that ends inside a header read as
    # one that ends before it, dropping the rest without a word. Walked again here where
    # it changed since (its size or time): the walk vouches for the file it walked.
    stat = os.stat(path)
    if framed is None or (stat.st_size, stat.st_mtime_ns) != (framed.size, framed.mtime_ns):
        framed = _framed(path)
    records = framed.records
    dataset = (
        tf.data.TFRecordDataset([str(path)], compression_type="GZIP" if compressed else "")
        # 256 records a parse: one at a time is 10x slower, and a batch's strings are held
        # a few times over while its images are copied out (1,024 16-KiB images took 160 MB)
        .batch(256)
        .map(lambda records: tf.io.parse_example(records, _TFRECORD_FEATURES))
    )
    images: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    shape: tuple[int, int, int] | None = None
    first = 0  # index of the batch's first record, for messages
    try:
        for batch in dataset.as_numpy_iterator():
            batch_shape = _record_shape(batch, first, path)
            if shape is not None and batch_shape != shape:
                raise DataError(
                    f"Expected every record to have one image shape. Received: {shape} and "
                    f"{batch_shape} ({path})"
                )
            shape = batch_shape
            raw = batch["image_raw"]
            sizes = np.fromiter((len(image) for image in raw), np.int64, len(raw))
            bad = np.flatnonzero(sizes != math.prod(shape))
            if bad.size:
                index = int(bad[0])
                problem = tfexample.image_raw_problem(
                    shape, int(sizes[index]), first + index, raw[index][:16], path
                )
                assert problem is not None  # the sizes differ
                raise DataError(problem)
            # Each batch in memory of its own (`hostarrays.empty`), which goes back to the
            # system as the batches are joined; the joined bytes are a batch's temporary.
            joined = np.frombuffer(b"".join(raw), np.uint8).reshape(-1, *shape)
            images.append(hostarrays.cast(joined, np.uint8))
            labels.append(batch["label"])
            first += len(raw)
            meter.part(first, records)
    except tf.errors.DataLossError as error:
        reason = f"{_op_reason(error)}{tfrecord_hint(path, compressed)}"
        raise DataError(unreadable_tfrecord(reason, path)) from None
    except tf.errors.OpError as error:
        raise DataError(tfexample.example_problem(_op_reason(error), path)) from None
    except UnicodeDecodeError:
        # TensorFlow's "Could not parse example input, value: '...'" quotes the record, and
        # one that is not UTF-8 (a JPEG file's bytes) fails to become its message: the job
        # said only "'utf-8' codec can't decode byte 0xff in position 267".
        reason = "Could not parse example input: a record that is no tf.train.Example"
        raise DataError(tfexample.example_problem(reason, path)) from None
    if shape is None:  # an empty file (one that is not empty and holds no record failed above)
        return None
    return _checked(
        hostarrays.concatenate(images),
        hostarrays.concatenate(labels),
        str(path),
        ("image_raw", "label"),
    )


def _op_reason(error: tf.errors.OpError) -> str:
    """TensorFlow's message without the function and op names it wraps around it."""
    reason = op_reason(error.message)
    # A record that lacks a feature or holds it in another type fails inside the parsing
    # map: TensorFlow names the map's function and iterator, and an unnamed example.
    reason = re.sub(
        r"^Error in user-defined function passed to .*? with iterator: \S+: ", "", reason
    )
    return re.sub(r"^Name: <unknown>, ", "", reason).strip()


def _record_shape(batch: dict[str, np.ndarray], first: int, path: Path) -> tuple[int, int, int]:
    """The one (H, W, C) of a batch of parsed records, by `tfexample.image_shape` (the
    service's rule for a first record), once for each distinct set of shape features."""
    columns = np.stack([batch[name] for name in tfexample.SHAPE_FEATURES], axis=1)
    rows, firsts = np.unique(columns, axis=0, return_index=True)
    shapes = set()
    for row, index in sorted(zip(rows.tolist(), firsts.tolist(), strict=True), key=lambda r: r[1]):
        values = dict(zip(tfexample.SHAPE_FEATURES, row, strict=True))
        shape = tfexample.image_shape(values)
        if shape is None:
            raise DataError(tfexample.no_image_shape(values["pixels"], first + index, path))
        shapes.add(shape)
    if len(shapes) > 1:
        raise DataError(
            f"Expected every record to have one image shape. Received: {sorted(shapes)} ({path})"
        )
    return cast(tuple[int, int, int], shapes.pop())
