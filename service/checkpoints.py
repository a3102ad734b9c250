"""A job's retained checkpoints, and one of them as a streamed .tar.gz (`service.archives`).

The worker's `checkpoints/` is a `tf.train.CheckpointManager` directory: `ckpt-<step>.index`
plus `ckpt-<step>.data-<i>-of-<n>` per checkpoint, and a `checkpoint` state file. Only
complete checkpoints (every data shard, and an index written whole) of plain files inside
the run directory are listed or served. The archive holds the checkpoint's files, a
`checkpoint` state file naming it (so `tf.train.latest_checkpoint` finds it after
extraction), the job's spec.json and, once a worker of the job has loaded its data,
data.json: the image shape and class count its model was built for, which the spec does
not say for data files and which building the model again to restore into needs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from service.archives import Archive, ArchiveHead, archive, describe
from service.runfiles import inside
from trainer.rundir import INDEX_END, RunDir

_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-(\d+)-of-(\d+))$")
# A whole index's last bytes (`trainer.rundir.INDEX_END`): a read while TensorFlow wrote an
# index saw 0 bytes of it, or a part, beside whole data, and listed (and served, as
# `latest`) a checkpoint that does not restore.


@dataclass(frozen=True)
class Checkpoint:
    step: int
    time: float  # when its index was written
    size_bytes: int
    files: tuple[Path, ...]  # the .index first, then the data shards


# A directory read is no snapshot: a file created, renamed in or deleted while it runs may
# be missed. With `keep: 1` the worker writes ckpt-N and then deletes the one before, so
# one read across both can see neither whole: 2 reads in 40,000 while TensorFlow saved
# back to back, here. A read that saw checkpoint files but no whole checkpoint is read again.
_READS = 3


def list_checkpoints(run: RunDir) -> list[Checkpoint]:
    """Complete checkpoints in the run's checkpoints/, by step."""
    checkpoints, seen = _read(run)
    for _ in range(_READS - 1):
        if checkpoints or not seen:
            break
        checkpoints, seen = _read(run)
    return checkpoints


def _read(run: RunDir) -> tuple[list[Checkpoint], bool]:
    """One read of the complete checkpoints, and whether it saw any checkpoint's file."""
    shards: dict[int, dict[str, Path]] = {}
    expected: dict[int, int] = {}
    try:
        entries = list(os.scandir(run.checkpoints))
    except (FileNotFoundError, NotADirectoryError):
        return [], False
    # By name, before `inside` looks at the files: a read that saw only ckpt-N, which the
    # save of ckpt-N+1 deleted before that look, counted as one that saw no checkpoint,
    # was not read again, and `latest` answered 404 (7 reads in 387,000, keep 1).
    seen = False
    for entry in entries:
        match = _FILE.match(entry.name)
        seen = seen or match is not None
        if match is None or not inside(run.root, Path(entry.path)):
            continue
        step = int(match.group(1))
        shards.setdefault(step, {})[match.group(2)] = Path(entry.path)
        if match.group(4) is not None:
            expected[step] = int(match.group(4))
    checkpoints = []
    for step, files in sorted(shards.items()):
        index = files.pop("index", None)
        # Incomplete while the worker writes it, or while CheckpointManager deletes it.
        if index is None or step not in expected or len(files) != expected[step]:
            continue
        paths = (index, *sorted(files.values()))
        try:
            index_stat = _whole_index(index)
            data_stats = [path.stat() for path in paths[1:]]
        except FileNotFoundError:  # deleted by CheckpointManager since the directory read
            continue
        except OSError:
            # Unreadable to the service (its mode changed by hand): it could not be served,
            # and a job's status, which lists its checkpoints, must not fail for it.
            continue
        if index_stat is None:  # its index still being written (or cut short by a kill)
            continue
        size = index_stat.st_size + sum(s.st_size for s in data_stats)
        checkpoints.append(Checkpoint(step, index_stat.st_mtime, size, paths))
    return checkpoints, seen


def _whole_index(path: Path) -> os.stat_result | None:
    """The index's stat when the file is whole (it ends with INDEX_END), else None. One
    open for both, so the size is the one checked; a whole index is never written again
    (the trainer saves a step once)."""
    with open(path, "rb") as f:
        stat = os.fstat(f.fileno())
        end = os.pread(f.fileno(), len(INDEX_END), max(0, stat.st_size - len(INDEX_END)))
    return stat if end == INDEX_END else None


def _state_file(step: int) -> bytes:
    return (
        f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'
    ).encode()


def _sources(
    checkpoint: Checkpoint, spec_json: bytes, data_json: bytes | None
) -> tuple[list[tuple[str, Path]], list[tuple[str, bytes]]]:
    extras = [("checkpoint", _state_file(checkpoint.step)), ("spec.json", spec_json)]
    if data_json is not None:
        extras.append(("data.json", data_json))
    return [(path.name, path) for path in checkpoint.files], extras


def open_archive(
    checkpoint: Checkpoint, spec_json: bytes, data_json: bytes | None = None
) -> Archive | None:
    """A .tar.gz of `checkpoint`'s files, a `checkpoint` state file naming it, the
    job's spec.json and its data.json (where given); None when the worker deleted it
    meanwhile."""
    return archive(*_sources(checkpoint, spec_json, data_json))


def describe_archive(
    checkpoint: Checkpoint, spec_json: bytes, data_json: bytes | None = None
) -> ArchiveHead | None:
    """`open_archive`'s size and ETag from the files' stat alone (for HEAD)."""
    return describe(*_sources(checkpoint, spec_json, data_json))
