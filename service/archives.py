"""Run files as a streamed .tar.gz whose length is known before the first byte.

The gzip holds the tar in stored (uncompressed) deflate blocks: checkpoints and exported
weights are near-random floats that deflate shrinks by well under a tenth, at a few tens of
MB/s of a core; stored, a download runs at disk and network speed, and its exact length is
sent as Content-Length, so a browser or curl shows progress.
"""

from __future__ import annotations

import io
import os
import struct
import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Archive:
    """A .tar.gz: its exact length in bytes, and the bytes, streamed."""

    size: int
    chunks: Iterator[bytes]


def archive(files: list[tuple[str, Path]], extras: list[tuple[str, bytes]]) -> Archive | None:
    """A .tar.gz stream of `files` (name in the archive, path) and then `extras` (name,
    bytes); None when one of the files is gone.

    The files are opened before streaming starts: the worker's CheckpointManager may
    delete an old checkpoint mid-download, and an open file stays readable.
    """
    opened: list[tuple[str, BinaryIO]] = []
    try:
        for name, path in files:
            opened.append((name, open(path, "rb")))  # noqa: SIM115 - closed by the stream
    except FileNotFoundError:
        for _, handle in opened:
            handle.close()
        return None
    now = time.time()
    members: list[tuple[tarfile.TarInfo, BinaryIO]] = []
    for name, handle in opened:
        stat = os.fstat(handle.fileno())
        members.append((_tar_info(name, stat.st_size, stat.st_mtime), handle))
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
# Deflate "stored" blocks: at most 65,535 bytes each, behind a 5-byte header.
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
