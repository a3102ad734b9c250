"""Host arrays that TensorFlow takes without copying them, so a job holds its images once.

TensorFlow copies a numpy array it is given (`tf.constant`, `tf.convert_to_tensor`, any
op), and makes that copy through a temporary one as large: with the loaded arrays, a
job's start held its images three times (410 MB of images raised the worker's peak by
1,080 MB). DLPack hands an array's buffer to TensorFlow as it is, where the array is
C-contiguous and writeable (DLPack as numpy exports it cannot say read-only) and starts
on a 64-byte boundary, the alignment TensorFlow's CPU kernels assume (Eigen's): numpy's
own allocations keep 16. So the loaders make their arrays here (`empty`, `cast`,
`concatenate`, and `split` for a held-out part), and `to_tensor` shares those and copies
any other array once, straight into an aligned buffer it then shares.

The tensor keeps the array's buffer alive, and sees any later write to it: an array
handed over is TensorFlow's, and nothing writes to it again.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

ALIGNMENT = 64
MAPPED_FROM = 1 << 20  # bytes: see `empty`


def empty(shape: Sequence[int], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary.

    From 1 MiB up, its memory is a mapping of its own (page-aligned), returned to the
    system the moment the array goes: from the heap, which malloc uses for blocks below a
    threshold it raises up to 32 MiB as blocks are freed, a file's images read in pieces
    of that size stayed resident after they were joined, and joining files held them
    twice. Its pages are taken only as they are written."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= MAPPED_FROM:
        try:
            mapping = mmap.mmap(-1, nbytes)
        except OSError as error:  # ENOMEM: more than the system would ever give
            raise MemoryError(f"Unable to map {nbytes:,} bytes: {error}") from None
        return np.frombuffer(mapping, np.uint8).view(dtype).reshape(tuple(shape))
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


def concatenate(arrays: list[np.ndarray], told: Callable[[int], None] | None = None) -> np.ndarray:
    """`np.concatenate(arrays)` (of one dtype), into an aligned array. Empties `arrays`,
    dropping each once it is copied: where the list holds the only reference, the join
    holds the data about once (the output's pages are taken as they are written), not
    twice. `told(n)` after each 64 MiB or so copied, `n` the bytes of it (the input's)."""
    out = empty((sum(len(x) for x in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
    at = 0
    arrays.reverse()  # popped from the end: the first array first
    while arrays:
        part = arrays.pop()
        row = part[:1].nbytes
        rows = max(1, (64 << 20) // max(1, row))
        for first in range(0, len(part), rows):
            last = min(first + rows, len(part))
            out[at + first : at + last] = part[first:last]  # no view kept: `part` goes
            if told is not None:
                told((last - first) * row)
        at += len(part)
    return out


def split(x: np.ndarray, at: int) -> tuple[np.ndarray, np.ndarray]:
    """`x[:at]` and `x[at:]`, both shareable, holding `x`'s memory about once.

    Where `x[at:]` does not start on a 64-byte boundary it is copied out, and where `x`
    is a mapping of its own (`empty`), the pages that `x[:at]` does not reach are given
    back to the system as the copy goes, 16 MiB at a time: the tail is then held once, in
    its copy, and not twice (a held-out eval part at an unaligned offset was a fifth of
    the images more, at the default 0.2). `x` itself is spent: its rows past `at` may
    read as zeros afterwards.
    """
    head, tail = x[:at], x[at:]
    if shareable(tail):
        return head, tail
    mapping, start = _mapping(x) if x.flags.c_contiguous else (None, 0)
    # Offsets into the mapping: the first whole page after the head's last byte, and (as
    # the copy goes) the last whole page copied. Nothing else lies in them: `empty` maps
    # each array alone.
    released = -(-(head.ctypes.data + head.nbytes - start) // mmap.PAGESIZE) * mmap.PAGESIZE
    copy = empty(tail.shape, tail.dtype)
    rows = max(1, (16 << 20) // max(1, tail[:1].nbytes))
    for first in range(0, len(tail), rows):
        piece = tail[first : first + rows]
        copy[first : first + rows] = piece
        if mapping is not None:
            copied = (piece.ctypes.data + piece.nbytes - start) // mmap.PAGESIZE * mmap.PAGESIZE
            if copied > released:
                mapping.madvise(mmap.MADV_DONTNEED, released, copied - released)
                released = copied
    return head, copy


def _mapping(x: np.ndarray) -> tuple[mmap.mmap | None, int]:
    """The mapping `x` is a view of (`empty`'s), and the address it starts at."""
    base: object = x
    while isinstance(base, np.ndarray):
        outer, base = base, base.base
    if isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap):
        return base.obj, outer.ctypes.data
    return None, 0


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
