"""Which files a job's data spec names, and whether they lie where the service allows.

No TensorFlow here: the service calls `resolve_files` and `check_under_roots` to reject
a spec before accepting it, with exactly the rules the worker later loads by
(`trainer/data.py`). Only names and the file system are looked at, and each file's
headers (an .npz file's directory of arrays and their .npy headers, an IDX file's header
and size, a TFRecord file's first record header, and the first training and eval record,
`trainer.tfexample`), never the rest of the data, so a check costs a directory listing and
a few small reads of each file: the header readers here are the worker's own. The worker
also walks every TFRecord header of every file before it loads any
(`check_tfrecord_framing`), which the service leaves to it.

Rules (`data.path` may name a file, a folder (its own files, not its subfolders') or a
glob (`**` reaches every depth); file order is sorted by name):

- idx: MNIST-style `*-images-idx3-ubyte[.gz]` files, each with its
  `*-labels-idx1-ubyte[.gz]` beside it (the name with `images-idx3` replaced by
  `labels-idx1`); also named `*-images.idx3-ubyte`, as copies of MNIST unpacked on
  Windows or downloaded from Kaggle are. Pairs whose names start `t10k` or `test` are eval when a train pair is
  present too; otherwise every pair is train and eval is held out by `eval_fraction`.
- npz, tfrecord: files whose names contain `eval` or `test` are eval, the rest train;
  again, only when some train file is present.
- A TFRecord folder reads its files named `.tfrecord`, `.tfrecords` or `.tfrec`
  (optionally `.gz`) alone, as it may hold a README too; the others (hidden ones aside)
  are `DataFiles.skipped`, for the worker's log to name: shards are often named without
  a suffix (`train-00000-of-00008`), and a glob (`data/*`) reads them.
- For a glob, the folders it matched below its fixed part count as the name does, so
  `data/**/*.tfrecord` over `data/train/` and `data/test/` takes `data/test/` as eval.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import math
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from trainer.spec import PATH_CHARS, DataSpec, cut_short, shown_value
from trainer.tfexample import first_record_shape


class DataFilesError(ValueError):
    """The data path is missing, matches nothing, or lacks the files its format needs."""


@dataclass(frozen=True)
class DataFiles:
    """The files of one data spec, train and eval, in the order they are read.

    For idx, `train` and `eval` hold the images files and `pairs` maps each to its labels
    file; for the other formats `pairs` is empty. Synthetic data has no files.
    `skipped`: a TFRecord folder's files that look like shards (`_unread_members`) but are
    not read, as their names lack the suffix.
    """

    train: list[Path]
    eval: list[Path]
    pairs: dict[Path, Path] = field(default_factory=dict)
    skipped: list[Path] = field(default_factory=list)

    def skipped_note(self) -> str | None:
        """What the worker's log says of `skipped` (a count, the first names, and how to
        read them), or None when nothing was skipped."""
        if not self.skipped:
            return None
        names = ", ".join(path.name for path in self.skipped[:5])
        if len(self.skipped) > 5:
            names += f" and {len(self.skipped) - 5} more"
        folder = self.skipped[0].parent
        return (
            f"{len(self.skipped)} file(s) in {folder} not read ({names}): a folder gives only "
            f"files named {_TFRECORD_NAMES}; to read them too, give a glob such as "
            f"'{_shards_glob(folder, self.skipped)}', which reads every file it matches"
        )


_GLOB_CHARS = re.compile(r"[*?[]")
# The separator before `idx3` is kept for the labels name (`train-labels.idx1-ubyte`).
_IDX_IMAGES = re.compile(r"images([-.])idx3-ubyte(\.gz)?$")
_IDX_EVAL = re.compile(r"^(t10k|test)", re.IGNORECASE)
# Names that contain `eval` or `test`, as JOB_SPEC.md says: `mnist_test.npz`,
# `eval-00001.tfrecord`, and `mnisttest.tfrecord` too. Matched only at a word's start,
# `mnisttest` was trained on as it was meant to test; `latest.npz` is eval by the same
# rule, and the job's log names every file it evaluates on.
_NAMED_EVAL = re.compile(r"eval|test", re.IGNORECASE)
# Folder members read as TFRecord; a glob takes every file it matches, since shards are
# often named without a suffix (`train-00000-of-00008`).
_TFRECORD_NAME = re.compile(r"\.(tfrecords?|tfrec)(\.gz)?$", re.IGNORECASE)
_NPZ_NAME = re.compile(r"\.npz$", re.IGNORECASE)
_FITS = {"idx": _IDX_IMAGES.search, "npz": _NPZ_NAME.search, "tfrecord": _TFRECORD_NAME.search}
_TFRECORD_NAMES = "`.tfrecord`, `.tfrecords` or `.tfrec` (optionally `.gz`)"
_WANTED = {
    "idx": "`*-images-idx3-ubyte[.gz]` files with their `*-labels-idx1-ubyte[.gz]` files",
    "npz": "`.npz` files",
    "tfrecord": f"files named {_TFRECORD_NAMES}",
}


def resolve_files(data: DataSpec) -> DataFiles:
    """Finds the train and eval files that `data.path` names, by the rules of `data.format`.

    Raises:
        DataFilesError: the path does not exist, a glob matches no file, or the files
            its format needs are not there (an idx images file without labels, say).
    """
    if data.format == "synthetic":
        return DataFiles(train=[], eval=[])
    assert data.path is not None  # DataSpec requires it for every file format
    candidates = _candidates(data.path, data.format)
    names = _eval_names(data.path)
    if data.format == "idx":
        return _resolve_idx(candidates, lambda f: any(_IDX_EVAL.match(n) for n in names(f)))
    files = _split_by_name(candidates, lambda f: any(_NAMED_EVAL.search(n) for n in names(f)))
    if data.format == "tfrecord" and not is_glob(data.path) and os.path.isdir(data.path):
        # Not for npz (np.savez names every file `.npz`) nor idx (whose folder holds the
        # labels files beside): a TFRecord shard is as often named without a suffix.
        files = DataFiles(files.train, files.eval, skipped=_unread_members(Path(data.path)))
    return files


# What reading a damaged .npz file raises, none of which names the file: its directory's
# damage (BadZipFile, EOFError), a name that is not text (ValueError), a zip version or
# feature zipfile does not read (NotImplementedError), a member's damage found by its CRC
# (BadZipFile) or, compressed, by its inflate (zlib.error), an encrypted member
# (RuntimeError), a member gone since the directory was read (KeyError: the file replaced).
ZIP_READ_ERRORS = (
    OSError, ValueError, EOFError, KeyError, NotImplementedError, RuntimeError,
    zipfile.BadZipFile, zlib.error,
)  # fmt: skip

_NPY_MAGIC = b"\x93NUMPY"

ArrayNames = tuple[str, str]

# An .npz file's eval arrays, the first pair it has a member of: the contract's own names,
# then a validation split's, then a test split's (Keras's `mnist.npz`).
NPZ_EVAL_PAIRS: tuple[ArrayNames, ...] = (
    ("x_eval", "y_eval"),
    ("x_val", "y_val"),
    ("x_test", "y_test"),
)


def npz_array_names(path: Path) -> tuple[ArrayNames, ArrayNames | None]:
    """The names of an .npz file's train arrays (`x`, `y`) and eval arrays (`x_eval`,
    `y_eval`, or None), read from its zip directory alone, as the worker reads them.

    Keras's own `mnist.npz` (and files saved like it) names them `x_train`, `y_train`,
    `x_test`, `y_test`: taken where `x` and `y` are absent. A validation pair (`x_val`,
    `y_val`), as many saved splits have, is eval data too, before a test pair: a file with
    both keeps its test set for the end, as its maker meant, and a file with only `x_val`
    no longer trained with its validation set unread and a held-out part of its train set
    in its place.

    Raises:
        DataFilesError: not a zip archive (np.load would take a lone .npy array, or
            refuse anything else as pickled data: said here instead), unreadable, or
            without the arrays it needs.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(_NPY_MAGIC))
            is_zip = zipfile.is_zipfile(f)  # one open for both looks
            if is_zip:
                f.seek(0)
                with zipfile.ZipFile(f) as archive:
                    names = archive.namelist()
    except ZIP_READ_ERRORS as error:
        raise DataFilesError(f"Expected a readable .npz file. Received: {error} ({path})") from None
    if not is_zip:
        what = (
            "a single .npy array"
            if head == _NPY_MAGIC
            else "a file that is not a zip archive, or one cut short"
        )
        raise DataFilesError(
            f"Expected an .npz file (a zip archive of .npy arrays). Received: {what} ({path})"
        )
    members = {name.removesuffix(".npy") for name in names}
    train: ArrayNames = ("x", "y") if members & {"x", "y"} else ("x_train", "y_train")
    if not set(train) <= members:
        raise DataFilesError(
            "Expected arrays `x` and `y` (or `x_train` and `y_train`) in the .npz file. "
            f"Received: {sorted(members)} ({path})"
        )
    evals: ArrayNames | None = next((pair for pair in NPZ_EVAL_PAIRS if members & set(pair)), None)
    if evals is not None and not set(evals) <= members:
        raise DataFilesError(
            f"Expected both `{evals[0]}` and `{evals[1]}`, or neither. "
            f"Received: {sorted(members)} ({path})"
        )
    return train, evals


Shape = tuple[int, ...]


def shape_problem(
    x_shape: Shape, y_shape: Shape, source: str, names: tuple[str, str] = ("x", "y")
) -> str | None:
    """What is wrong with one source's images and labels, from their shapes alone (None:
    nothing): the worker's first look at the arrays it read (`trainer.data`), and the
    service's at an .npz file's headers (`check_npz_headers`)."""
    x_name, y_name = names
    x_dims = (*x_shape, 1) if len(x_shape) == 3 else x_shape
    if len(x_dims) != 4:
        return f"Expected `{x_name}` of shape (N, H, W) or (N, H, W, C). Received: shape {x_shape} ({source})"
    if 0 in x_dims[1:]:
        # An image with no pixels has nothing to learn from, and TensorFlow's CPU kernels
        # abort the whole process on it (SIGABRT in oneDNN: no result.json, no message).
        return (
            f"Expected `{x_name}` images of at least 1 x 1 pixels and 1 channel. "
            f"Received: shape {x_shape} ({source})"
        )
    if not (len(y_shape) == 1 or (len(y_shape) == 2 and y_shape[1] == 1)):
        return f"Expected `{y_name}` of shape (N,) holding class ids. Received: shape {y_shape} ({source})"
    if x_dims[0] != y_shape[0]:
        return (
            f"Expected `{x_name}` and `{y_name}` to have the same number of examples. "
            f"Received: {x_name} has {x_dims[0]}, {y_name} has {y_shape[0]} ({source})"
        )
    return None


def dtype_problem(
    x_dtype: Any, y_dtype: Any, source: str, names: tuple[str, str] = ("x", "y")
) -> str | None:
    """What is wrong with one source's images and labels from their dtypes alone (None:
    nothing): pixels and labels are numbers (bool, integer or float; what their values must
    be is read from the values). The worker's look at the arrays it read (`trainer.data`),
    and the service's at an .npz file's headers (`check_npz_headers`): string labels
    (`["cat", "dog"]`) failed only in the worker, after the job's wait for its turn."""
    import numpy as np  # see `read_npy_header`

    def numeric(dtype: Any) -> bool:
        return bool(
            np.issubdtype(dtype, np.integer)
            or np.issubdtype(dtype, np.floating)
            or dtype == np.bool_
        )

    x_name, y_name = names
    if not numeric(x_dtype):
        return f"Expected numeric pixels `{x_name}`. Received: dtype {x_dtype} ({source})"
    if not numeric(y_dtype):
        return (
            f"Expected integer class ids in `{y_name}`, numbered from 0 (class names are "
            f"numbered by np.unique(y, return_inverse=True)[1]). Received: dtype {y_dtype} ({source})"
        )
    return None


def check_npz_headers(files: DataFiles) -> Shape | None:
    """Raises `DataFilesError` for what the .npz files' headers alone show the worker
    would refuse: a member whose header claims more than it holds, images and labels of
    other counts or dims, or of other than numbers, files of other image shapes, eval
    images of another shape than the train images. Reads each file's zip directory and its arrays' .npy headers (a few
    hundred bytes each), never the arrays: the service checks a job with it at submit.
    Returns the train images' (H, W, C), or None where no header gave it."""
    shapes: dict[str, list[tuple[Shape, str]]] = {"train": [], "eval": []}
    for part, paths in (("train", files.train), ("eval", files.eval)):
        for path in paths:
            train_names, eval_names = npz_array_names(path)
            read = _npy_headers(path, [*train_names, *(eval_names or ())])
            for names, into in ((train_names, part), (eval_names, "eval")):
                if names is None or not set(names) <= read.keys():
                    continue  # a format numpy alone reads: left to the worker
                x, y = read[names[0]], read[names[1]]
                x_shape = x.shape
                problem = shape_problem(x.shape, y.shape, str(path), names) or dtype_problem(
                    x.dtype, y.dtype, str(path), names
                )
                if problem:
                    raise DataFilesError(problem)
                x_dims = (*x_shape, 1) if len(x_shape) == 3 else x_shape
                shapes[into].append((x_dims[1:], f"{path} ({names[0]})"))
    return _check_image_shapes(shapes)


def _npy_headers(path: Path, names: list[str]) -> dict[str, NpyHeader]:
    """The .npy headers of `names` in `path` (`read_npy_header`); one of a format numpy
    alone reads is left out, for the worker to read as numpy does."""
    headers: dict[str, NpyHeader] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = {name.removesuffix(".npy"): name for name in archive.namelist()}
            for name in names:
                info = archive.getinfo(members[name])
                with archive.open(info.filename) as member:  # its errors name it so
                    header = read_npy_header(cast(BinaryIO, member), info.filename, info.file_size)
                if header is not None:
                    headers[name] = header
    except ZIP_READ_ERRORS as e:
        raise DataFilesError(f"Expected a readable .npz file. Received: {e} ({path})") from None
    return headers


@dataclass(frozen=True)
class NpyHeader:
    shape: Shape
    fortran_order: bool
    dtype: Any  # numpy.dtype: numpy is imported where a header is read


def read_npy_header(member: BinaryIO, name: str, member_size: int) -> NpyHeader | None:
    """An .npy member's header, read from `member` at its start: the worker's reader
    (`trainer.data`) and the service's check alike. None for a format version other than
    1.0 and 2.0 (3.0 is for dtypes of non-Latin-1 field names), which numpy's own reader
    takes.

    Raises:
        ValueError: an unreadable header, or one whose data claims more bytes than the
            member holds after it (`member_size`, from the zip directory): damaged or
            cut short, not a size for the memory check.
    """
    import numpy as np  # the service's and the worker's dependency alike; here only

    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}  # fmt: skip
    reader = readers.get(np.lib.format.read_magic(member))
    if reader is None:
        return None
    shape, fortran_order, dtype = reader(member)
    if not dtype.hasobject and dtype.itemsize:
        claimed, held = math.prod(shape) * dtype.itemsize, member_size - member.tell()
        if claimed > held:  # more after it is numpy's to ignore, as np.load does
            raise ValueError(
                f"the header of {name} says shape {tuple(shape)} of {dtype}, {claimed:,} "
                f"bytes, and the member holds {held:,}: damaged, or written cut short"
            )
    return NpyHeader(tuple(shape), fortran_order, dtype)


def no_records(empty: list[Path]) -> str:
    """What the worker and the service say of training TFRecord files that hold no record."""
    return (
        "Expected at least one record. Received: empty TFRecord files: "
        f"{', '.join(str(path) for path in empty)}"
    )


# A TFRecord record begins with its length (8 bytes, little-endian) and that length's masked
# CRC-32C (4 bytes): the first 12 bytes of a file tell a TFRecord file from a README or
# JSON file a glob matched, or a gzip'd file not named .gz.
TFRECORD_HEADER_BYTES = 12


def tfrecord_compressed(path: Path) -> bool:
    """Whether a TFRecord file is read as gzip'd: named `.gz`, in any case, as the folder
    rule takes it (`_TFRECORD_NAME`)."""
    return path.name.lower().endswith(".gz")


# The most of a first record `check_tfrecord_files` reads: a record holds one image, and
# 16 MiB holds a 2048x2048x4 one. A first record that claims more (its length's checksum
# holds, so it is a record's header) is left to the worker, rather than have the service
# read (a gzip'd file: inflate) and hold what a header says, up to 2^64 bytes.
FIRST_RECORD_CAP = 16 * 2**20


def check_tfrecord_files(files: DataFiles) -> Shape | None:
    """Raises `DataFilesError` for what the TFRecord files' first records show the worker
    would refuse: a file that does not begin with a record's header (its length's
    checksum), or a plain one whose first record runs past its end; every training file
    without a record; a first record (of the first training file that has one, and of
    the first eval file) that is no `tf.train.Example`, or one without `image_raw`
    (bytes) and `label` (int64), or without an image shape its `image_raw` fits
    (`trainer.tfexample`), or eval images of another shape than the train images'.

    Reads each file's first 12 bytes (a gzip'd one's first block), and those two first
    records (at most `FIRST_RECORD_CAP` each). Returns the train images' (H, W, C), or
    None where no first record gave it."""
    empty = []
    shapes: dict[str, list[tuple[Shape, str]]] = {"train": [], "eval": []}
    for part, paths in (("train", files.train), ("eval", files.eval)):
        read = False  # a first record of this part read
        for path in paths:
            has_record, record = _first_record(path, read_data=not read)
            if not has_record:
                empty.append(path)
            if record is None:
                continue  # not read: another file's was, or it is longer than the cap
            read = True
            try:
                shape = first_record_shape(record, path)
            except ValueError as error:
                raise DataFilesError(str(error)) from None
            if shape is not None:
                shapes[part].append((shape, str(path)))
    if files.train and all(path in empty for path in files.train):
        raise DataFilesError(no_records(files.train))
    return _check_image_shapes(shapes)


def _first_record(path: Path, read_data: bool) -> tuple[bool, memoryview | None]:
    """Whether a TFRecord file holds a record, and the data of its first (None: none, or
    not read, as `read_data` is False or it is longer than `FIRST_RECORD_CAP`).

    Raises:
        DataFilesError: the file does not begin with a record's header, its first record
            runs past its end, or a gzip'd one cannot be inflated.
    """
    compressed = tfrecord_compressed(path)
    try:
        with gzip.open(path, "rb") if compressed else path.open("rb") as stream:
            head = stream.read(TFRECORD_HEADER_BYTES)
            if not head:
                return False, None
            length, checksum = head[:8], head[8:]
            if len(head) < TFRECORD_HEADER_BYTES or checksum != _masked_crc32c(length):
                hint = tfrecord_hint(path, compressed)
                raise DataFilesError(
                    "Expected TFRecord files. Received: a file whose first bytes are no "
                    f"record's header, not a TFRecord file or one cut short{hint} ({path})"
                )
            # The data, then its checksum (4 bytes), which is not checked: CRC-32C of
            # megabytes in Python costs seconds, and the worker checks it.
            wanted = int.from_bytes(length, "little") + 4
            if not compressed and wanted > (held := path.stat().st_size - len(head)):
                # TensorFlow allocated what the header says, and a header of 2^40 bytes
                # took the worker down with SIGSEGV; this file cannot hold it.
                raise DataFilesError(record_runs_past(0, 0, wanted - 4, held, path))
            if not read_data or wanted - 4 > FIRST_RECORD_CAP:
                return True, None
            data = stream.read(wanted)
    except (OSError, EOFError, zlib.error) as error:
        if not compressed:
            raise
        raise DataFilesError(f"Expected a readable gzip file. Received: {error} ({path})") from None
    if len(data) < wanted:
        raise DataFilesError(record_runs_past(0, 0, wanted - 4, len(data), path))
    return True, memoryview(data)[:-4]  # not a copy of up to the cap


def record_runs_past(
    index: int, at: int, length: int, held: int, path: Path, compressed: bool = False
) -> str:
    """What the worker and the service say of a record whose header (at byte `at` of the
    file, or of a gzip'd one's inflated stream) claims more than follows it (`held`)."""
    where = "its first record's header"
    if index:
        inflated = " of the inflated stream" if compressed else ""
        where = f"record {index}'s header (at byte {at:,}{inflated})"
    return unreadable_tfrecord(
        f"{where} says {length:,} bytes of data and a 4-byte checksum follow it, and "
        f"{held:,} bytes do",
        path,
    )


# What `check_tfrecord_framing` reads at a time: a gzip'd file's inflated stream is read
# and dropped in pieces of this size, a plain file's headers are read from pieces of it.
FRAMING_CHUNK = 2**20


def check_tfrecord_framing(
    path: Path, chunk: int = FRAMING_CHUNK, reached: Callable[[int], None] | None = None
) -> int:
    """Walks a TFRecord file's record headers before the worker's TensorFlow reads it, and
    returns how many whole records it holds (before any header TensorFlow refuses itself,
    below). Raises `DataFilesError` for a record whose header claims more bytes than the
    file (a gzip'd one: its inflated stream) holds after it, and for a file that ends
    inside a record's 12-byte header. The service does not call it: it reads every byte
    of a gzip'd file.

    TensorFlow's reader of a plain file allocates what a header claims before it reads:
    a header of 2^40 bytes (its length's checksum right) killed the worker with SIGSEGV,
    at any record, and one of 2^63 up was "Can't read a negative number of bytes", said as
    an Example problem. Its gzip reader grows the record as it inflates it: it held what
    the stream had left (2.6 GiB of RSS for a 2 MB file of zeros behind a 2^40 header).
    Both readers take a file that ends inside a header for one that ends before it,
    dropping what follows the last whole record without a word.

    A plain file's headers are read from pieces of it of `chunk` bytes, seeking past
    longer records (their data is TensorFlow's to check against its checksum); a gzip'd
    file is inflated (zlib, in C) and dropped as it is walked, so the walk holds one piece,
    whatever a header claims. Measured against the worker's read of the same file
    (`_read_tfrecord`, 60,000 MNIST records, on a 2-core host): plain, 21 ms of 265; gzip,
    130 ms of 520 (the inflation, once more). A claim that runs into a bomb of zeros costs
    the walk its inflation, about 2.5 s a GiB, never memory.

    A header whose length's checksum does not hold claims nothing: the walk stops there,
    and TensorFlow, which checks it before it reads on, says "corrupted record" of it. A
    gzip stream Python cannot inflate is refused, as the service refuses a first block.

    `reached`, where given, is told how far into the file the walk is after each piece it
    reads, in the file's bytes on disk (a gzip'd file's: where its inflation has read the
    compressed file to): a walk of gigabytes takes seconds, which a preparation's
    `checking data` lines say as they go."""
    compressed = tfrecord_compressed(path)
    try:
        with path.open("rb") as file:
            said = _nothing if reached is None else _telling(reached, file)
            if not compressed:
                return _walk_records(file, os.fstat(file.fileno()).st_size, path, chunk, said)
            with gzip.GzipFile(fileobj=file) as stream:
                return _walk_records(cast(BinaryIO, stream), None, path, chunk, said)
    except (OSError, EOFError, zlib.error) as error:  # zlib.error: damaged data
        if not compressed:
            raise
        raise DataFilesError(f"Expected a readable gzip file. Received: {error} ({path})") from None


def _nothing() -> None:
    pass


def _telling(reached: Callable[[int], None], file: BinaryIO) -> Callable[[], None]:
    """Tells `reached` where `file` is read to, when called."""

    def said() -> None:
        reached(file.tell())

    return said


def _walk_records(
    stream: BinaryIO, size: int | None, path: Path, chunk: int, said: Callable[[], None]
) -> int:
    """`check_tfrecord_framing` of `stream` at its start: `size` is a plain file's bytes,
    None for a gzip'd file's inflated stream, whose end is found by reading to it. `said`
    is called after each piece read."""
    index = 0  # the next record's
    at = 0  # where its header begins
    buffer, start = b"", 0  # bytes of the stream in hand, and where they begin
    last: tuple[int, bytes] | None = None  # the header before `at`: where, and its bytes
    while True:
        if at + TFRECORD_HEADER_BYTES > start + len(buffer):
            # The next header is not whole in hand: read on from it (and its part in hand).
            if at < start + len(buffer):
                kept = buffer[at - start :]
            else:
                kept = b""
                if size is None:
                    skipped = _discard(stream, at - start - len(buffer), chunk, said)
                    if (end := start + len(buffer) + skipped) < at:
                        assert last is not None  # the stream's start is never past its end
                        _refuse_past(index - 1, *last, end, path, compressed=True)
                        return index - 1  # its length's checksum fails: TensorFlow's
                else:
                    stream.seek(at)
            buffer, start = kept, at
            while len(buffer) < TFRECORD_HEADER_BYTES and (piece := stream.read(chunk)):
                buffer += piece
                said()
        head = buffer[at - start : at - start + TFRECORD_HEADER_BYTES]
        if not head:
            return index  # the stream ends where a record does
        if len(head) < TFRECORD_HEADER_BYTES:
            if last is not None and last[1][8:] != _masked_crc32c(last[1][:8]):
                # The walk came here by a length no checksum vouched for (a damaged header
                # that claimed less than the file holds, or one past it): TensorFlow's.
                return index - 1
            raise DataFilesError(
                unreadable_tfrecord(
                    f"{index} whole records end at byte {at:,} of {at + len(head):,}"
                    f"{'' if size is not None else ' inflated'}, then {len(head)} bytes "
                    "that are no whole record",
                    path,
                )
            )
        length = int.from_bytes(head[:8], "little")
        following = at + TFRECORD_HEADER_BYTES + length + 4  # the data, its checksum
        if size is not None and following > size:
            _refuse_past(index, at, head, size, path, compressed=False)
            return index  # its length's checksum fails: TensorFlow's
        last, at, index = (at, head), following, index + 1


def _refuse_past(index: int, at: int, head: bytes, end: int, path: Path, compressed: bool) -> None:
    """Raises for record `index`, whose header `head` at `at` claims more than the stream
    holds up to `end`, unless its length's checksum does not hold: no record's header, which
    TensorFlow refuses before it reads on ("corrupted record at N")."""
    if head[8:] != _masked_crc32c(head[:8]):
        return
    length = int.from_bytes(head[:8], "little")
    held = end - at - TFRECORD_HEADER_BYTES
    raise DataFilesError(record_runs_past(index, at, length, held, path, compressed))


def _discard(stream: BinaryIO, count: int, chunk: int, said: Callable[[], None]) -> int:
    """Reads and drops up to `count` bytes of `stream`; returns how many there were.
    `said` is called after each piece."""
    done = 0
    while done < count and (piece := stream.read(min(count - done, chunk))):
        done += len(piece)
        said()
    return done


def unreadable_tfrecord(reason: str, path: Path) -> str:
    """What the worker and the service say of a TFRecord file they cannot read."""
    return (
        "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord "
        f"file: {reason} ({path})"
    )


def tfrecord_hint(path: Path, compressed: bool) -> str:
    """What a file's own first bytes say it is, where TFRecord's reader cannot read it: the
    worker's message and the service's alike."""
    with path.open("rb") as file:
        head = file.read(4)
    # The compression is told by the name, not these bytes: a record's length can begin
    # with them too, so they only explain a file that failed to read.
    if head[:2] == _GZIP_MAGIC and not compressed:
        return "; it begins as a gzip file does: name gzip-compressed TFRecord files *.gz"
    if head == b"PK\x03\x04":
        return "; it begins as a zip (or .npz) file does: is `format` right?"
    return ""


def _masked_crc32c(data: bytes) -> bytes:
    """TFRecord's masked CRC-32C (Castagnoli) of `data`, as its 4 little-endian bytes.
    Bit by bit, for the 8 bytes of a length: no table or library is worth it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return masked.to_bytes(4, "little")


# An IDX file's element types: their codes (its magic's third byte) and item sizes.
IDX_ITEM_SIZES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}
_GZIP_MAGIC = b"\x1f\x8b"
# DEFLATE packs at most 1032 bytes into one: a gzip'd header that claims more is damaged.
DEFLATE_MAX_RATIO = 1032


def read_idx_header(stream: BinaryIO, path: Path) -> tuple[int, Shape]:
    """An IDX file's element type code and dims, read from `stream` at its start: the
    worker's reader (`trainer.data.read_idx`) and the service's check alike."""
    magic = stream.read(4)
    if len(magic) < 4 or magic[:2] != b"\x00\x00" or magic[2] not in IDX_ITEM_SIZES:
        raise DataFilesError(
            "Expected an IDX file starting 0x00 0x00 <type 0x08-0x0E> <dims>. "
            f"Received: {magic.hex(' ') or 'an empty file'} ({path})"
        )
    ndim = magic[3]
    sizes = stream.read(4 * ndim)
    if len(sizes) < 4 * ndim:
        raise DataFilesError(
            f"Expected {ndim} dimension sizes after the magic. Received: a truncated header ({path})"
        )
    return magic[2], struct.unpack(f">{ndim}I", sizes)


@contextlib.contextmanager
def open_idx(path: Path) -> Iterator[tuple[BinaryIO, int | None, int | None]]:
    """An IDX file, plain or gzip'd (told by its first bytes), open at its start: (stream,
    size, at_most) for `idx_size_problem`, `size` its bytes (a plain file's), `at_most` a
    bound on them (a gzip file's). A damaged gzip stream, found in the block or later,
    raises `DataFilesError`: the worker's reader and the service's check alike."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        compressed = file.read(2) == _GZIP_MAGIC
        file.seek(0)
        if not compressed:
            yield file, size, None
            return
        try:
            with gzip.GzipFile(fileobj=file) as stream:
                # A header that claims more than DEFLATE could have packed is damaged, not
                # too large for this host's memory.
                yield cast(BinaryIO, stream), None, size * DEFLATE_MAX_RATIO
        except (OSError, EOFError, zlib.error) as error:  # zlib.error: damaged data
            raise DataFilesError(
                f"Expected a readable gzip file. Received: {error} ({path})"
            ) from None


def idx_size_problem(
    dims: Shape, code: int, path: Path, size: int | None, at_most: int | None
) -> str | None:
    """What an IDX file's size says of its header (None: nothing): `size`, its data's
    bytes where known (a plain file's), else `at_most`, a bound on them (a gzip file's)."""
    expected = math.prod(dims) * IDX_ITEM_SIZES[code]
    if size is not None and size != expected:
        return f"Expected {expected} bytes of data for dims {dims}. Received: {size} bytes ({path})"
    if at_most is not None and expected > at_most:
        return (
            f"Expected {expected:,} bytes of data for dims {dims}. Received: a gzip file "
            f"that holds at most {at_most:,} (the header is damaged, or the file cut "
            f"short) ({path})"
        )
    return None


def idx_pair_problem(
    images_dims: Shape, labels_dims: Shape, images: Path, labels: Path
) -> str | None:
    """What is wrong with an IDX images file and its labels file, from their dims alone
    (None: nothing): the worker's check of the arrays it read, and the service's of the
    headers."""
    if len(images_dims) not in (3, 4):
        return (
            "Expected an images file of dims (N, H, W) or (N, H, W, C). "
            f"Received: dims {images_dims} ({images})"
        )
    if len(labels_dims) != 1:
        return f"Expected a labels file of dims (N,). Received: dims {labels_dims} ({labels})"
    return shape_problem(images_dims, labels_dims, f"{images}, {labels}", ("images", "labels"))


def check_idx_headers(files: DataFiles) -> Shape | None:
    """Raises `DataFilesError` for what the IDX files' headers and sizes alone show the
    worker would refuse: a header that is no IDX header, or one its file's size belies,
    images and labels of other counts or dims, files or eval images of other image
    shapes. Reads each file's first bytes (a gzip'd one's first block), never its data.
    Returns the train images' (H, W, C)."""
    shapes: dict[str, list[tuple[Shape, str]]] = {"train": [], "eval": []}
    for part, images_files in (("train", files.train), ("eval", files.eval)):
        for images in images_files:
            labels = files.pairs[images]
            dims = {path: _idx_dims(path) for path in (images, labels)}
            if problem := idx_pair_problem(dims[images], dims[labels], images, labels):
                raise DataFilesError(problem)
            x_dims = (*dims[images], 1) if len(dims[images]) == 3 else dims[images]
            shapes[part].append((x_dims[1:], str(images)))
    return _check_image_shapes(shapes)


def _idx_dims(path: Path) -> Shape:
    with open_idx(path) as (stream, size, at_most):
        code, dims = read_idx_header(stream, path)
        header = 4 + 4 * len(dims)
        problem = idx_size_problem(
            dims, code, path, None if size is None else size - header, at_most
        )
    if problem:
        raise DataFilesError(problem)
    return dims


def _check_image_shapes(shapes: dict[str, list[tuple[Shape, str]]]) -> Shape | None:
    """Every file's images of one shape, and the eval images of the train images'; the
    train images' shape (None: no header gave one)."""
    for found in shapes.values():
        if len({shape for shape, _ in found}) > 1:
            received = ", ".join(f"{shape} in {source}" for shape, source in found)
            raise DataFilesError(
                f"Expected every file to hold images of one shape. Received: {received}"
            )
    if shapes["train"] and shapes["eval"] and shapes["train"][0][0] != shapes["eval"][0][0]:
        raise DataFilesError(
            f"Expected eval images of the train image shape {shapes['train'][0][0]}. "
            f"Received: {shapes['eval'][0][0]} ({shapes['eval'][0][1]})"
        )
    return shapes["train"][0][0] if shapes["train"] else None


# The data roots of the service that started a worker, as JSON (`roots_to_environ`): the worker
# checks a job's data against them again as it starts (`roots_from_environ`).
ROOTS_ENV = "TOWERBOARD_WORKER_DATA_ROOTS"


def roots_to_environ(roots: list[Path]) -> str:
    """`ROOTS_ENV`'s value for `roots`: JSON, as a root may hold any character a path may
    (`TOWERBOARD_DATA_ROOTS` is comma-separated, so a `:` in one is the user's to use)."""
    return json.dumps([str(root) for root in roots])


def roots_from_environ(environ: Mapping[str, str]) -> list[Path] | None:
    """The data roots a worker's service allows, or None (a job run by hand: its data is
    its own)."""
    value = environ.get(ROOTS_ENV)
    if value is None:
        return None
    try:
        roots = json.loads(value)
    except json.JSONDecodeError:
        roots = None
    if not (isinstance(roots, list) and all(isinstance(root, str) for root in roots)):
        raise ValueError(
            f"Expected {ROOTS_ENV} to be a JSON list of folders, as the service sets it. "
            f"Received: {value!r}"
        )
    return [Path(root) for root in roots]


def check_under_roots(path: str, roots: list[Path]) -> None:
    """Raises `DataFilesError` unless `path` and what it reaches lie inside one of `roots`.

    Paths are compared after `os.path.realpath`, so `..` and symlinks cannot lead out.
    Checked: the path itself; for a folder, every file in it (a symlinked member could
    point anywhere); for an idx images file, its labels file; for a glob, its non-glob
    prefix and every match (with the labels file of each idx images match). A path that does not exist yet is checked lexically.
    """
    real_roots = [Path(os.path.realpath(root)) for root in roots]

    def check(target: str, what: str = "") -> None:
        real = Path(os.path.realpath(target))
        if not any(real.is_relative_to(root) for root in real_roots):
            allowed = ", ".join(str(root) for root in real_roots) or "(none configured)"
            via = f"whose {what} {target}" if what else "which"
            raise DataFilesError(
                f"Expected `path` inside one of the data roots: {allowed}. "
                f"Received: {shown_value(path, PATH_CHARS)}, {via} resolves to {cut_short(str(real), PATH_CHARS)}"
            )

    def check_labels(images: str) -> None:
        # An idx images file brings its labels file from beside it, which may be a link.
        if _IDX_IMAGES.search(os.path.basename(images)):
            for labels in _labels_candidates(Path(images)):
                if labels.exists():
                    check(str(labels), "labels file")

    if is_glob(path):
        check(_glob_prefix(path), "folder")
        for match in sorted(glob.glob(path, recursive=True)):
            check(match, "match")
            check_labels(match)
        return
    check(path)
    if os.path.isdir(path):
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_file():  # follows symlinks, so a link to a file counts
                    check(entry.path, "file")
    else:
        check_labels(path)


# --- helpers -------------------------------------------------------------------------


def is_glob(path: str) -> bool:
    """Whether `path` is read as a glob."""
    # A name that exists is taken literally, even if it holds `[` or `*`.
    return bool(_GLOB_CHARS.search(path)) and not os.path.exists(path)


def _glob_prefix(path: str) -> str:
    """The leading folders of a glob before its first glob character (`.` if none)."""
    parts = Path(path).parts
    fixed = []
    for part in parts:
        if _GLOB_CHARS.search(part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."


def _eval_names(path: str) -> Callable[[Path], tuple[str, ...]]:
    """The names the eval rule reads for each file `path` gives: its own, and for a glob
    the folders the glob matched too."""
    if not is_glob(path):
        return lambda file: (file.name,)
    # Only below the fixed part: the user's own `/data/test-runs/**/*.npz` names no eval.
    # Read by name alone, `data/**/*.tfrecord` trained on `data/test/` (and held out the
    # last of `data/train/` instead), a test set trained on without a word.
    fixed = len(Path(_glob_prefix(path)).parts)  # glob.glob's matches begin with that part
    return lambda file: file.parts[fixed:]


def _candidates(path: str, fmt: str) -> list[Path]:
    """The files `path` names, sorted by name.

    A folder gives its members whose names fit the format; a glob gives every file it
    matches (idx and npz keep only fitting names, as a glob like `data/*` also matches
    labels files and READMEs); a file gives itself.
    """
    fits, wanted = _FITS[fmt], _WANTED[fmt]
    if is_glob(path):
        matches = [
            Path(match)
            for match in sorted(glob.glob(path, recursive=True))
            if os.path.isfile(match)
        ]
        if fmt != "tfrecord":
            matches = [match for match in matches if fits(match.name)]
        if not matches:
            # A TFRecord glob reads every file it matches, whatever its name.
            wanted = "a file" if fmt == "tfrecord" else wanted
            raise DataFilesError(
                f"Expected the glob `path` to match {wanted}. Received: {shown_value(path, PATH_CHARS)} matches no such file"
            )
        return matches
    target = Path(path)
    if target.is_dir():
        members = sorted(entry for entry in target.iterdir() if entry.is_file())
        matches = [member for member in members if fits(member.name)]
        if not matches:
            found = ", ".join(member.name for member in members[:10]) or "nothing"
            more = f" and {len(members) - 10} more" if len(members) > 10 else ""
            hints = []
            if fmt == "tfrecord" and (shards := _unread_members(target)):
                # Shards named `train-00000-of-00002` are TFRecord files too: a folder
                # reads only files named as such, a glob every file it matches.
                hints.append(
                    f"a folder gives only files named {_TFRECORD_NAMES}: a glob such as "
                    f"'{_shards_glob(target, shards)}' reads every file it matches"
                )
            # Only the folder's own files are read: say so when the data sits deeper.
            if any(entry.is_dir() for entry in target.iterdir()):
                hints.append(
                    f"folders inside it are not searched: a glob such as '{target}/**/*' is"
                )
            hint = f" ({'; '.join(hints)})" if hints else ""
            raise DataFilesError(
                f"Expected a folder holding {wanted}. Received: {found}{more} in {target}{hint}"
            )
        return matches
    if target.is_file():
        if fmt == "idx" and not fits(target.name):
            raise DataFilesError(
                "Expected an idx `path` to name a folder or a `*-images-idx3-ubyte[.gz]` file. "
                f"Received: {target}"
            )
        return [target]
    if target.exists():
        what = "is not a regular file or a folder"
    elif target.is_symlink():  # exists() follows it, and says False for a loop too
        what = "is a link that leads to nothing that exists (a loop, or a missing target)"
    else:
        what = "does not exist"
        if path.startswith("~"):  # the service's message says so of a spec's own path
            what += "; a `~` is not expanded: give the path in full"
    raise DataFilesError(
        f"Expected `path` to name an existing file, folder or glob. Received: {shown_value(path, PATH_CHARS)}, "
        f"which {what}"
    )


# A TFRecord shard as writers name one without the suffix: `train-00000-of-00008`, TFDS's
# `mnist-train.tfrecord-00000-of-00001`, or a name with no extension at all. A README.md
# or dataset_info.json beside them is no shard, and reading it as one fails the job.
_SHARD_LIKE = re.compile(r"-\d+-of-\d+(\.gz)?$|^[^.]+$")


def _unread_members(folder: Path) -> list[Path]:
    """A TFRecord folder's files that look like shards but that its name rule leaves out,
    sorted by name (hidden ones aside: `folder/*` does not match them either)."""
    return sorted(
        entry
        for entry in folder.iterdir()
        if entry.is_file()
        and not entry.name.startswith(".")
        and not _TFRECORD_NAME.search(entry.name)
        and _SHARD_LIKE.search(entry.name)
    )


def _shards_glob(folder: Path, shards: list[Path]) -> str:
    """A glob that reads `shards` (from `_unread_members`): every file of the folder
    (`*`) where it holds nothing else but TFRecord files, else `*-of-*` where every shard
    is named so, keeping a README beside them out."""
    others = any(
        entry.is_file()
        and not entry.name.startswith(".")
        and not _TFRECORD_NAME.search(entry.name)
        and not _SHARD_LIKE.search(entry.name)
        for entry in folder.iterdir()
    )
    if others and all("-of-" in shard.name for shard in shards):
        return f"{folder}/*-of-*"
    return f"{folder}/*"


def _labels_candidates(images: Path) -> list[Path]:
    """Where the labels of an idx images file may be: same compression first, then the other."""
    stem = _IDX_IMAGES.sub(r"labels\g<1>idx1-ubyte", images.name)
    first, second = (".gz", "") if images.name.endswith(".gz") else ("", ".gz")
    return [images.with_name(stem + first), images.with_name(stem + second)]


def _resolve_idx(images_files: list[Path], is_eval: Callable[[Path], bool]) -> DataFiles:
    # A folder unpacked beside its archives holds `x-ubyte` and `x-ubyte.gz`: read the
    # plain one (no decompression) and skip its twin, so no example is counted twice.
    # Twins lie in one folder: same-named files in other folders (`**` over `part1/` and
    # `part2/`) are other examples, and keying by name alone dropped all but one.
    by_stem: dict[Path, Path] = {}
    for images in images_files:
        stem = images.with_name(images.name.removesuffix(".gz"))
        if stem not in by_stem or not images.name.endswith(".gz"):
            by_stem[stem] = images
    pairs: dict[Path, Path] = {}
    for images in sorted(by_stem.values()):
        labels = next((c for c in _labels_candidates(images) if c.is_file()), None)
        if labels is None:
            wanted = _labels_candidates(images)[0].name.removesuffix(".gz")
            raise DataFilesError(
                f"Expected the labels file {wanted}[.gz] beside the images file. "
                f"Received: no such file in {images.parent} (for {images.name})"
            )
        pairs[images] = labels
    files = _split_by_name(list(pairs), is_eval)
    return DataFiles(train=files.train, eval=files.eval, pairs=pairs)


def _split_by_name(files: list[Path], is_eval: Callable[[Path], bool]) -> DataFiles:
    """Eval-named files are eval only beside a train file; a lone eval set trains."""
    eval_files = [f for f in files if is_eval(f)]
    train_files = [f for f in files if not is_eval(f)]
    if not train_files:
        return DataFiles(train=eval_files, eval=[])
    return DataFiles(train=train_files, eval=eval_files)
