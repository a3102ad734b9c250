"""A job's retained checkpoints, and one of them as a streamed .tar.gz.

The worker's `checkpoints/` is a `tf.train.CheckpointManager` directory: `ckpt-<step>.index`
plus `ckpt-<step>.data-<i>-of-<n>` per checkpoint, and a `checkpoint` state file. Only
complete checkpoints of plain files inside the run directory are listed or served. The
archive holds the checkpoint's files, a `checkpoint` state file naming it (so
`tf.train.latest_checkpoint` finds it after extraction) and the job's spec.json.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from service.runfiles import inside
from trainer.rundir import RunDir

_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-(\d+)-of-(\d+))$")
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Checkpoint:
    step: int
    time: float  # when its index was written
    size_bytes: int
    files: tuple[Path, ...]  # the .index first, then the data shards


def list_checkpoints(run: RunDir) -> list[Checkpoint]:
    """Complete checkpoints in the run's checkpoints/, by step."""
    shards: dict[int, dict[str, Path]] = {}
    expected: dict[int, int] = {}
    try:
        entries = list(os.scandir(run.checkpoints))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        match = _FILE.match(entry.name)
        if match is None or not inside(run.root, Path(entry.path)):
            continue
        step = int(match.group(1))
        shards.setdefault(step, {})[match.group(2)] = Path(entry.path)
        if match.group(4) is not None:
            expected[step] = int(match.group(4))
    checkpoints = []
    for step, files in sorted(shards.items()):
        index = files.pop("index", None)
        # Incomplete while the worker writes it, or while CheckpointManager deletes it.
        if index is None or step not in expected or len(files) != expected[step]:
            continue
        paths = (index, *sorted(files.values()))
        try:
            stats = [path.stat() for path in paths]
        except FileNotFoundError:
            continue
        checkpoints.append(
            Checkpoint(step, stats[0].st_mtime, sum(s.st_size for s in stats), paths)
        )
    return checkpoints


def find_checkpoint(run: RunDir, step: int) -> Checkpoint | None:
    return next((c for c in list_checkpoints(run) if c.step == step), None)


def _state_file(step: int) -> bytes:
    return (
        f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'
    ).encode()


def open_archive(checkpoint: Checkpoint, spec_json: bytes) -> Iterator[bytes] | None:
    """A .tar.gz stream of `checkpoint`, or None when it was deleted meanwhile.

    The files are opened before streaming starts: the worker's CheckpointManager may
    delete an old checkpoint mid-download, and an open file stays readable.
    """
    opened: list[tuple[str, BinaryIO]] = []
    try:
        for path in checkpoint.files:
            opened.append((path.name, open(path, "rb")))  # noqa: SIM115 - closed by the stream
    except FileNotFoundError:
        for _, handle in opened:
            handle.close()
        return None
    extras = [("checkpoint", _state_file(checkpoint.step)), ("spec.json", spec_json)]
    return _stream_tar_gz(opened, extras)


def _stream_tar_gz(
    files: list[tuple[str, BinaryIO]], extras: list[tuple[str, bytes]]
) -> Iterator[bytes]:
    """Write a tar stream through gzip chunk by chunk: memory stays at one chunk."""
    gzip = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
    now = time.time()
    try:
        members: list[tuple[str, BinaryIO, int, float]] = [
            (name, handle, os.fstat(handle.fileno()).st_size, os.fstat(handle.fileno()).st_mtime)
            for name, handle in files
        ]
        members += [(name, io.BytesIO(data), len(data), now) for name, data in extras]
        for name, handle, size, mtime in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = size, int(mtime), 0o644
            yield gzip.compress(info.tobuf(format=tarfile.PAX_FORMAT))
            remaining = size
            while remaining > 0:
                chunk = handle.read(min(_CHUNK, remaining))
                if not chunk:
                    raise OSError(f"{name} shrank while it was being archived")
                remaining -= len(chunk)
                if out := gzip.compress(chunk):
                    yield out
            if pad := -size % tarfile.BLOCKSIZE:
                yield gzip.compress(b"\0" * pad)
        yield gzip.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + gzip.flush()
    finally:
        for _, handle in files:
            handle.close()
