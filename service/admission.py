"""What only the service can check about a submitted job, beyond `trainer.spec`.

The spec model checks a job on its own; these checks need to know this host: towers
against the devices the service can give, and a data path against the allowed data roots
and the files actually there. A job the service accepts must not fail in the worker for
a reason that could have been checked here.

A relative data path is taken relative to the data roots (the first root where it exists),
and the job is stored with the absolute path, since the worker runs in its run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.devices import DevicePool
from trainer.datafiles import DataFilesError, check_under_roots, resolve_files
from trainer.spec import JobSpec


def admit(
    spec: JobSpec, *, pool: DevicePool, data_roots: list[Path]
) -> tuple[JobSpec, list[dict[str, str]]]:
    """The spec as it will be stored, and every reason this service cannot run it as
    `{"field", "message"}` (none when it can)."""
    errors = []
    if spec.towers > pool.max_towers:
        errors.append(
            {
                "field": "towers",
                "message": f"Expected at most {pool.max_towers} towers, the devices this "
                f"service can give ({pool.describe()}). Received: {spec.towers}",
            }
        )
    if spec.data.path is not None:
        path = _absolute(spec.data.path, data_roots)
        spec = spec.model_copy(update={"data": spec.data.model_copy(update={"path": path})})
        try:
            check_under_roots(path, data_roots)
            resolve_files(spec.data)
        except DataFilesError as error:
            errors.append({"field": "data.path", "message": str(error)})
        except (ValueError, OSError) as error:
            # A NUL byte in the path (ValueError), or a folder this service may not read,
            # a name too long, a symlink loop (OSError): the job's fault, not the service's.
            errors.append({"field": "data.path", "message": _unreadable(path, error)})
    return spec, errors


def _unreadable(path: str, error: ValueError | OSError) -> str:
    if isinstance(error, OSError) and error.strerror:
        cause = error.strerror
        if error.filename is not None and os.fsdecode(error.filename) != path:
            cause += f" (at {os.fsdecode(error.filename)})"
    else:
        cause = str(error)
    return (
        "Expected `path` to name a file, folder or glob this service can read. "
        f"Received: {path!r}, which cannot be read: {cause}"
    )


def _absolute(path: str, data_roots: list[Path]) -> str:
    if Path(path).is_absolute() or not data_roots:
        return path
    candidates = [root / path for root in data_roots]
    # os.path.exists is False for a path it cannot even stat (a NUL byte, a name too
    # long): the checks that follow say why.
    return str(next((c for c in candidates if os.path.exists(c)), candidates[0]))
