"""Reading a job's run directory safely: nothing outside it is ever opened.

Every path the service serves from a run directory goes through `inside`, which refuses
symlinks and anything that resolves outside the run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

_TAIL_BLOCK = 64 * 1024


def inside(root: Path, path: Path) -> bool:
    """True when `path` is a regular file under `root` and no link leads elsewhere."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a text file (fewer if it is shorter; none if missing)."""
    return tail_with_end(path, count)[0]


def tail_with_end(path: Path, count: int) -> tuple[list[str], int]:
    """The last `count` lines, and the byte offset a follower reads on from (0 if missing).

    The offset is the end of the last whole line: a last line still being written is in
    the lines, and comes again, whole, from `read_lines_from` at that offset. So nothing is
    lost, and only an unfinished line is ever shown twice.
    """
    if count <= 0:
        return [], 0
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = size = f.tell()
            blocks: list[bytes] = []
            newlines = 0
            # Read backwards a block at a time until there are enough newlines, counting
            # each block once (recounting all read so far made a long tail quadratic).
            while end > 0 and newlines <= count:
                start = max(0, end - _TAIL_BLOCK)
                f.seek(start)
                blocks.append(f.read(end - start))
                newlines += blocks[-1].count(b"\n")
                end = start
            data = b"".join(reversed(blocks))
    except (FileNotFoundError, IsADirectoryError):
        return [], 0
    lines = data.decode("utf-8", errors="replace").splitlines()
    unfinished = len(data) - (data.rfind(b"\n") + 1)
    return lines[-count:], size - unfinished


class OffsetPastEnd(ValueError):
    """A read asked to start after the end of the file."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__(f"offset {offset} is past the end of the log ({size} bytes)")


def read_lines_from(path: Path, offset: int, limit: int) -> tuple[str, int]:
    """Whole lines from byte `offset` on, at most `limit` bytes; and the offset after them.

    A line still being written (no newline yet) is left for the next read, unless one line
    alone is longer than `limit`: then `limit` bytes of it come back, so a reader always
    moves on. A missing file reads as empty at offset 0.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if offset > size:
                raise OffsetPastEnd(offset, size)
            f.seek(offset)
            data = f.read(limit)
    except (FileNotFoundError, IsADirectoryError):
        if offset:
            raise OffsetPastEnd(offset, 0) from None
        return "", 0
    last_newline = data.rfind(b"\n")
    if last_newline >= 0:
        data = data[: last_newline + 1]
    elif len(data) < limit:
        data = b""  # an unfinished line: wait for the rest of it
    # Cutting at a newline never splits a UTF-8 character; the limit cut of an overlong
    # line may, and "replace" shows that as one replacement character.
    return data.decode("utf-8", errors="replace"), offset + len(data)
