"""Tests of `trainer.data`: loading every format, and the train and eval pipelines."""

from __future__ import annotations

import gzip
import json
import logging
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import tensorflow as tf

from tests.damaged_files import (
    damage_first_member,
    flag_first_member_encrypted,
    tfrecord_header,
    write_lying_npz,
)
from tests.tfrecords import write_examples, write_tfrecord
from trainer import hostarrays
from trainer.data import (
    Arrays,
    DataError,
    eval_dataset,
    load_arrays,
    read_idx,
    steps_per_epoch,
    train_dataset,
)
from trainer.datafiles import DataFilesError
from trainer.memory import NotEnoughMemory
from trainer.spec import DataSpec

MNIST_T10K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist-t10k"

IDX_TYPES = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D}


# --- writers of real files -------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray, dtype: str = "u1") -> Path:
    """An IDX file (gzip-compressed when the name ends `.gz`), as MNIST's are written."""
    data = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder(">"))
    header = bytes([0, 0, IDX_TYPES[data.dtype], data.ndim]) + struct.pack(
        f">{data.ndim}I", *data.shape
    )
    raw = header + data.tobytes()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def write_idx_pair(
    folder: Path, prefix: str, x: np.ndarray, y: np.ndarray, gz: bool = True
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", x)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", y)


def images(n: int, shape: tuple[int, ...] = (4, 4), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def spec(fmt: str, path: Path | str, **fields: Any) -> DataSpec:
    return DataSpec(format=fmt, path=str(path), **fields)


def arrays_of(n: int, shape: tuple[int, int, int] = (4, 4, 1), n_eval: int = 0) -> Arrays:
    """uint8 images whose label is their index, so a batch shows which examples it holds."""
    x = images(n + n_eval, shape)
    y = np.arange(n + n_eval, dtype=np.int32)
    return Arrays(x[:n], y[:n], x[n:], y[n:], num_classes=n + n_eval)


def batches(dataset: tf.data.Dataset, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy(), y.numpy()) for x, y in dataset.take(count)]


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


# --- idx -------------------------------------------------------------------------------


def test_load_arrays_reads_idx_train_and_eval_pairs(tmp_path: Path) -> None:
    x, x_test = images(6, (5, 7)), images(3, (5, 7), seed=1)
    write_idx_pair(tmp_path, "train", x, np.array([0, 1, 2, 3, 4, 1]))
    write_idx_pair(tmp_path, "t10k", x_test, np.array([2, 0, 6]))

    arrays = load_arrays(spec("idx", tmp_path, eval_fraction=0.5), seed=0)

    assert (arrays.x_train.shape, arrays.x_eval.shape) == ((6, 5, 7, 1), (3, 5, 7, 1))
    assert (arrays.x_train.dtype, arrays.y_train.dtype) == (np.uint8, np.int32)
    np.testing.assert_array_equal(arrays.x_train[..., 0], x)
    np.testing.assert_array_equal(arrays.y_eval, [2, 0, 6])
    assert (arrays.num_classes, arrays.image_shape) == (7, (5, 7, 1))
    assert (arrays.num_train, arrays.num_eval) == (6, 3)


def test_load_arrays_holds_out_last_fraction_of_single_idx_pair(tmp_path: Path) -> None:
    x = images(10)
    write_idx_pair(tmp_path, "t10k", x, np.arange(10) % 3)

    arrays = load_arrays(spec("idx", tmp_path, eval_fraction=0.3), seed=0)

    np.testing.assert_array_equal(arrays.y_train, [0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(arrays.y_eval, [1, 2, 0])
    np.testing.assert_array_equal(arrays.x_eval[..., 0], x[7:])


def test_load_arrays_reads_plain_and_gz_idx_alike(tmp_path: Path) -> None:
    x, y = images(5), np.array([1, 0, 1, 1, 0])
    write_idx_pair(tmp_path / "gz", "train", x, y, gz=True)
    write_idx_pair(tmp_path / "plain", "train", x, y, gz=False)

    packed = load_arrays(spec("idx", tmp_path / "gz"), seed=0)
    plain = load_arrays(spec("idx", tmp_path / "plain" / "train-images-idx3-ubyte"), seed=0)

    np.testing.assert_array_equal(packed.x_train, plain.x_train)
    np.testing.assert_array_equal(packed.x_train[..., 0], x[:4])
    np.testing.assert_array_equal(plain.y_eval, [0])  # default eval_fraction 0.2 of 5


def test_load_arrays_concatenates_idx_glob_in_name_order(tmp_path: Path) -> None:
    write_idx_pair(tmp_path, "b", images(2), np.array([2, 3]))
    write_idx_pair(tmp_path, "a", images(2), np.array([0, 1]))

    arrays = load_arrays(spec("idx", tmp_path / "*.gz", eval_fraction=0.0), seed=0)

    np.testing.assert_array_equal(arrays.y_train, [0, 1, 2, 3])


def test_read_idx_big_endian_types(tmp_path: Path) -> None:
    ints = write_idx(tmp_path / "ints", np.array([[1, -2], [70000, 3]]), dtype=">i4")
    floats = write_idx(tmp_path / "floats.gz", np.array([0.5, 0.25]), dtype=">f4")

    np.testing.assert_array_equal(read_idx(ints), [[1, -2], [70000, 3]])
    np.testing.assert_array_equal(read_idx(floats), [0.5, 0.25])
    assert read_idx(floats).dtype == np.float32


def test_load_arrays_reads_mnist_t10k() -> None:
    if not MNIST_T10K.is_dir():
        pytest.skip(f"MNIST test set not found at {MNIST_T10K}")

    arrays = load_arrays(spec("idx", MNIST_T10K), seed=0)

    assert (arrays.x_train.shape, arrays.x_eval.shape) == ((8000, 28, 28, 1), (2000, 28, 28, 1))
    assert (arrays.num_classes, int(arrays.x_train.max())) == (10, 255)
    counts = np.bincount(np.concatenate([arrays.y_train, arrays.y_eval]))
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert arrays.y_train[:3].tolist() == [7, 2, 1]


def test_load_arrays_idx_count_mismatch(tmp_path: Path) -> None:
    write_idx_pair(tmp_path, "train", images(3), np.array([0, 1]))

    with pytest.raises(DataError) as error:
        load_arrays(spec("idx", tmp_path), seed=0)

    images_path = tmp_path / "train-images-idx3-ubyte.gz"
    labels_path = tmp_path / "train-labels-idx1-ubyte.gz"
    assert str(error.value) == (
        "Expected `images` and `labels` to have the same number of examples. "
        f"Received: images has 3, labels has 2 ({images_path}, {labels_path})"
    )


def test_load_arrays_idx_truncated_data(tmp_path: Path) -> None:
    write_idx_pair(tmp_path, "train", images(3), np.array([0, 1, 2]), gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])

    with pytest.raises(DataError) as error:
        load_arrays(spec("idx", tmp_path), seed=0)

    assert str(error.value) == (
        f"Expected 48 bytes of data for dims (3, 4, 4). Received: 43 bytes ({path})"
    )


def test_load_arrays_idx_not_idx(tmp_path: Path) -> None:
    write_idx_pair(tmp_path, "train", images(3), np.array([0, 1, 2]), gz=False)
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(b"hello world")

    with pytest.raises(DataError) as error:
        load_arrays(spec("idx", tmp_path), seed=0)

    assert str(error.value) == (
        f"Expected an IDX file starting 0x00 0x00 <type 0x08-0x0E> <dims>. Received: 68 65 6c 6c ({path})"
    )


def test_load_arrays_idx_gzip_damaged_inside_names_the_file(tmp_path: Path) -> None:
    # Damaged deflate data raises zlib.error, not the OSError a bad header does: the job
    # said "Cannot load the data: error: Error -3 while decompressing data: ...", no file.
    write_idx_pair(tmp_path, "train", images(500, (16, 16)), np.zeros(500, np.int64), gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    damage_first_member(path)

    with pytest.raises(DataError) as error:
        load_arrays(spec("idx", tmp_path), seed=0)

    message = str(error.value)
    assert message.startswith(
        "Expected a readable gzip file. Received: Error -3 while decompressing data: invalid block type"
    ), message
    assert message.endswith(f" ({path})")


def test_load_arrays_idx_wrong_dims(tmp_path: Path) -> None:
    write_idx(tmp_path / "train-images-idx3-ubyte", images(3, (16,)))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([0, 1, 2]))

    with pytest.raises(DataError) as error:
        load_arrays(spec("idx", tmp_path), seed=0)

    assert str(error.value) == (
        "Expected an images file of dims (N, H, W) or (N, H, W, C). "
        f"Received: dims (3, 16) ({tmp_path / 'train-images-idx3-ubyte'})"
    )


# --- npz -------------------------------------------------------------------------------


def test_load_arrays_reads_npz_and_holds_out_last_fraction(tmp_path: Path) -> None:
    x = images(5, (3, 2))
    np.savez(tmp_path / "set.npz", x=x, y=np.array([4, 3, 2, 1, 0]))

    arrays = load_arrays(spec("npz", tmp_path / "set.npz", eval_fraction=0.4), seed=0)

    assert (arrays.x_train.shape, arrays.x_train.dtype) == ((3, 3, 2, 1), np.uint8)
    np.testing.assert_array_equal(arrays.y_train, [4, 3, 2])
    np.testing.assert_array_equal(arrays.y_eval, [1, 0])
    np.testing.assert_array_equal(arrays.x_eval[..., 0], x[3:])
    assert arrays.num_classes == 5


def test_load_arrays_reads_npz_eval_arrays(tmp_path: Path) -> None:
    x = np.linspace(0.0, 1.0, 4 * 2 * 2 * 3).reshape(4, 2, 2, 3)
    np.savez(tmp_path / "set.npz", x=x, y=[0, 1, 0, 1], x_eval=x[:2], y_eval=[[1], [1]])

    arrays = load_arrays(spec("npz", tmp_path / "set.npz", eval_fraction=0.5), seed=0)

    assert (arrays.x_train.shape, arrays.x_train.dtype) == ((4, 2, 2, 3), np.float32)
    np.testing.assert_array_equal(arrays.x_train, x.astype(np.float32))
    np.testing.assert_array_equal(arrays.y_eval, [1, 1])
    assert arrays.y_eval.dtype == np.int32


@pytest.mark.parametrize("order", ["C", "F"])
def test_load_arrays_reads_npz_of_either_order_into_memory_tensorflow_shares(
    tmp_path: Path, order: Literal["C", "F"]
) -> None:
    x = np.asarray(images(6, (5, 3, 2)), order=order)
    np.savez(tmp_path / "set.npz", x=x, y=np.arange(6), notes=np.array(["not read"]))

    arrays = load_arrays(spec("npz", tmp_path / "set.npz", eval_fraction=0.0), seed=0)

    np.testing.assert_array_equal(arrays.x_train, x)
    np.testing.assert_array_equal(arrays.y_train, np.arange(6))
    # Read straight into aligned memory in C order; numpy's copy of a Fortran-ordered one
    # is copied once more when the pipeline takes it.
    assert hostarrays.shareable(arrays.x_train) == (order == "C")


def test_load_arrays_reads_npz_integer_pixels_as_uint8(tmp_path: Path) -> None:
    np.savez(tmp_path / "set.npz", x=np.array([[[0, 255]], [[7, 8]]]), y=[0, 1])

    arrays = load_arrays(spec("npz", tmp_path / "set.npz", eval_fraction=0.0), seed=0)

    assert arrays.x_train.dtype == np.uint8
    assert arrays.x_train[:, 0, :, 0].tolist() == [[0, 255], [7, 8]]


def test_load_arrays_reads_npz_folder_with_eval_file(tmp_path: Path) -> None:
    np.savez(tmp_path / "b.npz", x=images(2), y=[2, 3])
    np.savez(tmp_path / "a.npz", x=images(2), y=[0, 1])
    np.savez(tmp_path / "test.npz", x=images(1), y=[9])

    arrays = load_arrays(spec("npz", tmp_path), seed=0)

    np.testing.assert_array_equal(arrays.y_train, [0, 1, 2, 3])
    np.testing.assert_array_equal(arrays.y_eval, [9])
    assert arrays.num_classes == 10


def _npz_error(tmp_path: Path, **arrays: Any) -> str:
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError) as error:
        load_arrays(spec("npz", tmp_path / "bad.npz"), seed=0)
    return str(error.value)


def test_load_arrays_npz_count_mismatch(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=images(100), y=np.zeros(99, np.int64))

    assert message == (
        "Expected `x` and `y` to have the same number of examples. "
        f"Received: x has 100, y has 99 ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_negative_label(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=images(3), y=[0, -1, 2])

    assert message == f"Expected labels `y` >= 0. Received: a label of -1 ({tmp_path / 'bad.npz'})"


def test_load_arrays_npz_label_too_large_for_a_class_id(tmp_path: Path) -> None:
    # Without the check, the model is built with 2,000,000,001 logits and the job dies of
    # memory seconds later (or is OOM-killed).
    message = _npz_error(tmp_path, x=images(3), y=[0, 1, 2_000_000_000])

    assert message == (
        "Expected labels `y` to be class ids below 100,000 (the model has one output per id "
        f"up to the largest). Received: a label of 2000000000 ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_accepts_the_largest_class_id(tmp_path: Path) -> None:
    np.savez(tmp_path / "wide.npz", x=images(3), y=[0, 1, 99_999])

    assert load_arrays(spec("npz", tmp_path / "wide.npz"), seed=0).num_classes == 100_000


def test_load_arrays_reads_npz_bool_labels_as_zero_and_one(tmp_path: Path) -> None:
    # `y = r.random(n) > 0.5`, two-class data as it is often made, was refused with
    # "Expected integer class ids ... Received: dtype bool" (bool pixels were read).
    y = np.array([True, False, False, True])
    np.savez(tmp_path / "two.npz", x=images(4), y=y, x_eval=images(2), y_eval=y[:2])

    arrays = load_arrays(spec("npz", tmp_path / "two.npz"), seed=0)

    assert arrays.y_train.dtype == arrays.y_eval.dtype == np.int32
    assert arrays.y_train.tolist() == [1, 0, 0, 1]
    assert arrays.y_eval.tolist() == [1, 0]
    assert (arrays.num_classes, arrays.label_range) == (2, (0, 1))


def test_load_arrays_npz_wrong_dims(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=images(3, (16,)), y=[0, 1, 2])

    assert message == (
        "Expected `x` of shape (N, H, W) or (N, H, W, C). "
        f"Received: shape (3, 16) ({tmp_path / 'bad.npz'})"
    )


@pytest.mark.parametrize(
    "shape", [(3, 0, 8), (3, 8, 0), (3, 8, 8, 0)], ids=["no-rows", "no-columns", "no-channels"]
)
def test_load_arrays_npz_images_without_pixels(tmp_path: Path, shape: tuple[int, ...]) -> None:
    # Trained on, these abort the worker inside oneDNN with no result.json.
    message = _npz_error(tmp_path, x=np.zeros(shape, np.float32), y=[0, 1, 2])

    assert message == (
        "Expected `x` images of at least 1 x 1 pixels and 1 channel. "
        f"Received: shape {shape} ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_one_hot_labels(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=images(2), y=np.eye(2))

    assert message == (
        f"Expected `y` of shape (N,) holding class ids. Received: shape (2, 2) ({tmp_path / 'bad.npz'})"
    )


@pytest.mark.parametrize(
    "x",
    [np.full((2, 4, 4), "a"), np.zeros((2, 4, 4), [("r", "u1"), ("g", "u1")])],
    ids=["strings", "records"],
)
def test_load_arrays_npz_pixels_that_are_not_numbers_name_the_file(
    tmp_path: Path, x: np.ndarray
) -> None:
    # Was numpy's "ufunc 'minimum' did not contain a loop with signature matching types",
    # naming neither the array nor the file.
    message = _npz_error(tmp_path, x=x, y=np.zeros(2, np.int64))

    assert message == (
        f"Expected numeric pixels `x`. Received: dtype {x.dtype} ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_labels_that_are_class_names_say_how_to_number_them(
    tmp_path: Path,
) -> None:
    message = _npz_error(tmp_path, x=images(2), y=np.array(["cat", "dog"]))

    assert message == (
        "Expected integer class ids in `y`, numbered from 0 (class names are numbered by "
        "np.unique(y, return_inverse=True)[1]). Received: dtype <U3 "
        f"({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_float_labels_that_are_not_whole_name_the_label(tmp_path: Path) -> None:
    # Whole-number float labels are read, so "Received: dtype float64" did not say what
    # was wrong.
    message = _npz_error(tmp_path, x=images(3), y=np.array([0.0, 1.0, 1.5]))

    assert message == (
        "Expected integer class ids in `y`. Received: a label of 1.5 (float64) "
        f"({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_float_pixels_outside_unit_range(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=np.full((2, 2, 2), 255.0), y=[0, 1])

    assert message == (
        "Expected float pixels `x` in [0, 1]. "
        f"Received: values 255.0 to 255.0 ({tmp_path / 'bad.npz'})"
    )


@pytest.mark.parametrize(
    ("value", "received"),
    [
        (np.nan, "2 NaN (not a number) values"),
        (np.inf, "2 infinite values"),
        (-np.inf, "2 infinite values"),
    ],
    ids=["nan", "inf", "-inf"],
)
def test_load_arrays_npz_float_pixels_that_are_not_finite_say_so(
    tmp_path: Path, value: float, received: str
) -> None:
    # NaN said "Received: values nan to nan", as if it were a range.
    x = np.zeros((3, 2, 2), np.float32)
    x[1, 0, 1] = x[2, 1, 1] = value

    message = _npz_error(tmp_path, x=np.zeros((1, 2, 2)), y=[0], x_eval=x, y_eval=[0, 1, 0])

    assert message == (
        f"Expected float pixels `x_eval` in [0, 1]. Received: {received}, the first in "
        f"example 1 ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_missing_y(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=images(2), labels=[0, 1])

    assert message == (
        "Expected arrays `x` and `y` (or `x_train` and `y_train`) in the .npz file. "
        f"Received: ['labels', 'x'] ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_x_eval_without_y_eval(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=images(2), y=[0, 1], x_eval=images(1))

    assert message == (
        "Expected both `x_eval` and `y_eval`, or neither. "
        f"Received: ['x', 'x_eval', 'y'] ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_reads_npz_saved_as_keras_mnist(tmp_path: Path) -> None:
    # keras.datasets.mnist's own file: it was refused for lacking `x` and `y`.
    x, x_test = images(6, (5, 5)), images(2, (5, 5), seed=1)
    np.savez(
        tmp_path / "mnist.npz", x_train=x, y_train=[0, 1, 2, 0, 1, 2], x_test=x_test, y_test=[2, 1]
    )

    arrays = load_arrays(spec("npz", tmp_path / "mnist.npz"), seed=0)

    np.testing.assert_array_equal(arrays.x_train[..., 0], x)
    np.testing.assert_array_equal(arrays.y_train, [0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(arrays.x_eval[..., 0], x_test)
    np.testing.assert_array_equal(arrays.y_eval, [2, 1])


def test_load_arrays_reads_npz_validation_pair_as_eval_before_a_test_pair(
    tmp_path: Path, caplog
) -> None:
    # A saved split's `x_val`, `y_val` were not read: the job held out part of its train
    # set instead, and with a test pair beside them, evaluated on the test set.
    x, x_val, x_test = images(6, (5, 5)), images(2, (5, 5), seed=1), images(3, (5, 5), seed=2)
    path = tmp_path / "split.npz"
    np.savez(
        path,
        x_train=x,
        y_train=[0, 1, 2, 0, 1, 2],
        x_val=x_val,
        y_val=[2, 1],
        x_test=x_test,
        y_test=[0, 0, 1],
    )

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        arrays = load_arrays(spec("npz", path, eval_fraction=0.5), seed=0)

    np.testing.assert_array_equal(arrays.x_train[..., 0], x)
    np.testing.assert_array_equal(arrays.x_eval[..., 0], x_val)
    np.testing.assert_array_equal(arrays.y_eval, [2, 1])
    assert caplog.messages[:2] == [
        f"{path}: arrays x_test, y_test not read (train: x_train, y_train; eval: x_val, y_val)",
        # The file named with the arrays eval came from, not as the train file given twice.
        f"data: 6 train and 2 eval examples (from x_val, y_val of {path}) of 5x5x1 uint8 "
        f"pixels, 3 classes, from 1 file(s) in {path}",
    ]


def test_load_arrays_npz_x_val_without_y_val(tmp_path: Path) -> None:
    message = _npz_error(
        tmp_path, x=images(2), y=[0, 1], x_val=images(1), x_test=images(1), y_test=[0]
    )

    assert message == (
        "Expected both `x_val` and `y_val`, or neither. "
        f"Received: ['x', 'x_test', 'x_val', 'y', 'y_test'] ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_x_test_without_y_test(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x_train=images(2), y_train=[0, 1], x_test=images(1))

    assert message == (
        "Expected both `x_test` and `y_test`, or neither. "
        f"Received: ['x_test', 'x_train', 'y_train'] ({tmp_path / 'bad.npz'})"
    )


def test_load_arrays_npz_empty_train_set(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=np.zeros((0, 4, 4), np.uint8), y=np.zeros(0, np.int64))

    assert message == (
        f"Expected at least one training example. Received: 0 examples in {tmp_path / 'bad.npz'}"
    )


def test_load_arrays_npz_shapes_differ_between_files(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=images(2, (4, 4)), y=[0, 1])
    np.savez(tmp_path / "b.npz", x=images(2, (5, 5)), y=[0, 1])

    with pytest.raises(DataError) as error:
        load_arrays(spec("npz", tmp_path), seed=0)

    assert str(error.value) == (
        "Expected every file to hold images of one shape. "
        f"Received: (4, 4, 1) in {tmp_path / 'a.npz'}, (5, 5, 1) in {tmp_path / 'b.npz'}"
    )


def test_load_arrays_npz_pickled_object_array(tmp_path: Path) -> None:
    message = _npz_error(tmp_path, x=np.array([object()] * 2), y=[0, 1])

    assert message.startswith(
        "Expected a readable .npz file. Received: Object arrays cannot be loaded"
    )


def _random_bytes(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 2)


def _lone_npy(path: Path) -> None:
    with open(path, "wb") as f:  # np.save(path) would add ".npy" to the name
        np.save(f, images(2))


def _cut_short(path: Path) -> None:
    np.savez(path, x=images(2), y=[0, 1])
    path.write_bytes(path.read_bytes()[:-30])


@pytest.mark.parametrize(
    "write, what",
    [
        (_random_bytes, "a file that is not a zip archive, or one cut short"),
        (_lone_npy, "a single .npy array"),
        (_cut_short, "a file that is not a zip archive, or one cut short"),
    ],
    ids=["random-bytes", "npy", "cut-short"],
)
def test_load_arrays_npz_that_is_not_a_zip(
    tmp_path: Path, write: Callable[[Path], None], what: str
) -> None:
    # Not numpy's "pickled data" refusal, nor a TypeError from a lone .npy array.
    path = tmp_path / "x.npz"
    write(path)
    with pytest.raises(DataError) as error:
        load_arrays(spec("npz", path), seed=0)
    assert (
        str(error.value)
        == f"Expected an .npz file (a zip archive of .npy arrays). Received: {what} ({path})"
    )


@pytest.mark.parametrize(
    ("save", "damage", "reason"),
    [
        (np.savez, damage_first_member, "Bad CRC-32 for file 'x.npy'"),
        (np.savez_compressed, damage_first_member, "Error -3 while decompressing"),
        (np.savez, flag_first_member_encrypted, "File 'x.npy' is encrypted"),
    ],
    ids=["stored", "compressed", "encrypted"],
)
def test_load_arrays_npz_damaged_inside_names_the_file(
    tmp_path: Path, save: Callable[..., None], damage: Callable[[Path], None], reason: str
) -> None:
    # A zip whose member is damaged: BadZipFile and zlib.error are not OSErrors, so the job
    # ended with "Cannot load the data: BadZipFile: Bad CRC-32 for file 'x.npy'", no file;
    # an encrypted member's RuntimeError did the same.
    path = tmp_path / "x.npz"
    save(path, x=images(200, (8, 8)), y=np.zeros(200, np.int64))
    damage(path)

    with pytest.raises(DataError) as error:
        load_arrays(spec("npz", path), seed=0)

    message = str(error.value)
    assert message.startswith(f"Expected a readable .npz file. Received: {reason}"), message
    assert message.endswith(f" ({path})")


def test_load_arrays_missing_path_is_data_files_error(tmp_path: Path) -> None:
    with pytest.raises(DataFilesError):
        load_arrays(spec("npz", tmp_path / "none.npz"), seed=0)


# --- tfrecord --------------------------------------------------------------------------


def test_load_arrays_reads_tfrecord_with_pixels(tmp_path: Path) -> None:
    x = images(5, (3, 3, 1))
    write_tfrecord(tmp_path / "mnist.tfrecord", x, [1, 2, 3, 4, 0], shape_features="pixels")

    arrays = load_arrays(spec("tfrecord", tmp_path, eval_fraction=0.2), seed=0)

    assert (arrays.x_train.shape, arrays.x_train.dtype) == ((4, 3, 3, 1), np.uint8)
    np.testing.assert_array_equal(arrays.x_train, x[:4])
    np.testing.assert_array_equal(arrays.y_eval, [0])
    assert arrays.y_train.dtype == np.int32


def test_load_arrays_reads_tfrecord_height_width_channels_and_eval_files(tmp_path: Path) -> None:
    x = images(3, (2, 5, 3))
    write_tfrecord(tmp_path / "train-0.tfrecord", x[:2], [0, 1])
    # `.GZ` as `.gz`, as the folder rule and the service's check take it: the worker read
    # it as a plain file, and failed after the job's wait.
    write_tfrecord(tmp_path / "eval-0.tfrecord.GZ", x[2:], [4])

    arrays = load_arrays(spec("tfrecord", tmp_path / "*"), seed=0)

    assert (arrays.x_train.shape, arrays.x_eval.shape) == ((2, 2, 5, 3), (1, 2, 5, 3))
    np.testing.assert_array_equal(arrays.x_eval, x[2:])
    assert arrays.num_classes == 5


def test_load_arrays_tfrecord_without_shape_features(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "a.tfrecord", images(2, (2, 2, 1)), [0, 1], shape_features="")

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        "Expected `pixels` (a square number) or `height`, `width` and `channels` in every "
        f"record. Received: neither in record 0 ({path})"
    )


def test_load_arrays_tfrecord_image_size_mismatch(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "a.tfrecord", images(3, (2, 3, 1)), [0, 1, 2])
    good = tmp_path / "a.tfrecord"
    records = list(tf.data.TFRecordDataset(str(good)).as_numpy_iterator())
    broken = tf.train.Example.FromString(records[1])
    broken.features.feature["image_raw"].bytes_list.value[0] = b"\x00" * 5
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in (records[0], broken.SerializeToString(), records[2]):
            writer.write(record)

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        f"Expected `image_raw` of 6 bytes (image shape (2, 3, 1)). Received: 5 bytes in record 1 ({path})"
    )


def test_load_arrays_tfrecord_of_encoded_png_images_says_to_decode_them(tmp_path: Path) -> None:
    # A common way to write image TFRecords stores each image's PNG file, which gave only
    # "Expected 64 bytes. Received: 140" here.
    x = images(2, (8, 8, 1))
    path = write_tfrecord(tmp_path / "a.tfrecord", x, [0, 1])
    records = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record, image in zip(records, x, strict=True):
            example = tf.train.Example.FromString(record)
            png = tf.io.encode_png(image.astype(np.uint8)).numpy()
            example.features.feature["image_raw"].bytes_list.value[0] = png
            writer.write(example.SerializeToString())

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value).startswith("Expected `image_raw` of 64 bytes (image shape (8, 8, 1)). ")
    assert "in record 0, which begin as a PNG file does: `image_raw` holds raw uint8 pixels" in str(
        error.value
    )
    assert "decode each image (tf.io.decode_image)" in str(error.value)


def test_load_arrays_tfrecord_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"not a record file at all")

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord file: "
        f"corrupted record at 0 (Is this even a TFRecord file?) ({path})"
    )


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("a.tfrecord", "it begins as a gzip file does: name gzip-compressed TFRecord files *.gz"),
        ("a.npz", "it begins as a zip (or .npz) file does: is `format` right?"),
    ],
)
def test_load_arrays_tfrecord_unreadable_file_says_what_it_looks_like(
    tmp_path: Path, name: str, hint: str
) -> None:
    # Both were "corrupted record at 0 (Is this even a TFRecord file?)" and no more.
    records = write_tfrecord(tmp_path / "records", images(2, (4, 4, 1)), [0, 1]).read_bytes()
    path = tmp_path / name
    if name.endswith(".npz"):
        np.savez(path, x=images(2), y=[0, 1])
    else:
        path.write_bytes(gzip.compress(records))

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value).endswith(f"; {hint} ({path})")


def test_load_arrays_tfrecord_cut_short(tmp_path: Path) -> None:
    # Found by the walk of the headers before TensorFlow reads the file.
    path = write_tfrecord(tmp_path / "a.tfrecord", images(4, (8, 8, 1)), [0, 1, 2, 3])
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    record = len(whole) // 4  # each record's bytes, its header and checksum with them
    assert str(error.value) == (
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord file: "
        f"record 3's header (at byte {3 * record:,}) says {record - 16} bytes of data and a "
        f"4-byte checksum follow it, and {record - 32} bytes do ({path})"
    )


def test_load_arrays_tfrecord_damaged_data_says_what_tensorflow_says(tmp_path: Path) -> None:
    # A record's data that fails its checksum is TensorFlow's to find (the walk reads
    # headers alone): its own message, without the function and op names it wraps.
    path = write_tfrecord(tmp_path / "a.tfrecord", images(4, (8, 8, 1)), [0, 1, 2, 3])
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # in the last record's data
    path.write_bytes(bytes(data))

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    message = str(error.value)
    assert message.startswith(
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord file: "
    )
    assert "corrupted record at" in message and message.endswith(f" ({path})")
    assert "function_node" not in message and "[Op:" not in message


@pytest.mark.parametrize("left", [1, 11])
def test_load_arrays_tfrecord_cut_inside_a_record_header(tmp_path: Path, left: int) -> None:
    # TensorFlow takes a file that ends within a record's 12-byte header (its length and
    # the length's CRC) as ending before that record: 2 of 4 examples were read, silently.
    path = write_tfrecord(tmp_path / "a.tfrecord", images(4, (8, 8, 1)), [0, 1, 2, 3])
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2 + left])

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    half = len(whole) // 2
    assert str(error.value) == (
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord file: "
        f"2 whole records end at byte {half:,} of {half + left:,}, then {left} bytes that are "
        f"no whole record ({path})"
    )


@pytest.mark.parametrize("left", [1, 11])
def test_load_arrays_gzipped_tfrecord_cut_inside_a_record_header(tmp_path: Path, left: int) -> None:
    # TensorFlow's gzip reader drops the bytes after the last whole record as its plain
    # one does, and a gzip'd file's size says nothing of its records: the walk of the
    # inflated stream finds them.
    whole = write_tfrecord(tmp_path / "a.tfrecord", images(4, (8, 8, 1)), [0, 1, 2, 3]).read_bytes()
    path = tmp_path / "a.tfrecord.gz"
    path.write_bytes(gzip.compress(whole + whole[:left]))

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord file: "
        f"4 whole records end at byte {len(whole):,} of {len(whole) + left:,} inflated, then "
        f"{left} bytes that are no whole record ({path})"
    )


def test_load_arrays_gzipped_tfrecord_damaged_inside_names_the_file(tmp_path: Path) -> None:
    path = write_tfrecord(tmp_path / "a.tfrecord.gz", images(4, (8, 8, 1)), [0, 1, 2, 3])
    damage_first_member(path)

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        "Expected a readable gzip file. Received: Error -3 while decompressing data: invalid "
        f"block type ({path})"
    )


REPO = Path(__file__).resolve().parents[2]
# The worker's reader, in a process of its own: a TensorFlow killed by what a file claims
# (SIGSEGV) takes its process with it, which must not be the test run's. One line of JSON
# a file: what the worker says of it, or how many examples it read and their checksum.
_READ_EACH = """
import json, sys, zlib
from trainer.data import load_arrays
from trainer.spec import DataSpec
for path in sys.argv[1:]:
    try:
        arrays = load_arrays(DataSpec(format="tfrecord", path=path, eval_fraction=0), seed=0)
        said = [len(arrays.x_train), zlib.crc32(arrays.x_train.tobytes())]
    except ValueError as error:
        said = str(error)
    print(json.dumps(said), flush=True)
"""


def _worker_reads(paths: list[Path]) -> list[Any]:
    """What the worker's reader says of each file, read one after the other in a process."""
    result = subprocess.run(
        [sys.executable, "-c", _READ_EACH, *map(str, paths)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=120,
    )
    said = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0, (
        f"the worker's reader died (exit {result.returncode}) reading {paths[len(said)]}; "
        f"it said {said} of the files before; stderr: {result.stderr[-1500:]}"
    )
    return said


def test_load_arrays_tfrecord_header_claiming_too_much_fails_the_job_not_the_worker(
    tmp_path: Path,
) -> None:
    # A header claiming 2^40 bytes, its checksum right: TensorFlow allocated what it
    # claimed and the worker died of SIGSEGV (the service then retried it as a crash). The
    # service refuses such a first record in a plain file; a later one, or one in a gzip'd
    # file (whose reader held what the stream had left), reached the worker.
    x = images(4, (8, 8, 1))
    good = write_tfrecord(tmp_path / "good.tfrecord", x, [0, 1, 2, 3])
    records = good.read_bytes()
    lie = tfrecord_header(2**40) + bytes(100)
    noise = b"\xff" * 8 + bytes(4) + bytes(100)  # no header: its length's checksum fails
    files = {
        "plain-later.tfrecord": records + lie,
        "gz-first.tfrecord.gz": gzip.compress(lie),
        "gz-later.tfrecord.gz": gzip.compress(records + lie),
        "plain-noise.tfrecord": records + noise,
        "gz-good.tfrecord.gz": gzip.compress(records),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [tmp_path / name for name in files] + [good]

    said = dict(zip([path.name for path in paths], _worker_reads(paths), strict=True))

    def past(where: str, path: Path) -> str:
        return (
            "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord "
            f"file: {where} says 1,099,511,627,776 bytes of data and a 4-byte checksum follow "
            f"it, and 100 bytes do ({path})"
        )

    at = f"at byte {len(records)}"
    assert said["plain-later.tfrecord"] == past(
        f"record 4's header ({at})", tmp_path / "plain-later.tfrecord"
    )
    assert said["gz-first.tfrecord.gz"] == past(
        "its first record's header", tmp_path / "gz-first.tfrecord.gz"
    )
    assert said["gz-later.tfrecord.gz"] == past(
        f"record 4's header ({at} of the inflated stream)", tmp_path / "gz-later.tfrecord.gz"
    )
    # What TensorFlow says of a header whose checksum fails, before it reads on.
    assert f"corrupted record at {len(records)}" in said["plain-noise.tfrecord"]
    # Good files read the same, plain and gzip'd.
    assert said["gz-good.tfrecord.gz"] == said["good.tfrecord"] == [4, zlib.crc32(x.tobytes())]


def test_load_arrays_tfrecord_skips_empty_shards(tmp_path: Path, caplog) -> None:
    # A sharded writer with fewer examples than shards leaves empty files, which are valid
    # TFRecord files: one refused the whole set ("Expected at least one record").
    write_tfrecord(tmp_path / "train-00000-of-00002.tfrecord", images(4, (8, 8, 1)), [0, 1, 2, 3])
    (tmp_path / "train-00001-of-00002.tfrecord").write_bytes(b"")
    (tmp_path / "eval.tfrecord").write_bytes(b"")

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        arrays = load_arrays(spec("tfrecord", tmp_path), seed=0)

    # The empty eval file means no eval, as empty `x_eval` arrays do: nothing held out.
    assert (arrays.num_train, arrays.num_eval) == (4, 0)
    assert caplog.messages[-1] == (
        "no eval examples (its eval arrays or files are empty): the job runs no eval"
    )


def _bytes_behind(x: np.ndarray) -> int:
    """The bytes of the memory `x` keeps alive: its own, or those of what it is a view of."""
    base: object = x
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return memoryview(base).nbytes  # type: ignore[arg-type]


def test_load_arrays_empty_eval_files_keep_no_training_file_alive(tmp_path: Path) -> None:
    # The empty eval set was cut from the first training file's images: a view of no
    # examples that kept that whole file alive beside the joined set.
    write_tfrecord(tmp_path / "train-0.tfrecord", images(300, (8, 8, 1)), [0, 1, 2] * 100)
    write_tfrecord(tmp_path / "train-1.tfrecord", images(300, (8, 8, 1), seed=1), [0, 1, 2] * 100)
    (tmp_path / "eval.tfrecord").write_bytes(b"")

    arrays = load_arrays(spec("tfrecord", tmp_path), seed=0)

    assert (arrays.num_train, arrays.num_eval) == (600, 0)
    assert arrays.x_eval.shape == (0, 8, 8, 1) and arrays.x_eval.dtype == np.uint8
    assert _bytes_behind(arrays.x_eval) == 0


def test_load_arrays_tfrecord_all_empty_or_not_a_record(tmp_path: Path) -> None:
    (tmp_path / "a.tfrecord").write_bytes(b"")
    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", tmp_path), seed=0)
    assert str(error.value) == (
        f"Expected at least one record. Received: empty TFRecord files: {tmp_path / 'a.tfrecord'}"
    )

    (tmp_path / "a.tfrecord").write_bytes(b"12345")  # shorter than a record's header
    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", tmp_path), seed=0)
    assert str(error.value) == (
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord file: "
        f"0 whole records end at byte 0 of 5, then 5 bytes that are no whole record "
        f"({tmp_path / 'a.tfrecord'})"
    )


def test_load_arrays_tfrecord_of_records_that_are_no_example_says_so(tmp_path: Path) -> None:
    # TensorFlow quotes a record it cannot parse in its message, and could not make one of
    # a JPEG file's bytes: the job said only "'utf-8' codec can't decode byte 0xff".
    path = tmp_path / "a.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(b"\xff\xd8\xff\xe0 a JPEG file")

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        "Expected TFRecord files of tf.train.Example with `image_raw` (bytes) and `label` "
        "(int64). Received: Could not parse example input: a record that is no "
        f"tf.train.Example ({path})"
    )


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        (None, "Feature: label (data type: int64) is required but could not be found."),
        (
            tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])),
            "Key: label, Index: 0.  Data types don't match. Data type: float but expected type: int64",
        ),
    ],
    ids=["no-label", "float-label"],
)
def test_load_arrays_tfrecord_without_an_int64_label_says_so_plainly(
    tmp_path: Path, label: tf.train.Feature | None, reason: str
) -> None:
    # The reason came wrapped in "Error in user-defined function passed to MapDataset:18
    # transformation with iterator: Iterator::Root::ParallelMapV2: Name: <unknown>, ".
    feature = {
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x00" * 4])),
        "pixels": tf.train.Feature(int64_list=tf.train.Int64List(value=[4])),
    }
    if label is not None:
        feature["label"] = label
    path = write_examples(tmp_path / "a.tfrecord", [feature])

    with pytest.raises(DataError) as error:
        load_arrays(spec("tfrecord", path), seed=0)

    assert str(error.value) == (
        "Expected TFRecord files of tf.train.Example with `image_raw` (bytes) and `label` "
        f"(int64). Received: {reason} ({path})"
    )


# --- what the log says -----------------------------------------------------------------


def test_load_arrays_logs_what_it_trains_and_evaluates_on(tmp_path: Path, caplog) -> None:
    # The job's log said nothing of its data: a user could not see that eval came from
    # the t10k files, nor how many examples or what shape the worker found.
    write_idx_pair(tmp_path, "train", images(8, (5, 6)), np.arange(8) % 3)
    write_idx_pair(tmp_path, "t10k", images(2, (5, 6)), np.array([0, 1]))

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(spec("idx", tmp_path), seed=0)

    eval_source = f"{tmp_path}/t10k-images-idx3-ubyte.gz, {tmp_path}/t10k-labels-idx1-ubyte.gz"
    assert caplog.messages == [
        f"data: 8 train and 2 eval examples (from {eval_source}) of 5x6x1 uint8 pixels, "
        f"3 classes, from 1 file(s) in {tmp_path}"
    ]


def test_load_arrays_warns_when_eval_fraction_holds_out_nothing(tmp_path: Path, caplog) -> None:
    np.savez(tmp_path / "tiny.npz", x=images(3), y=[0, 1, 0])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(spec("npz", tmp_path / "tiny.npz", eval_fraction=0.2), seed=0)

    assert caplog.records[-1].levelno == logging.WARNING
    assert caplog.messages[-1] == (
        "no eval examples (eval_fraction 0.2 of 3 examples is less than one): the job runs no eval"
    )


def test_load_arrays_warns_when_eval_holds_classes_training_lacks(tmp_path: Path, caplog) -> None:
    # One file per class: the held-out last 0.2 was all of class 4, which the model never
    # saw; the job succeeded with an eval accuracy of 0 and no word of why.
    for label in range(5):
        np.savez(tmp_path / f"class{label}.npz", x=images(10), y=np.full(10, label))

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(spec("npz", tmp_path, eval_fraction=0.2), seed=0)

    assert caplog.records[-1].levelno == logging.WARNING
    assert caplog.messages[-1] == (
        "10 of 10 eval examples are of classes no training example has (4): the last 0.2 of "
        "the examples, in file order, is held out; shuffle the examples across files, or give "
        "eval data (`x_eval`/`y_eval`, eval files)"
    )


def test_load_arrays_warns_of_tfrecord_folder_files_it_does_not_read(
    tmp_path: Path, caplog
) -> None:
    # Shards named without a suffix beside `train.tfrecord` were skipped without a word:
    # the job trained on 2 of the folder's 6 examples.
    write_tfrecord(tmp_path / "train.tfrecord", images(2, (4, 4, 1)), [0, 1])
    for shard in range(2):
        write_tfrecord(tmp_path / f"train-0000{shard}-of-00002", images(2, (4, 4, 1)), [0, 1])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        arrays = load_arrays(spec("tfrecord", tmp_path, eval_fraction=0.0), seed=0)

    assert arrays.num_train == 2
    assert caplog.records[-1].levelno == logging.WARNING
    assert caplog.messages[-1] == (
        f"2 file(s) in {tmp_path} not read (train-00000-of-00002, train-00001-of-00002): a "
        "folder gives only files named `.tfrecord`, `.tfrecords` or `.tfrec` (optionally "
        f"`.gz`); to read them too, give a glob such as '{tmp_path}/*', which reads every "
        "file it matches"
    )
    # As the warning says: the glob reads all three.
    assert load_arrays(spec("tfrecord", f"{tmp_path}/*", eval_fraction=0.0), seed=0).num_train == 6


def test_load_arrays_warns_of_classes_without_examples(tmp_path: Path, caplog) -> None:
    # Labels 1 and 2 are three classes, as ids count from 0: class 0 trained on nothing,
    # and nothing said so.
    np.savez(tmp_path / "one-two.npz", x=images(4), y=[1, 2, 2, 1])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        arrays = load_arrays(spec("npz", tmp_path / "one-two.npz", eval_fraction=0.25), seed=0)

    assert (arrays.num_classes, arrays.label_range) == (3, (1, 2))
    assert caplog.records[-1].levelno == logging.WARNING
    assert caplog.messages[-1] == (
        "1 of 3 classes have no example (0): class ids count from 0, and the class count is "
        "the largest label + 1 (2 at least); the labels begin at 1: give labels from 0 "
        "(e.g. y - 1)"
    )


def test_load_arrays_warns_of_class_ids_between_labels_without_examples(
    tmp_path: Path, caplog
) -> None:
    np.savez(tmp_path / "gaps.npz", x=images(3), y=[0, 3, 14])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(spec("npz", tmp_path / "gaps.npz", eval_fraction=0.0), seed=0)

    assert caplog.messages[-1] == (
        "12 of 15 classes have no example (1, 2, 4, 5, 6, 7, 8, 9, 10, 11 and 2 more): class "
        "ids count from 0, and the class count is the largest label + 1 (2 at least)"
    )


def test_load_arrays_warns_of_channels_first_images(tmp_path: Path, caplog) -> None:
    # CIFAR as PyTorch lays it out trained silently as 3x32 images of 32 channels.
    np.savez(tmp_path / "cifar.npz", x=images(4, (3, 32, 32)), y=[0, 1, 2, 3])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        arrays = load_arrays(spec("npz", tmp_path / "cifar.npz", eval_fraction=0.0), seed=0)

    assert arrays.image_shape == (3, 32, 32)
    assert caplog.messages[-1] == (
        "images of 3x32x32 (height x width x channels) look channels-first; the layout is "
        "(N, H, W, C): transpose them, e.g. x.transpose(0, 2, 3, 1)"
    )


@pytest.mark.parametrize("dtype", [np.int64, np.uint8])
def test_load_arrays_warns_of_integer_pixels_of_zero_and_one(
    tmp_path: Path, caplog, dtype: type
) -> None:
    # (x > 0).astype(int) trained as images of 1/255 at most, without a word.
    np.savez(tmp_path / "masks.npz", x=(images(4) > 127).astype(dtype), y=[0, 1, 0, 1])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(spec("npz", tmp_path / "masks.npz", eval_fraction=0.0), seed=0)

    assert caplog.records[-1].levelno == logging.WARNING
    assert caplog.messages[-1] == (
        "integer pixels are 0 and 1 only: integers are read as 0-255, so these images are fed "
        "as nearly black (1/255 at most); save them as bool or float32 in [0, 1], or as 0 and 255"
    )


def test_load_arrays_bool_pixels_do_not_warn(tmp_path: Path, caplog) -> None:
    np.savez(tmp_path / "masks.npz", x=images(4) > 127, y=[0, 1, 0, 1])

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(spec("npz", tmp_path / "masks.npz", eval_fraction=0.0), seed=0)

    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_load_arrays_asked_for_no_eval_does_not_warn(caplog) -> None:
    data = DataSpec(format="synthetic", eval_fraction=0.0, params={"size": 10})

    with caplog.at_level(logging.INFO, logger="trainer.data"):
        load_arrays(data, seed=0)

    assert caplog.messages == [
        "data: 10 train and 0 eval examples (none held out: eval_fraction 0) of 28x28x1 "
        "float32 pixels, 10 classes, from synthetic data"
    ]


# --- synthetic ---------------------------------------------------------------------------


def test_load_arrays_generates_synthetic_from_seed() -> None:
    data = DataSpec(format="synthetic", params={"shape": [6, 5], "classes": 3, "size": 50})

    arrays = load_arrays(data, seed=1)

    assert (arrays.x_train.shape, arrays.x_eval.shape) == ((40, 6, 5, 1), (10, 6, 5, 1))
    assert (arrays.x_train.dtype, arrays.y_train.dtype, arrays.num_classes) == (
        np.float32,
        np.int32,
        3,
    )
    assert arrays.x_train.min() >= 0.0 and arrays.x_train.max() <= 1.0
    assert np.bincount(np.concatenate([arrays.y_train, arrays.y_eval])).tolist() == [17, 17, 16]
    np.testing.assert_array_equal(load_arrays(data, seed=1).x_train, arrays.x_train)
    assert not np.array_equal(load_arrays(data, seed=2).x_train, arrays.x_train)


def test_load_arrays_synthetic_noise_is_the_spread_about_each_class() -> None:
    # `data.params.noise`: Gaussian noise about each class's prototype (then clipped to
    # [0, 1]). With none, every example of a class is its prototype.
    def examples(noise: float) -> list[np.ndarray]:
        params = {"shape": [6, 6], "classes": 2, "size": 400, "noise": noise}
        arrays = load_arrays(DataSpec(format="synthetic", params=params), seed=0)
        return [arrays.x_train[arrays.y_train == label] for label in (0, 1)]

    def spread(noise: float) -> float:
        return max(float(x.std(axis=0, dtype=np.float64).mean()) for x in examples(noise))

    assert all((x == x[0]).all() for x in examples(0.0))
    assert 0.03 < spread(0.05) < 0.06
    assert spread(0.3) > 4 * spread(0.05)


def test_train_mlp_on_synthetic_data_to_full_accuracy() -> None:
    import keras

    data = DataSpec(format="synthetic", params={"shape": [28, 28, 1]})  # defaults otherwise
    arrays = load_arrays(data, seed=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(arrays.image_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(64, "relu"),
            keras.layers.Dense(arrays.num_classes),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

    model.fit(
        train_dataset(arrays, data, 64, seed=0),
        steps_per_epoch=200,
        epochs=1,
        shuffle=False,
        verbose=0,
    )
    _, accuracy = model.evaluate(eval_dataset(arrays, 256), verbose=0)

    assert accuracy >= 0.99


# --- train_dataset -----------------------------------------------------------------------


def test_train_dataset_scales_uint8_to_unit_floats() -> None:
    arrays = Arrays(
        np.array([[[[0]], [[255]]]], np.uint8),
        np.array([1], np.int32),
        np.zeros((0, 2, 1, 1), np.uint8),
        np.zeros(0, np.int32),
        2,
    )

    ((x, y),) = batches(train_dataset(arrays, DataSpec(format="synthetic"), 4, seed=0), 1)

    assert (x.dtype, y.dtype, x.shape) == (np.float32, np.int32, (1, 2, 1, 1))
    assert x.ravel().tolist() == [0.0, 1.0]


def test_train_dataset_feeds_float_pixels_unscaled() -> None:
    x = np.array([[[[0.25]], [[1.0]]]], np.float32)
    arrays = Arrays(x, np.array([0], np.int32), x[:0], np.zeros(0, np.int32), 2)

    ((batch, _),) = batches(train_dataset(arrays, DataSpec(format="synthetic"), 4, seed=0), 1)

    assert batch.ravel().tolist() == [0.25, 1.0]


def test_train_dataset_ends_each_epoch_with_partial_batch() -> None:
    arrays = arrays_of(10)

    out = batches(train_dataset(arrays, DataSpec(format="synthetic"), 4, seed=0), 6)

    assert [len(y) for _, y in out] == [4, 4, 2, 4, 4, 2]
    first = np.concatenate([y for _, y in out[:3]])
    second = np.concatenate([y for _, y in out[3:]])
    assert sorted(first) == sorted(second) == list(range(10))  # each epoch: every example once
    assert first.tolist() != second.tolist()  # in a fresh order
    assert first.tolist() != list(range(10))


def test_train_dataset_draws_a_new_order_every_epoch() -> None:
    # One batch an epoch, 300 epochs: no order may come back. Seeded as it was,
    # `tf.random.experimental.index_shuffle` had 256 orders for sets below 65,536 examples.
    out = batches(train_dataset(arrays_of(100), DataSpec(format="synthetic"), 100, seed=0), 300)

    assert all(sorted(y) == list(range(100)) for _, y in out)
    assert len({tuple(y) for _, y in out}) == 300


def test_train_dataset_repeats_batches_for_same_seed_only() -> None:
    arrays, data = arrays_of(50), DataSpec(format="synthetic", augment={"brightness": 0.3})

    first = batches(train_dataset(arrays, data, 8, seed=3), 10)
    again = batches(train_dataset(arrays, data, 8, seed=3), 10)
    other = batches(train_dataset(arrays, data, 8, seed=4), 10)

    assert_same_batches(first, again)
    assert not np.array_equal(
        np.concatenate([y for _, y in first]), np.concatenate([y for _, y in other])
    )


def test_restore_train_iterator_from_checkpoint_continues_exactly(tmp_path: Path) -> None:
    arrays = arrays_of(10_000, (28, 28, 1))
    data = DataSpec(format="synthetic", augment={"flip_left_right": True, "random_crop_padding": 2})
    iterator = iter(train_dataset(arrays, data, 32, seed=0))
    for _ in range(5):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt" / "data"))
    expected = [next(iterator) for _ in range(3)]

    restored = iter(train_dataset(arrays, data, 32, seed=0))
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    received = [next(restored) for _ in range(3)]

    assert_same_batches(
        [(x.numpy(), y.numpy()) for x, y in expected], [(x.numpy(), y.numpy()) for x, y in received]
    )
    size = sum(file.stat().st_size for file in (tmp_path / "ckpt").iterdir())
    assert size < 1_000_000, f"checkpoint of {size} bytes"


# --- augmentation --------------------------------------------------------------------


def _augmented(augment: dict[str, Any], x: np.ndarray, seed: int = 0, count: int = 4):
    """(augmented batch, original images of that batch), over `count` batches of 8."""
    n = len(x)
    arrays = Arrays(x, np.arange(n, dtype=np.int32), x[:0], np.zeros(0, np.int32), n)
    out = batches(
        train_dataset(arrays, DataSpec(format="synthetic", augment=augment), 8, seed), count
    )
    augmented = np.concatenate([xb for xb, _ in out])
    order = np.concatenate([yb for _, yb in out])
    return augmented, x[order].astype(np.float32) / 255.0


@pytest.mark.parametrize("channels", [1, 3])
def test_augment_flip_left_right_mirrors_some_images(channels: int) -> None:
    augmented, original = _augmented({"flip_left_right": True}, images(32, (3, 5, channels)))

    mirrored = [np.array_equal(a, o[:, ::-1]) for a, o in zip(augmented, original, strict=True)]
    kept = [np.array_equal(a, o) for a, o in zip(augmented, original, strict=True)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True))
    assert 0 < sum(mirrored) < 32


@pytest.mark.parametrize("shape", [(6, 6, 1), (6, 4, 3)])
def test_augment_random_crop_padding_shifts_with_zero_fill(shape: tuple[int, int, int]) -> None:
    pad, (height, width, _) = 2, shape
    augmented, original = _augmented({"random_crop_padding": pad}, images(32, shape) | 1)

    shifts = []
    for a, o in zip(augmented, original, strict=True):
        padded = np.pad(o, ((pad, pad), (pad, pad), (0, 0)))
        crops = {
            (dy, dx): padded[pad + dy : pad + dy + height, pad + dx : pad + dx + width]
            for dy in range(-pad, pad + 1)
            for dx in range(-pad, pad + 1)
        }
        matches = [shift for shift, crop in crops.items() if np.array_equal(a, crop)]
        assert len(matches) == 1  # pixels are never 0 (`| 1`), so the shift is unique
        shifts.append(matches[0])
    assert len(set(shifts)) > 5


@pytest.mark.parametrize("shape", [(6, 6, 1), (6, 4, 3)])
def test_augment_flip_and_crop_together_shift_some_mirrored_images(
    shape: tuple[int, int, int],
) -> None:
    # Both on, the flip is taken in the crop's column gather: each image is still one
    # shift of itself or of its mirror image, with zero fill.
    pad, (height, width, _) = 2, shape
    augmented, original = _augmented(
        {"flip_left_right": True, "random_crop_padding": pad}, images(32, shape) | 1
    )

    mirrored = 0
    for a, o in zip(augmented, original, strict=True):
        matches = []
        for flipped, image in ((False, o), (True, o[:, ::-1])):
            padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
            matches += [
                (flipped, dy, dx)
                for dy in range(-pad, pad + 1)
                for dx in range(-pad, pad + 1)
                if np.array_equal(
                    a, padded[pad + dy : pad + dy + height, pad + dx : pad + dx + width]
                )
            ]
        assert len(matches) == 1, matches  # random pixels, never 0: one crop matches
        mirrored += matches[0][0]
    assert 0 < mirrored < 32


def test_augment_brightness_adds_one_delta_per_image() -> None:
    augmented, original = _augmented({"brightness": 0.2}, np.full((32, 3, 3, 1), 128, np.uint8))

    deltas = (augmented - original).reshape(32, -1)
    np.testing.assert_allclose(deltas, deltas[:, :1].repeat(9, axis=1), atol=1e-6)
    assert np.abs(deltas).max() <= 0.2 + 1e-6 and len(np.unique(deltas[:, 0].round(6))) == 32


@pytest.mark.parametrize("channels", [1, 3])
def test_augment_contrast_scales_around_image_mean(channels: int) -> None:
    # Three pixels near mid-grey per image, so no contrast factor in [0.5, 1.5] clips them;
    # each channel of its own mean (10 apart), which its pixels are scaled around.
    x = (
        np.array([96, 128, 160], np.uint8)[None, None, :, None]
        + np.arange(32)[:, None, None, None]
        + 10 * np.arange(channels)[None, None, None, :]
    ).astype(np.uint8)
    augmented, original = _augmented({"contrast": 0.5}, x)

    mean = original.mean(axis=(1, 2), keepdims=True)
    factors = (augmented[:, 0, 2, 0] - augmented[:, 0, 0, 0]) / (
        original[:, 0, 2, 0] - original[:, 0, 0, 0]
    )
    np.testing.assert_allclose(
        augmented, (original - mean) * factors[:, None, None, None] + mean, atol=1e-5
    )
    assert factors.min() >= 0.5 - 1e-5 and factors.max() <= 1.5 + 1e-5
    assert len(np.unique(factors.round(5))) == 32


def test_augment_all_keeps_unit_range_and_draws_afresh_per_batch() -> None:
    every = {"flip_left_right": True, "random_crop_padding": 3, "brightness": 1.0, "contrast": 0.9}
    x = images(8, (8, 8, 1))

    augmented, original = _augmented(every, x, count=2)  # each batch: all 8 images
    again, _ = _augmented(every, x, count=2)

    assert augmented.min() >= 0.0 and augmented.max() <= 1.0
    assert not np.allclose(augmented, original)
    np.testing.assert_array_equal(augmented, again)  # deterministic per (seed, counter)
    _, order = np.unique(original.reshape(16, -1), axis=0, return_inverse=True)
    first, second = augmented[:8][np.argsort(order[:8])], augmented[8:][np.argsort(order[8:])]
    assert not np.allclose(first, second)  # same images, next counter: new draws


def test_augment_changes_train_images_but_not_eval_images() -> None:
    x, y = images(8, (5, 5, 1)), np.arange(8, dtype=np.int32)
    arrays = Arrays(x, y, x, y, num_classes=8)  # the same images in both splits
    data = DataSpec(format="synthetic", augment={"flip_left_right": True, "brightness": 0.5})
    raw = x.astype(np.float32) / 255.0

    ((train_x, train_y),) = batches(train_dataset(arrays, data, 8, seed=0), 1)
    ((eval_x, eval_y),) = batches(eval_dataset(arrays, 8), 1)

    assert not np.allclose(train_x, raw[train_y])
    np.testing.assert_array_equal(eval_x, raw)
    np.testing.assert_array_equal(eval_y, y)


# --- eval_dataset and steps_per_epoch -------------------------------------------------


def test_eval_dataset_yields_eval_examples_once_in_order() -> None:
    arrays = arrays_of(4, n_eval=7)

    out = batches(eval_dataset(arrays, 3), 100)

    assert [y.tolist() for _, y in out] == [[4, 5, 6], [7, 8, 9], [10]]
    np.testing.assert_array_equal(
        np.concatenate([x for x, _ in out]), arrays.x_eval.astype(np.float32) / 255.0
    )


def test_eval_dataset_stops_after_the_batches_asked_for() -> None:
    arrays = arrays_of(4, n_eval=7)

    assert [y.tolist() for _, y in batches(eval_dataset(arrays, 3, batches=2), 100)] == [
        [4, 5, 6],
        [7, 8, 9],
    ]
    assert len(batches(eval_dataset(arrays, 3, batches=10), 100)) == 3


def test_steps_per_epoch_rounds_up() -> None:
    assert [steps_per_epoch(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_steps_per_epoch_rejects_zero_batch_size() -> None:
    with pytest.raises(ValueError) as error:
        steps_per_epoch(10, 0)

    assert str(error.value) == "Expected `batch_size` to be a positive int. Received: batch_size=0"


def _rss_bytes() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc (Linux)")
def test_the_pipelines_hold_the_images_once_after_the_loaded_arrays_go() -> None:
    """A run held its images three times for good: the loaded arrays, `tf.constant`'s copy
    with its staging buffer, and a copy tf.data's graph rewrites made. Now TensorFlow's one
    copy, once the loaded arrays are dropped as the worker drops them."""
    import gc

    before = _rss_bytes()
    x = np.full((4000, 256, 256, 1), 7, np.uint8)  # 250 MiB, every page touched
    arrays = Arrays(x[:3200], np.zeros(3200, np.int32), x[3200:], np.zeros(800, np.int32), 10)
    x_bytes = x.nbytes
    del x
    data = DataSpec(format="synthetic")
    with tf.device("/CPU:0"):
        batches = iter(train_dataset(arrays, data, batch_size=8, seed=0))
    evals = eval_dataset(arrays, batch_size=8)
    images, _ = next(batches)
    assert float(images[0, 0, 0, 0]) == pytest.approx(7 / 255)
    assert next(iter(evals))[0].shape == (8, 256, 256, 1)
    arrays = arrays.without_images()
    gc.collect()
    assert arrays.num_train == 3200 and arrays.image_shape == (256, 256, 1)
    held = _rss_bytes() - before
    # Once (250 MiB, and some 30 MiB of TensorFlow's first pipeline); twice was 1.7 times.
    assert held < 1.4 * x_bytes, f"{held / 2**20:.0f} MiB held for 250 MiB of images"


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from VmRSS


def _peak_rss_bytes() -> int:
    return int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024


def _write_large(fmt: str, folder: Path, x: np.ndarray, y: np.ndarray) -> DataSpec:
    """`x`, `y` in a file of `fmt` (written with fast compression: the data is constant)."""
    if fmt == "idx, 8 files":  # joined holding the images once, and one file's again
        for i, (xs, ys) in enumerate(zip(np.split(x, 8), np.split(y, 8), strict=True)):
            write_idx(folder / f"{i}-images-idx3-ubyte", xs)
            write_idx(folder / f"{i}-labels-idx1-ubyte", ys)
        return spec("idx", folder / "*-ubyte")
    if fmt == "tfrecord":  # smaller images, more records: parsed 1,024 records a batch
        x = x[:, :125, :].reshape(-1, 125, 125, 1)
        y = np.resize(y, len(x))
        return spec("tfrecord", write_tfrecord(folder / "set.tfrecord", x, y))
    if fmt.startswith("idx"):
        gz = fmt.endswith(".gz")
        for name, array in (("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y)):
            raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            path = folder / (name + (".gz" if gz else ""))
            with gzip.open(path, "wb", compresslevel=1) if gz else open(path, "wb") as f:
                f.write(raw)
                f.write(array.data)
        return spec("idx", folder)
    save = np.savez_compressed if fmt == "npz, compressed" else np.savez
    save(folder / "set.npz", x=x, y=y)
    return spec("npz", folder / "set.npz")


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="resets the peak RSS through /proc (Linux)"
)
@pytest.mark.parametrize(
    "fmt", ["idx", "idx.gz", "idx, 8 files", "npz", "npz, compressed", "tfrecord", "synthetic"]
)
def test_a_job_start_holds_its_images_once_at_its_peak(tmp_path: Path, fmt: str) -> None:
    """From the files to the first batches, as a worker starts: the images are read into
    memory TensorFlow shares (`trainer.hostarrays`), so the peak holds them once. It held
    them three times: the loaded arrays, TensorFlow's copy and the temporary it was made
    through (a data set of a third of the worker's memory could not start)."""
    # 179 MiB of images. The eval part (0.2) is held out at an offset TensorFlow cannot
    # share (rows of 62,500 bytes), so it is copied out and its pages given back.
    n, side = 3072, 250
    if fmt == "synthetic":
        data = DataSpec(
            format="synthetic", params={"shape": [90, 90, 1], "classes": 10, "size": 2 * n}
        )
        images_bytes = 2 * n * 90 * 90 * 4  # rows of 32,400 bytes
    else:
        x = np.full((n, side, side), 7, np.uint8)
        data = _write_large(fmt, tmp_path, x, (np.arange(n) % 10).astype(np.uint8))
        images_bytes = x.nbytes
        del x
    before = _rss_bytes()
    _reset_peak_rss()

    arrays = load_arrays(data, seed=0)
    with tf.device("/CPU:0"):
        batch, _ = next(iter(train_dataset(arrays, data, batch_size=8, seed=0)))
        evals = eval_dataset(arrays, batch_size=8)
    assert next(iter(evals))[0].shape[0] == 8
    arrays = arrays.without_images()

    peak = _peak_rss_bytes() - before
    if fmt != "synthetic":
        assert float(batch[0, 0, 0, 0]) == pytest.approx(7 / 255)
    # Once, and TensorFlow's first pipelines (some 30 MiB); three times was 3.0x.
    assert peak < 1.3 * images_bytes, f"peak {peak / 2**20:.0f} MiB for {images_bytes >> 20} MiB"


TIB_DIMS = (1 << 20, 1024, 1024)  # 1 TiB of uint8 images: more than any test host has


def write_tib_headers(folder: Path, fmt: str) -> Path:
    """Files whose headers say they hold 1 TiB of images, with next to nothing in them
    (an IDX file sparse to its full size; an .npz member cut short after its header)."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "idx":
        images = folder / "train-images-idx3-ubyte"
        with open(images, "wb") as f:
            f.write(bytes([0, 0, 0x08, 3]) + struct.pack(">3I", *TIB_DIMS))
            f.truncate(16 + (1 << 40))  # sparse: no disk, and nothing to read before refusing
        write_idx(folder / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
        return folder
    # A member's size is in the zip directory, and one whose header claims more than it
    # holds is damaged; a real one of 1 TiB would need 1 TiB of disk (or 1 GB compressed).
    # So the file is small, and the test makes the host smaller (`small_host`).
    path = folder / "big.npz"
    np.savez(path, x=np.zeros((64, 64, 64), np.uint8), y=np.zeros(64, np.int64))
    return path


def small_host(monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """For .npz: a host with 64 KiB of memory to spare, less than the file's 256 KiB of
    images (no test host has less than 1 TiB of IDX's sparse file)."""
    if fmt == "npz":
        monkeypatch.setattr("trainer.data.available_bytes", lambda: 64 << 10)


@pytest.mark.parametrize("fmt", ["idx", "npz"])
def test_load_arrays_refuses_a_file_larger_than_memory_before_reading_it(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker reading more than it has was killed by the out-of-memory killer partway
    through the file; the header says how much there is, so it fails in one line first."""
    path = write_tib_headers(tmp_path, fmt)
    small_host(monkeypatch, fmt)

    with pytest.raises(NotEnoughMemory) as refused:
        load_arrays(spec(fmt, path), seed=0)

    needed, source = (
        ("1024.0 GiB", f"{tmp_path / 'train-images-idx3-ubyte'} (dims {TIB_DIMS})")
        if fmt == "idx"
        else ("0.0 GiB", f"{path} (x.npy, shape (64, 64, 64))")
    )
    message = str(refused.value)
    assert message.startswith(
        f"Expected room in memory for {needed} more: {source} holds that much to read. Received: "
    ), message
    assert message.endswith(
        "GiB available to this worker. Train on fewer or smaller images (a narrower "
        "data.path glob), or run it where it has more memory"
    )


def test_load_arrays_npz_header_that_claims_more_than_its_member_holds(tmp_path: Path) -> None:
    # A header of 10^12 bytes over 100: it read as "Not enough memory" (exit 1, "resume it
    # where there is room"), though no host would ever read it.
    path = write_lying_npz(tmp_path / "lying.npz")

    with pytest.raises(DataError) as error:
        load_arrays(spec("npz", path), seed=0)

    assert str(error.value) == (
        "Expected a readable .npz file. Received: the header of x.npy says shape "
        "(1000000, 1000, 1000) of uint8, 1,000,000,000,000 bytes, and the member holds "
        f"100: damaged, or written cut short ({path})"
    )


def test_load_arrays_idx_gzip_header_that_claims_more_than_the_file_can_hold(
    tmp_path: Path,
) -> None:
    write_idx_pair(tmp_path, "train", images(3), np.array([0, 1, 2]), gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + struct.pack(">3I", 10**6, 1000, 1000)))

    with pytest.raises(DataError) as error:
        load_arrays(spec("idx", tmp_path), seed=0)

    message = str(error.value)
    assert message.startswith(
        "Expected 1,000,000,000,000 bytes of data for dims (1000000, 1000, 1000). "
        "Received: a gzip file that holds at most "
    ), message
    assert message.endswith(f"(the header is damaged, or the file cut short) ({path})")
