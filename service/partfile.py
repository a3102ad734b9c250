"""A download's partial file: `<target>.part`, with the ETag of the archive its bytes
belong to beside it in `<target>.part.etag`, renamed to `<target>` once complete.

A later download of the same target reads both to ask the service for only the rest
(`Range` with `If-Range: ETAG`). While a download writes the part it holds an exclusive
lock on it, so two downloads to one target cannot interleave their bytes.

Standard library only: the client never imports more than httpx.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

if sys.platform != "win32":
    import fcntl


class PartInUse(Exception):
    """Another download holds the part."""


def part_paths(target: Path) -> tuple[Path, Path]:
    """The part, and the file its ETag is kept in."""
    return target.with_name(f"{target.name}.part"), target.with_name(f"{target.name}.part.etag")


def resumable_bytes(target: Path, etag: str | None, size: int | None) -> int:
    """How many bytes of an archive of `etag` and `size` an earlier download to `target`
    left in its part (0: nothing to resume from, start over)."""
    if etag is None or size is None or (saved := saved_etag(target)) is None:
        return 0
    try:
        held = part_paths(target)[0].stat().st_size
    except OSError:
        return 0
    return held if saved == etag and held <= size else 0


def saved_etag(target: Path) -> str | None:
    """The ETag of the archive the part of a download to `target` holds bytes of; None
    when no readable tag is beside it (its version cannot be told)."""
    try:
        return part_paths(target)[1].read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


class PartFile:
    """The part of a download to `target`, opened for appending and locked."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path, self.tag_path = part_paths(target)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        # "a": made if missing, never truncated on opening; every write goes to the end.
        self.file = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        if sys.platform != "win32":
            try:
                fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.file.close()
                raise PartInUse(
                    f"{self.path} is being written by another download; wait for it to end"
                ) from None
        self.finished = False

    def held(self) -> int:
        """Bytes in the part."""
        self.file.flush()
        return self.on_disk()

    def on_disk(self) -> int:
        """Bytes in the part's file, without those still in its buffer (which a full disk
        keeps from it)."""
        return os.fstat(self.file.fileno()).st_size

    def restart(self, etag: str | None) -> None:
        """Empty the part for an archive of `etag` (None: one that cannot be resumed)."""
        self.file.truncate(0)
        if etag is None:
            self.tag_path.unlink(missing_ok=True)
            return
        try:
            # Written before any byte: a part never holds bytes of another ETag than its own.
            self.tag_path.write_text(etag + "\n", encoding="utf-8")
        except OSError as error:  # a write's error names no file: this one is the tag's
            raise OSError(error.errno, error.strerror, str(self.tag_path)) from error

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def finish(self) -> Path:
        """The part, complete, renamed to the target."""
        self.file.flush()
        os.replace(self.path, self.target)
        self.tag_path.unlink(missing_ok=True)
        self.finished = True
        return self.target

    def close(self) -> None:
        """Let go of the part; an empty one is removed, with its tag (there is nothing to
        resume)."""
        with contextlib.suppress(OSError):  # the disk that failed the last write fails it again
            self.file.flush()
        try:
            empty = not self.finished and self.on_disk() == 0
        except OSError:
            empty = False
        with contextlib.suppress(OSError):
            self.file.close()
        if empty:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.tag_path.unlink(missing_ok=True)
