"""Deleting an ended job's files and points: its run directory, moved aside at once,
removed after; its points, removed after in chunks (`JobStore.purge_points`).

A run directory can hold gigabytes of checkpoints and take seconds to remove. So a delete
renames it into `<runs>/.deleted/` (one rename, on the same file system: the job's files
are gone from the API and from TensorBoard's view at once), answers, and removes it
then. Downloads already under way read on from their open files. A service that stops
mid-removal finishes it at its next start (`sweep`, `purge`). Names starting with "." are
no job's (job ids never do), so nothing lists `.deleted` as a job.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sqlite3
from pathlib import Path

from service.store import JobStore

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


def restore(runs_dir: Path, store: JobStore) -> None:
    """Put back what a delete moved aside and never recorded (at start, before the API
    answers): a service killed between `set_aside` and the store's delete left a job that
    still exists, and `sweep` would remove its checkpoints and logs under it."""
    trash = runs_dir / TRASH
    if not trash.is_dir():
        return
    for aside in trash.iterdir():
        job_id = aside.name.rpartition("-")[0]  # `<job id>-<hex>`; ids hold no "-"
        if job_id and store.get(job_id) is not None and not (runs_dir / job_id).exists():
            log.warning(
                "Job %s was not deleted (the service stopped mid-way); its files are kept", job_id
            )
            put_back(aside, runs_dir, job_id)


def sweep(runs_dir: Path) -> None:
    """Finish removals a stopped service left (at start, after `restore`)."""
    trash = runs_dir / TRASH
    if trash.is_dir():
        for aside in trash.iterdir():
            remove(aside)


def purge(store: JobStore) -> None:
    """Remove deleted jobs' points (after a delete's answer, and at start). A store closed
    under it (the service stopping) ends it quietly: the next start finishes it."""
    try:
        removed = store.purge_points()
    except sqlite3.ProgrammingError:  # closed
        return
    except sqlite3.Error as error:  # a full disk, a locked store: tried again at next start
        log.warning("Could not remove a deleted job's metric points: %s", error)
        return
    if removed:
        log.info("Removed %d metric points of deleted jobs", removed)
