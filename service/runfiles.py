"""Reading a job's run directory safely: nothing outside it is ever opened.

Every path the service serves from a run directory goes through `inside`, which refuses
symlinks and anything that resolves outside the run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

_TAIL_BLOCK = 64 * 1024
# A tail reads back at most this much per line asked for, and _TAIL_MAX_BYTES in all (the
# most an `offset` read may ask for): a log of hundreds of MB whose last lines are
# megabytes long (a printed array, a progress bar that never ends its line) was read whole
# into memory for 200 lines. Lines past the budget are left out; one longer than it is cut
# to its last part.
_TAIL_BYTES_PER_LINE = 8 * 1024
_TAIL_MAX_BYTES = 16 * 1024 * 1024
# tail_lines cuts each line to this many characters: a failed job keeps its log tail in the
# store, and so in every answer that lists the job.
_LINE_CHARS = 2000


def inside(root: Path, path: Path) -> bool:
    """True when `path` is a regular file under `root` and no link leads elsewhere."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a text file (fewer if it is shorter; none if missing), each
    cut to its first _LINE_CHARS characters (the rest said as "[… N more characters]")."""
    return [
        line
        if len(line) <= _LINE_CHARS
        else f"{line[:_LINE_CHARS]}[… {len(line) - _LINE_CHARS} more characters]"
        for line in tail_with_end(path, count)[0]
    ]


def tail_with_end(path: Path, count: int) -> tuple[list[str], int]:
    """The last `count` lines, and the byte offset a follower reads on from (0 if missing).

    The offset is the end of the last whole line: a last line still being written is in
    the lines, and comes again, whole, from `read_lines_from` at that offset. So nothing is
    lost, and only an unfinished line is ever shown twice.

    At most _TAIL_BYTES_PER_LINE a line asked for, and _TAIL_MAX_BYTES in all, are read:
    the lines that start before that are left out, and a last line longer than that comes
    cut to its end (then, if no newline was read, the offset is where the read began).
    """
    if count <= 0:
        return [], 0
    budget = min(_TAIL_MAX_BYTES, max(_TAIL_BLOCK, count * _TAIL_BYTES_PER_LINE))
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = size = f.tell()
            # One byte more than the budget: whether a line starts right at its edge.
            floor = max(0, size - budget - 1)
            blocks: list[bytes] = []
            newlines = 0
            # Read backwards a block at a time until there are enough newlines, counting
            # each block once (recounting all read so far made a long tail quadratic).
            while end > floor and newlines <= count:
                start = max(floor, end - _TAIL_BLOCK)
                f.seek(start)
                blocks.append(f.read(end - start))
                newlines += blocks[-1].count(b"\n")
                end = start
            data = b"".join(reversed(blocks))
    except (FileNotFoundError, IsADirectoryError):
        return [], 0
    last_newline = data.rfind(b"\n")
    if last_newline < 0:  # no line ends in what was read: all of it is one unfinished line
        unfinished_at = end
    else:
        unfinished_at = size - (len(data) - (last_newline + 1))
        first_newline = data.find(b"\n")
        if end > 0 and first_newline < len(data) - 1:
            # The budget ran out: what precedes the first newline read is the end of a
            # line whose start was not read; leave it out, unless it is all there is.
            data = data[first_newline + 1 :]
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:], unfinished_at


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
