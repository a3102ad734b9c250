"""Host arrays TensorFlow shares instead of copying (trainer.hostarrays)."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from trainer import hostarrays


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((3, 28, 28, 1), np.uint8), ((5, 7), np.float32), ((11,), np.int32), ((0, 4), np.uint8)],
)
def test_empty_starts_on_a_64_byte_boundary(shape: tuple[int, ...], dtype: type) -> None:
    for _ in range(5):  # numpy's own allocations land on 16 bytes: not by chance
        array = hostarrays.empty(shape, dtype)
        assert array.shape == shape and array.dtype == dtype
        assert array.ctypes.data % 64 == 0 or array.size == 0  # no data to align
        assert array.flags.c_contiguous and array.flags.writeable
        assert hostarrays.shareable(array)


def test_to_tensor_shares_an_aligned_array() -> None:
    array = hostarrays.empty((4, 2, 2, 1), np.uint8)
    array[:] = 7
    tensor = hostarrays.to_tensor(array)
    assert tensor.device.endswith("CPU:0") and tensor.dtype == tf.uint8
    array[0, 0, 0, 0] = 9  # the same memory: TensorFlow sees the write (nothing writes later)
    assert int(tensor[0, 0, 0, 0]) == 9
    del array
    gc.collect()
    # The tensor keeps the buffer alive on its own.
    assert tf.reduce_sum(tf.cast(tensor, tf.int32)).numpy() == 9 + 15 * 7


@pytest.mark.parametrize("kind", ["offset", "read-only", "fortran", "strided"])
def test_to_tensor_copies_an_array_it_cannot_share_once(kind: str) -> None:
    base = hostarrays.empty((17, 5), np.float32)
    base[:] = np.arange(85, dtype=np.float32).reshape(17, 5)
    if kind == "offset":
        array = base[1:]  # 20 bytes past the boundary
    elif kind == "read-only":
        array = base
        array.flags.writeable = False
    elif kind == "fortran":
        array = np.asfortranarray(base)
    else:
        array = base[::2]  # every other row: not contiguous
    assert not hostarrays.shareable(array)
    assert hostarrays.copied_bytes(array, hostarrays.empty((3,), np.int32)) == array.nbytes

    tensor = hostarrays.to_tensor(array)

    np.testing.assert_array_equal(tensor.numpy(), array)
    base.flags.writeable = True
    base[-1, -1] = -1.0  # a copy: the tensor keeps the values it was given
    assert float(tensor[-1, -1]) == 84.0


def test_to_tensor_takes_an_empty_array() -> None:
    tensor = hostarrays.to_tensor(hostarrays.empty((0, 28, 28, 1), np.uint8))
    assert tensor.shape == (0, 28, 28, 1) and tensor.dtype == tf.uint8


def test_cast_converts_into_an_aligned_array_and_keeps_one_that_is() -> None:
    ints = np.array([[0, 255], [7, 8]], np.int64)
    floats = hostarrays.cast(ints, np.float32)
    assert floats.dtype == np.float32 and hostarrays.shareable(floats)
    np.testing.assert_array_equal(floats, [[0.0, 255.0], [7.0, 8.0]])
    assert hostarrays.cast(floats, np.float32) is floats


def test_concatenate_is_aligned_and_in_order() -> None:
    joined = hostarrays.concatenate([np.ones((2, 3), np.uint8), np.zeros((1, 3), np.uint8)])
    assert hostarrays.shareable(joined)
    np.testing.assert_array_equal(joined, [[1, 1, 1], [1, 1, 1], [0, 0, 0]])


def _rss_bytes() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc (Linux)")
def test_split_at_an_unaligned_row_holds_the_memory_once() -> None:
    rows, width = 8000, 4 * 1024 + 3  # rows of 4099 bytes: a row's start is rarely aligned
    x = hostarrays.empty((rows, width), np.uint8)  # 31 MiB: a mapping of its own
    x[:] = (np.arange(rows) % 251).astype(np.uint8)[:, None]
    keep = 6403  # the tail starts 4099 * 6403 bytes in: not on 64 bytes
    before = _rss_bytes()

    head, tail = hostarrays.split(x, keep)

    grown = _rss_bytes() - before
    assert hostarrays.shareable(head) and hostarrays.shareable(tail)
    assert not np.shares_memory(tail, x)  # copied out, and its pages in x given back
    assert grown < 0.05 * x.nbytes, f"{grown >> 20} MiB more for a {tail.nbytes >> 20} MiB tail"
    # Every row as it was, the head's last (on a page it shares with the tail's first) too.
    np.testing.assert_array_equal(head[:, 0], np.arange(keep) % 251)
    np.testing.assert_array_equal(head[-1], np.full(width, (keep - 1) % 251, np.uint8))
    np.testing.assert_array_equal(tail[:, -1], np.arange(keep, rows) % 251)


def test_split_at_an_aligned_row_or_of_a_small_array_keeps_the_values() -> None:
    aligned = hostarrays.empty((100, 64), np.uint8)
    aligned[:] = np.arange(100, dtype=np.uint8)[:, None]
    head, tail = hostarrays.split(aligned, 30)
    assert np.shares_memory(tail, aligned)  # starts on 64 bytes: shared as it is
    np.testing.assert_array_equal(tail[:, 0], np.arange(30, 100))

    small = hostarrays.empty((10, 3), np.float32)  # in numpy's own memory: nothing to give back
    small[:] = np.arange(30, dtype=np.float32).reshape(10, 3)
    head, tail = hostarrays.split(small, 7)
    assert hostarrays.shareable(tail)
    np.testing.assert_array_equal(np.concatenate([head, tail]), np.arange(30).reshape(10, 3))
