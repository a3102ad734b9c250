"""Run files as a streamed .tar.gz whose length is known before the first byte.

The gzip holds the tar in stored (uncompressed) deflate blocks: checkpoints and exported
weights are near-random floats that deflate shrinks by well under a tenth, at a few tens of
MB/s of a core; stored, a download runs at disk and network speed, and its exact length is
sent as Content-Length, so a browser or curl shows progress.

The bytes are a function of the files alone (names, sizes, mtimes, contents; no "now", no
owner, no gzip name or time), so the same files give the same archive on every request and
after a restart. That is what lets a download resume: `Archive.stream(start, stop)` sends
any byte range of it, and the ETag, made from what the bytes depend on, tells a client
whether the bytes it already has still belong to the archive being served.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

_CHUNK = 256 * 1024
# Part of every ETag: change it whenever the layout of the bytes changes, so no client
# appends bytes of the new layout to a part of the old.
_LAYOUT = "towerboard-tar-gz-stored-1"


@dataclass(frozen=True)
class ArchiveHead:
    """What a HEAD tells of an archive: its exact length, and its strong ETag."""

    size: int
    etag: str


@dataclass(frozen=True)
class Archive(ArchiveHead):
    """An archive whose files are open, ready to stream."""

    _members: list[tuple[tarfile.TarInfo, BinaryIO]] = field(repr=False)
    _tar_size: int = field(repr=False)

    def stream(self, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        """Bytes `start` to `stop` (exclusive; default the end) of the archive, about a
        chunk at a time. Closes the files when done, or when closed early."""
        stop = self.size if stop is None else min(stop, self.size)
        return _stream_tar_gz(self._members, self._tar_size, start, stop)

    def close(self) -> None:
        """Close the files: without streaming them (a 416, say), or after an answer that
        may have ended before its stream did (its client went away)."""
        for _, handle in self._members:
            handle.close()


def archive(files: list[tuple[str, Path]], extras: list[tuple[str, bytes]]) -> Archive | None:
    """A .tar.gz of `files` (name in the archive, path) and then `extras` (name, bytes),
    ready to stream; None when one of the files is gone.

    The files are opened now, before streaming starts: the worker's CheckpointManager may
    delete an old checkpoint mid-download, and an open file stays readable. Size and ETag
    come from the open files, so they describe exactly what is streamed.
    """
    opened: list[tuple[str, BinaryIO]] = []
    try:
        for name, path in files:
            opened.append((name, open(path, "rb")))  # noqa: SIM115 - closed by the stream
    except BaseException as e:
        # Any failure (a file unreadable to the service, too many open files) closes those
        # already open, rather than leaving them to the garbage collector.
        for _, handle in opened:
            handle.close()
        if isinstance(e, FileNotFoundError):
            return None
        raise
    stats = [(name, os.fstat(handle.fileno())) for name, handle in opened]
    infos, tar_size, head = _layout(stats, extras)
    handles = [handle for _, handle in opened] + [io.BytesIO(data) for _, data in extras]
    return Archive(head.size, head.etag, list(zip(infos, handles, strict=True)), tar_size)


def describe(files: list[tuple[str, Path]], extras: list[tuple[str, bytes]]) -> ArchiveHead | None:
    """The size and ETag `archive` would give for the same arguments, from the files'
    stat alone (for HEAD: no file is opened); None when one of the files is gone."""
    try:
        stats = [(name, path.stat()) for name, path in files]
    except FileNotFoundError:
        return None
    return _layout(stats, extras)[2]


def _layout(
    stats: list[tuple[str, os.stat_result]], extras: list[tuple[str, bytes]]
) -> tuple[list[tarfile.TarInfo], int, ArchiveHead]:
    """The tar headers, the tar's length, and the archive's size and ETag."""
    # The extras are made by the service (spec.json, a checkpoint state file): they take
    # the newest file's time, so the archive holds no "now".
    extras_mtime = max((_seconds(stat) for _, stat in stats), default=0)
    infos = [_tar_info(name, stat.st_size, _seconds(stat)) for name, stat in stats]
    infos += [_tar_info(name, len(data), extras_mtime) for name, data in extras]
    tar_size = _TAR_END + sum(
        len(info.tobuf(format=tarfile.PAX_FORMAT)) + _padded(info.size) for info in infos
    )
    # Everything the bytes depend on: each file's name, size and mtime (nanoseconds: a
    # rewrite within the same second still shows; the inode too, as a file replaced by
    # another of the same size and time would not), and each extra's name and content.
    identity = hashlib.sha256(_LAYOUT.encode())
    for name, stat in stats:
        identity.update(f"\0f{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}".encode())
    for name, data in extras:
        identity.update(f"\0x{name}\0{hashlib.sha256(data).hexdigest()}".encode())
    etag = f'"{identity.hexdigest()[:32]}"'
    return infos, tar_size, ArchiveHead(_gzip_stored_size(tar_size), etag)


def _seconds(stat: os.stat_result) -> int:
    return stat.st_mtime_ns // 1_000_000_000


def _tar_info(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    # TarInfo's own defaults for the rest: uid and gid 0, no user or group name.
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    return info


def _padded(size: int) -> int:
    return size + (-size % tarfile.BLOCKSIZE)


_TAR_END = 2 * tarfile.BLOCKSIZE  # two zero blocks end a tar archive
# Deflate "stored" blocks: at most 65,535 bytes each, behind a 5-byte header.
_STORED_BLOCK = 65_535
_FRAMED_BLOCK = _STORED_BLOCK + 5
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no mtime, no name; OS unknown
_GZIP_TRAILER = 8  # CRC-32 and length of the tar


def _gzip_stored_size(data_size: int) -> int:
    blocks = max(1, -(-data_size // _STORED_BLOCK))
    return len(_GZIP_HEADER) + 5 * blocks + data_size + _GZIP_TRAILER


def _stored_block(data: bytes | bytearray | memoryview, *, final: bool) -> bytes:
    length = len(data)
    return struct.pack("<BHH", int(final), length, length ^ 0xFFFF) + data


def _stream_tar_gz(
    members: list[tuple[tarfile.TarInfo, BinaryIO]], tar_size: int, start: int, stop: int
) -> Iterator[bytes]:
    """Bytes [start, stop) of the tar stream inside a gzip of stored blocks, about a chunk
    at a time (memory stays at one chunk).

    Every stored block is full (65,535 bytes) but the last, so where each block lies is
    arithmetic: the blocks before the one holding `start` are neither framed nor sent. The
    tar bytes in them are still read for the trailer's CRC-32, which covers the whole tar;
    when the range ends before the trailer, they are skipped by seeking instead.
    """
    blocks = max(1, -(-tar_size // _STORED_BLOCK))
    first_block = min(max(0, (start - len(_GZIP_HEADER)) // _FRAMED_BLOCK), blocks - 1)
    skip = first_block * _STORED_BLOCK  # tar bytes before the first block framed
    need_crc = stop > _gzip_stored_size(tar_size) - _GZIP_TRAILER
    crc, tar_pos, out_pos, pending = 0, 0, 0, bytearray()

    def window(data: bytes) -> bytes:
        """The part of `data`, which lies at `out_pos` of the archive, in [start, stop)."""
        nonlocal out_pos
        begin, out_pos = out_pos, out_pos + len(data)
        if out_pos <= start or begin >= stop:
            return b""
        return data[max(0, start - begin) : stop - begin]

    def take(data: bytes) -> None:
        """Count `data`, the tar's next bytes, into the CRC, and keep what is to be framed."""
        nonlocal crc, tar_pos
        if need_crc:
            crc = zlib.crc32(data, crc)
        if tar_pos >= skip:
            pending.extend(data)
        elif tar_pos + len(data) > skip:
            pending.extend(memoryview(data)[skip - tar_pos :])
        tar_pos += len(data)

    def whole_blocks() -> bytes:
        """The whole stored blocks in `pending`, and never all of it: the last block,
        marked final, comes at the end."""
        whole = (len(pending) - 1) // _STORED_BLOCK * _STORED_BLOCK
        view = memoryview(pending)
        out = b"".join(
            _stored_block(view[i : i + _STORED_BLOCK], final=False)
            for i in range(0, whole, _STORED_BLOCK)
        )
        view.release()
        del pending[:whole]
        return out

    def tar() -> Iterator[bytes]:
        nonlocal tar_pos
        for info, handle in members:
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            remaining = info.size
            if not need_crc and tar_pos < skip:  # nothing needs these bytes: not read
                jump = min(remaining, skip - tar_pos)
                handle.seek(jump, os.SEEK_CUR)
                tar_pos, remaining = tar_pos + jump, remaining - jump
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
        if out := window(_GZIP_HEADER):
            yield out
        out_pos = len(_GZIP_HEADER) + first_block * _FRAMED_BLOCK
        for data in tar():
            take(data)
            if len(pending) >= _CHUNK:
                if out := window(whole_blocks()):
                    yield out
                if out_pos >= stop:
                    return
        # What is left: 1 to 65,535 bytes per block, the last one final.
        tail = [pending[i : i + _STORED_BLOCK] for i in range(0, len(pending), _STORED_BLOCK)]
        last = len(tail) - 1
        if out := window(b"".join(_stored_block(b, final=i == last) for i, b in enumerate(tail))):
            yield out
        if out := window(struct.pack("<II", crc, tar_size & 0xFFFFFFFF)):
            yield out
    finally:
        for _, handle in members:
            handle.close()
