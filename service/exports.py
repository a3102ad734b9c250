"""A job's exported model (`export/`, the SavedModel a succeeded worker writes last) as a
streamed .tar.gz (`service.archives`).

The archive holds the SavedModel's files at its top (`saved_model.pb`, `fingerprint.pb`,
`variables/`, the worker's `model.json` that says what it takes and answers, and `assets/`
where it holds a file: a tar of files alone has no empty folder, which loading does not
need), so `tf.saved_model.load` takes the folder it is extracted into, and beside them the
job's spec.json and result.json (the metrics it ended with), which loading ignores. Only plain files inside the run directory are served.
"""

from __future__ import annotations

import os
from pathlib import Path

from service.archives import Archive, ArchiveHead, archive, describe
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


def _sources(
    run: RunDir, spec_json: bytes
) -> tuple[list[tuple[str, Path]], list[tuple[str, bytes]]] | None:
    files = export_files(run)
    if files is None:
        return None
    # The worker writes its result just after the export: in between, there is none yet.
    # A file, not bytes read here: HEAD then only stats it, and a link is refused.
    if inside(run.root, run.result):
        files.append(("result.json", run.result))
    return files, [("spec.json", spec_json)]


def open_export(run: RunDir, spec_json: bytes) -> Archive | None:
    """The export with result.json and spec.json as a .tar.gz; None if there is none."""
    sources = _sources(run, spec_json)
    return archive(*sources) if sources is not None else None


def describe_export(run: RunDir, spec_json: bytes) -> ArchiveHead | None:
    """`open_export`'s size and ETag from the files' stat alone (for HEAD)."""
    sources = _sources(run, spec_json)
    return describe(*sources) if sources is not None else None
