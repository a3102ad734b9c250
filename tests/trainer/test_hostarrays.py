"""Host arrays TensorFlow shares instead of copying (trainer.hostarrays)."""

from __future__ import annotations

import gc

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
