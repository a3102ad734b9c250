"""Host arrays that TensorFlow takes without copying them, so a job holds its images once.

TensorFlow copies a numpy array it is given (`tf.constant`, `tf.convert_to_tensor`, any
op), and makes that copy through a temporary one as large: with the loaded arrays, a
job's start held its images three times (410 MB of images raised the worker's peak by
1,080 MB). DLPack hands an array's buffer to TensorFlow as it is, where the array is
C-contiguous and writeable (DLPack as numpy exports it cannot say read-only) and starts
on a 64-byte boundary, the alignment TensorFlow's CPU kernels assume (Eigen's): numpy's
own allocations keep 16. So the loaders make their arrays here (`empty`, `cast`,
`concatenate`), and `to_tensor` shares those and copies any other array once, straight
into an aligned buffer it then shares.

The tensor keeps the array's buffer alive, and sees any later write to it: an array
handed over is TensorFlow's, and nothing writes to it again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

ALIGNMENT = 64


def empty(shape: Sequence[int], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(tuple(shape))


def cast(x: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
    """`x.astype(dtype)`, into an aligned array (`x` itself where it is one already)."""
    if x.dtype == dtype and shareable(x):
        return x
    out = empty(x.shape, dtype)
    np.copyto(out, x, casting="unsafe")
    return out


def concatenate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """`np.concatenate(arrays)` (of one dtype), into an aligned array."""
    first = arrays[0]
    out = empty((sum(len(x) for x in arrays), *first.shape[1:]), first.dtype)
    return np.concatenate(arrays, out=out)


def shareable(x: np.ndarray) -> bool:
    """Whether `to_tensor(x)` shares `x`'s buffer instead of copying it (an empty array
    has no data to align: numpy may place it anywhere)."""
    aligned = x.ctypes.data % ALIGNMENT == 0 or x.size == 0
    return bool(x.flags.c_contiguous and x.flags.writeable and aligned)


def copied_bytes(*arrays: np.ndarray) -> int:
    """The bytes `to_tensor` copies to take `arrays`."""
    return sum(x.nbytes for x in arrays if not shareable(x))


def to_tensor(x: np.ndarray) -> tf.Tensor:
    """`x` as a tensor on the host: its own buffer where `shareable(x)`, else one aligned
    copy of it (and nothing more: no temporary as large on the way)."""
    x = cast(x, x.dtype)  # itself where shareable
    with tf.device("/CPU:0"):
        return tf.experimental.dlpack.from_dlpack(x.__dlpack__())
