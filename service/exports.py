"""A job's exported model (`export/`, the SavedModel a succeeded worker writes last) as a
streamed .tar.gz (`service.archives`).

The archive holds the SavedModel's files at its top (`saved_model.pb`, `variables/`,
`assets/`, `fingerprint.pb`), so `tf.saved_model.load` takes the folder it is extracted
into, and beside them the job's spec.json and result.json (the metrics it ended with),
which loading ignores. Only plain files inside the run directory are served.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from service.archives import Archive, archive
from service.runfiles import inside
from trainer.rundir import RunDir

_MARKER = "saved_model.pb"  # written by the worker with the rest, then the folder renamed in


def export_files(run: RunDir) -> list[tuple[str, Path]] | None:
    """The export's files as (name in the archive, path), sorted; None if there is none."""
    root = run.export
    files: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root):  # no links followed: os.walk's default
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if inside(run.root, path):
                files.append((path.relative_to(root).as_posix(), path))
    return files if any(name == _MARKER for name, _ in files) else None


def open_export(run: RunDir, spec_json: bytes) -> Archive | None:
    """The export with spec.json and result.json as a .tar.gz; None if there is none."""
    files = export_files(run)
    if files is None:
        return None
    extras = [("spec.json", spec_json)]
    # The worker writes its result just after the export: in between, there is none yet.
    with contextlib.suppress(OSError):
        extras.append(("result.json", run.result.read_bytes()))
    return archive(files, extras)
