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
    if count <= 0:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            data = b""
            # Read backwards a block at a time until there are enough newlines.
            while end > 0 and data.count(b"\n") <= count:
                start = max(0, end - _TAIL_BLOCK)
                f.seek(start)
                data = f.read(end - start) + data
                end = start
    except (FileNotFoundError, IsADirectoryError):
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:]
