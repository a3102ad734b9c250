"""A job's retained checkpoints, and one of them as a streamed .tar.gz.

The worker's `checkpoints/` is a `tf.train.CheckpointManager` directory: `ckpt-<step>.index`
plus `ckpt-<step>.data-<i>-of-<n>` per checkpoint, and a `checkpoint` state file. Only
complete checkpoints of plain files inside the run directory are listed or served. The
archive holds the checkpoint's files, a `checkpoint` state file naming it (so
`tf.train.latest_checkpoint` finds it after extraction) and the job's spec.json. It is
gzip without compression (stored blocks), so its length is known before it is sent.
"""

from __future__ import annotations

import io
import os
import re
import struct
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


@dataclass(frozen=True)
class Archive:
    """A checkpoint as a .tar.gz: its exact length in bytes, and the bytes, streamed."""

    size: int
    chunks: Iterator[bytes]


def open_archive(checkpoint: Checkpoint, spec_json: bytes) -> Archive | None:
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
    now = time.time()
    members: list[tuple[tarfile.TarInfo, BinaryIO]] = []
    for name, handle in opened:
        stat = os.fstat(handle.fileno())
        members.append((_tar_info(name, stat.st_size, stat.st_mtime), handle))
    extras = [("checkpoint", _state_file(checkpoint.step)), ("spec.json", spec_json)]
    members += [(_tar_info(name, len(data), now), io.BytesIO(data)) for name, data in extras]
    tar_size = sum(
        len(info.tobuf(format=tarfile.PAX_FORMAT)) + _padded(info.size) for info, _ in members
    )
    tar_size += _TAR_END
    return Archive(_gzip_stored_size(tar_size), _stream_tar_gz(members))


def _tar_info(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    return info


def _padded(size: int) -> int:
    return size + (-size % tarfile.BLOCKSIZE)


_TAR_END = 2 * tarfile.BLOCKSIZE  # two zero blocks end a tar archive
# Deflate "stored" blocks: at most 65,535 bytes each, behind a 5-byte header. Weights are
# near-random floats that deflate shrinks by well under a tenth, at a few tens of MB/s of
# a core; stored, a download runs at disk and network speed, and its length is known in
# advance, so it can be sent as Content-Length and a browser or curl shows progress.
_STORED_BLOCK = 65_535
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no mtime, no name; OS unknown


def _gzip_stored_size(data_size: int) -> int:
    blocks = max(1, -(-data_size // _STORED_BLOCK))
    return len(_GZIP_HEADER) + 5 * blocks + data_size + 8  # trailer: CRC-32 and length


def _stored_block(data: bytes | bytearray, *, final: bool) -> bytes:
    length = len(data)
    return struct.pack("<BHH", int(final), length, length ^ 0xFFFF) + data


def _stream_tar_gz(members: list[tuple[tarfile.TarInfo, BinaryIO]]) -> Iterator[bytes]:
    """The tar stream inside a gzip of stored blocks, about a chunk at a time (memory stays
    at one chunk). Whole blocks only until the last, so the length is exactly
    `_gzip_stored_size` of the tar's."""
    crc, size, pending = 0, 0, bytearray()

    def add(data: bytes) -> bytes:
        """Take `data`; return the whole stored blocks due once a chunk has gathered."""
        nonlocal crc, size
        crc, size = zlib.crc32(data, crc), size + len(data)
        pending.extend(data)
        if len(pending) < _CHUNK:
            return b""
        # Whole blocks, and never all of it: the last block, marked final, comes at the end.
        whole = (len(pending) - 1) // _STORED_BLOCK * _STORED_BLOCK
        out = b"".join(
            _stored_block(pending[i : i + _STORED_BLOCK], final=False)
            for i in range(0, whole, _STORED_BLOCK)
        )
        del pending[:whole]
        return out

    def tar() -> Iterator[bytes]:
        for info, handle in members:
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            remaining = info.size
            while remaining > 0:
                chunk = handle.read(min(_CHUNK, remaining))
                if not chunk:  # the length sent ahead would be a lie: end the stream short
                    raise OSError(f"{info.name} shrank while it was being archived")
                remaining -= len(chunk)
                yield chunk
            if pad := -info.size % tarfile.BLOCKSIZE:
                yield b"\0" * pad
        yield b"\0" * _TAR_END

    try:
        yield _GZIP_HEADER
        for data in tar():
            if out := add(data):
                yield out
        # What is left: 1 to 65,535 bytes per block, the last one final.
        tail = [pending[i : i + _STORED_BLOCK] for i in range(0, len(pending), _STORED_BLOCK)]
        yield b"".join(_stored_block(b, final=i == len(tail) - 1) for i, b in enumerate(tail))
        yield struct.pack("<II", crc, size & 0xFFFFFFFF)
    finally:
        for _, handle in members:
            handle.close()
