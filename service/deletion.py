"""Deleting an ended job's files: its run directory, moved aside at once, removed after.

A run directory can hold gigabytes of checkpoints and take seconds to remove. So a delete
renames it into `<runs>/.deleted/` (one rename, on the same file system: the job's files
are gone from the API and from TensorBoard's view at once), answers, and removes it
then. Downloads already under way read on from their open files. A service that stops
mid-removal finishes it at its next start (`sweep`). Names starting with "." are no job's
(job ids never do), so nothing lists `.deleted` as a job.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

TRASH = ".deleted"


def set_aside(runs_dir: Path, job_id: str) -> Path | None:
    """Move the job's run directory into the trash; its new path, or None when it has
    none (a job that never started). Raises OSError when it cannot be moved."""
    trash = runs_dir / TRASH
    trash.mkdir(parents=True, exist_ok=True)
    aside = trash / f"{job_id}-{secrets.token_hex(4)}"
    try:
        os.rename(runs_dir / job_id, aside)
    except FileNotFoundError:
        return None
    return aside


def put_back(aside: Path, runs_dir: Path, job_id: str) -> None:
    """Undo `set_aside`: the delete could not be recorded, so the job keeps its files."""
    os.rename(aside, runs_dir / job_id)


def remove(aside: Path) -> None:
    """Remove what `set_aside` moved; a failure is logged, and `sweep` tries again."""

    def failed(function: object, path: str, exc_info: tuple[type, BaseException, object]) -> None:
        log.warning("Could not remove %s of a deleted job: %s", path, exc_info[1])

    # `onerror`, not 3.12's `onexc`: the service runs on Python 3.11 too.
    shutil.rmtree(aside, onerror=failed)


def sweep(runs_dir: Path) -> None:
    """Finish removals a stopped service left (at start)."""
    trash = runs_dir / TRASH
    if trash.is_dir():
        for aside in trash.iterdir():
            remove(aside)
